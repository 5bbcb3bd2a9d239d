// Checkpoints: one binary file with a checksum, written to a temporary name and renamed, so a crash mid-write
// never leaves a damaged checkpoint in place of the last good one. Format: docs/checkpoint.md.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

// XXH3-64 from Debian's libxxhash-dev, header-only (inlined): no library to link or ship with kiln_train.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kiln/checkpoint.hpp"
#include "kiln/error.hpp"
#include "kiln/files.hpp"

namespace kiln {

namespace {

// Version 1: FNV-1a 64 checksum (byte by byte, about 1 GB/s); read only. Version 2: XXH3-64 (seed 0), written.
constexpr char kMagicV1[8] = {'K', 'I', 'L', 'N', 'C', 'K', 'P', '1'};
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'K', 'P', '2'};

uint64_t fnv(const char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 1099511628211ull;
  return h;
}

// Reads the fields before the trailing checksum (`end`). Every length and count comes from the file, so each is
// checked against the bytes that are left before anything is allocated or copied.
struct Reader {
  const std::string& buf;
  const std::string& path;
  size_t pos = 0;
  size_t end = 0;
  void need(uint64_t n) {
    if (n > end - pos)  // not pos + n > end: a length near 2^64 from a damaged file would wrap around
      throw DataError(path + ": checkpoint truncated at byte " + std::to_string(pos) + " (needed " + std::to_string(n) +
                      " more)");
  }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, buf.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
};

}  // namespace

namespace {

// Test-only: KILN_TEST_CHECKPOINT_WRITE_PAUSE_MS=N makes the writer use 64 KiB chunks and sleep N ms after each, so
// a test can kill the process while it is inside a checkpoint write (tests/integration/test_checkpoint_safety.cpp).
int write_pause_ms() {
  const char* v = std::getenv("KILN_TEST_CHECKPOINT_WRITE_PAUSE_MS");
  return v ? std::max(0, std::atoi(v)) : 0;
}

// Streams the checkpoint to a file descriptor through a 1 MiB buffer, hashing as it goes (XXH3-64 over every byte
// before the trailing checksum), so no copy of the whole file is built in memory.
class FileWriter {
 public:
  FileWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)), pause_ms_(write_pause_ms()) {
    if (pause_ms_ > 0) chunk_ = 64 << 10;
    buf_.reserve(chunk_);
    if (!state_ || XXH3_64bits_reset(state_.get()) != XXH_OK) throw Error(path_ + ": cannot start the checksum");
  }
  template <class T>
  void put(const T& v) {
    bytes(&v, sizeof(T));
  }
  void bytes(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    if (n == 0) return;
    XXH3_64bits_update(state_.get(), c, n);
    if (buf_.size() + n <= chunk_) {
      buf_.append(c, n);
      return;
    }
    flush();
    while (n >= chunk_) {  // large tensors go straight from their memory to the file
      out(c, chunk_);
      c += chunk_;
      n -= chunk_;
    }
    buf_.append(c, n);
  }
  // The checksum of everything written so far, written last (not hashed).
  void finish() {
    const uint64_t h = XXH3_64bits_digest(state_.get());
    buf_.append(reinterpret_cast<const char*>(&h), sizeof h);
    flush();
  }

 private:
  struct FreeState {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  void flush() {
    out(buf_.data(), buf_.size());
    buf_.clear();
  }
  void out(const char* p, size_t n) {
    while (n > 0) {
      ssize_t k = ::write(fd_, p, n);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) throw Error(path_ + ": write failed: " + std::strerror(errno) + " (disk full?)");
      p += k;
      n -= static_cast<size_t>(k);
    }
    if (pause_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms_));
  }
  int fd_;
  std::string path_;
  int pause_ms_;
  size_t chunk_ = 1 << 20;
  std::string buf_;
  std::unique_ptr<XXH3_state_t, FreeState> state_{XXH3_createState()};
};

namespace fs = std::filesystem;

// <dir>/<stem>-step<N>.kiln: a kept earlier checkpoint of `path` (<dir>/<stem>.kiln).
std::string kept_name(const std::string& path, int64_t step) {
  fs::path p(path);
  return (p.parent_path() / (p.stem().string() + "-step" + std::to_string(step) + ".kiln")).string();
}

// The kept earlier checkpoints of `path` with their steps, newest first.
std::vector<std::pair<int64_t, std::string>> kept_checkpoints(const std::string& path) {
  fs::path p(path);
  const std::string prefix = p.stem().string() + "-step";
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() <= prefix.size() + 5 || n.rfind(prefix, 0) != 0 || n.substr(n.size() - 5) != ".kiln") continue;
    const std::string digits = n.substr(prefix.size(), n.size() - prefix.size() - 5);
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    out.emplace_back(std::stoll(digits), (p.parent_path() / n).string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// The step in the header of the checkpoint at `path`, or -1 when it has none (missing, too short, not a checkpoint).
int64_t header_step(const std::string& path) {
  if (!regular_file_problem(path).empty()) return -1;  // a FIFO would block the read below
  char h[24];
  std::ifstream f(path, std::ios::binary);
  if (!f.read(h, sizeof h)) return -1;
  if (std::memcmp(h, kMagic, 8) != 0 && std::memcmp(h, kMagicV1, 8) != 0) return -1;
  int64_t step;
  std::memcpy(&step, h + 16, 8);
  return step >= 0 ? step : -1;
}

// Before a new checkpoint takes `path`'s name: the current one gets a second name, <stem>-step<N>.kiln (a hard link,
// so `path` never goes missing; a copy where the filesystem has no links).
void keep_previous(const std::string& path) {
  const int64_t step = header_step(path);
  if (step < 0) return;  // nothing there, or not a checkpoint worth keeping
  const std::string kept = kept_name(path, step);
  std::error_code ec;
  fs::remove(kept, ec);  // an earlier checkpoint at the same step (a resumed run writes that step again)
  if (::link(path.c_str(), kept.c_str()) != 0) {
    fs::copy_file(path, kept, fs::copy_options::overwrite_existing, ec);
    if (ec) throw Error(kept + ": cannot keep the previous checkpoint: " + ec.message());
  }
}

void sync_dir(const fs::path& dir) {
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& c, int64_t keep) {
  auto dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(path + ": cannot create the checkpoint's directory '" + dir.string() + "': " + ec.message());
  // A temporary name of this process's own: two writers never share one (the run lock keeps them apart anyway).
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  // Created exclusively and never through a link planted under the temporary's name (one left by a killed writer of
  // the same pid is removed first).
  int fd = open_no_follow(tmp, O_WRONLY | O_CREAT | O_EXCL);
  if (fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0) fd = open_no_follow(tmp, O_WRONLY | O_CREAT | O_EXCL);
  if (fd < 0) throw Error(tmp + ": cannot write checkpoint: " + std::strerror(errno));
  try {
    FileWriter w(fd, tmp);
    w.bytes(kMagic, sizeof kMagic);
    w.put<int64_t>(c.epoch);
    w.put<int64_t>(c.step);
    w.put<uint64_t>(c.data_state.size());
    w.bytes(c.data_state.data(), c.data_state.size());
    w.put<uint64_t>(c.tensors.size());
    for (const auto& [name, t] : c.tensors) {
      w.put<uint32_t>(static_cast<uint32_t>(name.size()));
      w.bytes(name.data(), name.size());
      w.put<uint32_t>(static_cast<uint32_t>(t.shape.rank()));
      for (auto d : t.shape.dims()) w.put<int64_t>(d);
      w.bytes(t.data.data(), t.bytes());
    }
    w.finish();
    // On disk before it takes the checkpoint's name: a crash after the rename never finds a file the kernel had not
    // written yet.
    if (::fsync(fd) != 0) throw Error(tmp + ": fsync failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (keep > 1) {
    try {
      keep_previous(path);
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    throw Error(path + ": cannot put the checkpoint in place (renaming " + tmp + "): " + why);
  }
  // The rename itself is durable once the directory is synced.
  sync_dir(dir);
  if (keep > 0) {  // of the kept earlier ones, the newest keep - 1 stay
    const auto kept = kept_checkpoints(path);
    for (size_t i = static_cast<size_t>(keep - 1); i < kept.size(); ++i) std::filesystem::remove(kept[i].second, ec);
  }
}

Checkpoint load_checkpoint(const std::string& path) {
  require_regular_file(path, "a Kiln checkpoint file");
  std::string buf;
  {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) throw DataError(path + ": cannot open checkpoint");
    const auto size = f.tellg();
    if (size < 0) throw DataError(path + ": cannot read checkpoint");
    buf.resize(static_cast<size_t>(size));  // one read of the whole file, not a character at a time
    f.seekg(0);
    if (!f.read(buf.data(), static_cast<std::streamsize>(buf.size())))
      throw DataError(path + ": cannot read checkpoint (" + std::to_string(buf.size()) + " bytes expected)");
  }
  const bool v2 = buf.size() >= sizeof kMagic + 8 && std::memcmp(buf.data(), kMagic, sizeof kMagic) == 0;
  if (!v2 && (buf.size() < sizeof kMagic + 8 || std::memcmp(buf.data(), kMagicV1, sizeof kMagic) != 0))
    throw DataError(path + ": not a Kiln checkpoint (bad magic at offset 0: expected KILNCKP2 or KILNCKP1)");
  uint64_t stored;
  std::memcpy(&stored, buf.data() + buf.size() - 8, 8);
  const uint64_t actual = v2 ? XXH3_64bits(buf.data(), buf.size() - 8) : fnv(buf.data(), buf.size() - 8);
  if (stored != actual)
    throw DataError(path + ": checkpoint checksum mismatch (file damaged or truncated: " + std::to_string(buf.size()) +
                    " bytes)");
  Reader r{buf, path, sizeof kMagic, buf.size() - 8};
  Checkpoint c;
  c.epoch = r.get<int64_t>();
  c.step = r.get<int64_t>();
  auto ds = r.get<uint64_t>();
  r.need(ds);
  c.data_state.assign(buf.begin() + static_cast<std::ptrdiff_t>(r.pos),
                      buf.begin() + static_cast<std::ptrdiff_t>(r.pos + ds));
  r.pos += ds;
  auto n = r.get<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) {
    auto len = r.get<uint32_t>();
    r.need(len);
    std::string name(buf.data() + r.pos, len);
    r.pos += len;
    const size_t at = r.pos;
    auto rank = r.get<uint32_t>();
    r.need(uint64_t{rank} * sizeof(int64_t));
    std::vector<int64_t> dims;
    for (uint32_t k = 0; k < rank; ++k) dims.push_back(r.get<int64_t>());
    const Shape shape(dims);
    // The shape is checked before its tensor is allocated: a damaged file must not ask for terabytes.
    if (!shape.fits() || static_cast<uint64_t>(shape.numel()) > (r.end - r.pos) / sizeof(float))
      throw DataError(path + ": checkpoint tensor '" + name + "' at byte " + std::to_string(at) + " has shape " +
                      shape.str() + ", which " +
                      (shape.fits() ? "needs more bytes than the file holds" : "is not a valid shape") +
                      " (file damaged)");
    HostTensor t{shape};
    r.need(t.bytes());
    if (t.bytes() > 0) std::memcpy(t.data.data(), buf.data() + r.pos, t.bytes());  // an empty tensor's data() is null
    r.pos += t.bytes();
    if (!c.tensors.emplace(name, std::move(t)).second)
      throw DataError(path + ": checkpoint holds tensor '" + name + "' twice (file damaged)");
  }
  if (r.pos != r.end)
    throw DataError(path + ": checkpoint has " + std::to_string(r.end - r.pos) +
                    " unexpected bytes after its last tensor, at byte " + std::to_string(r.pos) + " (file damaged)");
  return c;
}

std::vector<std::string> checkpoint_files(const std::string& path) {
  std::vector<std::string> out;
  std::error_code ec;
  if (fs::exists(path, ec)) out.push_back(path);
  for (auto& [step, p] : kept_checkpoints(path)) out.push_back(p);
  return out;
}

LoadedCheckpoint load_newest_checkpoint(const std::string& path) {
  const auto files = checkpoint_files(path);
  // Something that is not a file under a checkpoint's name is not a damaged checkpoint to move aside: it is refused.
  for (const auto& f : files)
    if (std::string why = regular_file_problem(f); !why.empty())
      throw DataError(f + ": " + why + "; a checkpoint is a regular file. Move it out of the run directory");
  std::vector<std::pair<std::string, std::string>> damaged;  // file, why
  for (const auto& f : files) {
    try {
      LoadedCheckpoint l{load_checkpoint(f), f, {}};
      // Damaged newer files are moved aside (<name>.damaged), so they are neither kept nor resumed later.
      for (const auto& [d, why] : damaged) {
        std::error_code ec;
        fs::rename(d, d + ".damaged", ec);
        l.warning += "warning: " + d + " is damaged (" + why + "); " + (ec ? "" : "moved to " + d + ".damaged; ") +
                     (d == damaged.back().first ? "" : "\n");
      }
      if (!damaged.empty()) {
        l.warning +=
            "resuming from the checkpoint before it, " + f + " (step " + std::to_string(l.checkpoint.step) + ")";
        sync_dir(fs::path(path).parent_path());
      }
      return l;
    } catch (const DataError& e) {
      damaged.emplace_back(f, e.what());
    }
  }
  if (files.empty()) throw DataError(path + ": no checkpoint to resume");
  std::string list;
  for (const auto& [d, why] : damaged) list += "\n  " + why;
  throw DataError(path +
                  ": no checkpoint of this run can be loaded ([train] keep_checkpoints keeps earlier ones):" + list);
}

void remove_checkpoints(const std::string& path) {
  std::error_code ec;
  for (const auto& f : checkpoint_files(path)) fs::remove(f, ec);
}

}  // namespace kiln
