// Checkpoints: one binary file with a checksum, written to a temporary name and renamed, so a crash mid-write
// never leaves a damaged checkpoint in place of the last good one.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/error.hpp"
#include "kiln/trainer.hpp"

namespace kiln {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'K', 'P', '1'};

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
      throw DataError(path + ": checkpoint truncated at byte " + std::to_string(pos) + " (needed " + std::to_string(n) + " more)");
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

// Streams the checkpoint to a file descriptor through a 1 MiB buffer, hashing as it goes (FNV-1a over every byte
// before the trailing checksum), so no copy of the whole file is built in memory.
class FileWriter {
 public:
  FileWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) { buf_.reserve(kChunk); }
  template <class T>
  void put(const T& v) {
    bytes(&v, sizeof(T));
  }
  void bytes(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    hash(c, n);
    if (buf_.size() + n <= kChunk) {
      buf_.append(c, n);
      return;
    }
    flush();
    if (n >= kChunk) {
      out(c, n);
      return;
    }
    buf_.append(c, n);
  }
  // The checksum of everything written so far, written last (not hashed).
  void finish() {
    const uint64_t h = h_;
    buf_.append(reinterpret_cast<const char*>(&h), sizeof h);
    flush();
  }

 private:
  static constexpr size_t kChunk = 1 << 20;
  void hash(const char* p, size_t n) {
    uint64_t h = h_;
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 1099511628211ull;
    h_ = h;
  }
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
  }
  int fd_;
  std::string path_;
  std::string buf_;
  uint64_t h_ = 1469598103934665603ull;
};

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& c) {
  auto dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(path + ": cannot create the checkpoint's directory '" + dir.string() + "': " + ec.message());
  // A temporary name of this process's own: two writers never share one (the run lock keeps them apart anyway).
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    throw Error(path + ": cannot put the checkpoint in place (renaming " + tmp + "): " + why);
  }
  // The rename itself is durable once the directory is synced.
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

Checkpoint load_checkpoint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw DataError(path + ": cannot open checkpoint");
  std::string buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (buf.size() < sizeof kMagic + 8 || std::memcmp(buf.data(), kMagic, sizeof kMagic) != 0)
    throw DataError(path + ": not a Kiln checkpoint (bad magic at offset 0)");
  uint64_t stored;
  std::memcpy(&stored, buf.data() + buf.size() - 8, 8);
  if (stored != fnv(buf.data(), buf.size() - 8)) throw DataError(path + ": checkpoint checksum mismatch (file damaged)");
  Reader r{buf, path, sizeof kMagic, buf.size() - 8};
  Checkpoint c;
  c.epoch = r.get<int64_t>();
  c.step = r.get<int64_t>();
  auto ds = r.get<uint64_t>();
  r.need(ds);
  c.data_state.assign(buf.begin() + static_cast<std::ptrdiff_t>(r.pos), buf.begin() + static_cast<std::ptrdiff_t>(r.pos + ds));
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
                      shape.str() + ", which " + (shape.fits() ? "needs more bytes than the file holds" : "is not a valid shape") +
                      " (file damaged)");
    HostTensor t{shape};
    r.need(t.bytes());
    if (t.bytes() > 0) std::memcpy(t.data.data(), buf.data() + r.pos, t.bytes());  // an empty tensor's data() is null
    r.pos += t.bytes();
    if (!c.tensors.emplace(name, std::move(t)).second)
      throw DataError(path + ": checkpoint holds tensor '" + name + "' twice (file damaged)");
  }
  if (r.pos != r.end)
    throw DataError(path + ": checkpoint has " + std::to_string(r.end - r.pos) + " unexpected bytes after its last tensor, at byte " +
                    std::to_string(r.pos) + " (file damaged)");
  return c;
}

}  // namespace kiln
