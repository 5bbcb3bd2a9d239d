#include "cache_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "kiln/error.hpp"

namespace kiln::data {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'A', 'C', '1'};
constexpr uint32_t kVersion = 1;

template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof v);
  std::memcpy(b.data() + at, &v, sizeof v);
}

void put_shape(std::vector<uint8_t>& b, const Shape& s) {
  put<uint32_t>(b, static_cast<uint32_t>(s.rank()));
  for (auto d : s.dims()) put<int64_t>(b, d);
}

std::vector<uint8_t> header(const Shape& x, const Shape& y, uint64_t elements, uint64_t examples, uint64_t payload,
                            uint32_t crc) {
  std::vector<uint8_t> b(8);
  std::memcpy(b.data(), kMagic, 8);
  put<uint32_t>(b, kVersion);
  put<uint32_t>(b, 0);  // header length, patched below
  put<uint64_t>(b, elements);
  put<uint64_t>(b, examples);
  put<uint64_t>(b, payload);
  put<uint32_t>(b, crc);
  put_shape(b, x);
  put_shape(b, y);
  const auto len = static_cast<uint32_t>(b.size() + 4);
  std::memcpy(b.data() + 12, &len, 4);
  put<uint32_t>(b, static_cast<uint32_t>(crc32_z(0, b.data(), b.size())));
  return b;
}

// Values per record for an element of `batch` examples with per-example shapes x, y.
uint64_t record_floats(int64_t batch, const Shape& x, const Shape& y) {
  const auto n = static_cast<uint64_t>(batch > 0 ? batch : 1);
  return n * static_cast<uint64_t>(x.numel() + y.numel());
}

}  // namespace

std::string cache_target_problem(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return "";
    return std::string("cannot be inspected: ") + std::strerror(errno);
  }
  const bool link = S_ISLNK(st.st_mode);
  if (link && ::stat(path.c_str(), &st) != 0)
    return std::string("is a symbolic link whose target cannot be inspected: ") + std::strerror(errno);
  const std::string what = link ? "is a symbolic link to " : "is ";
  if (S_ISDIR(st.st_mode)) return what + "a directory";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return what + "a device node";
  if (S_ISFIFO(st.st_mode)) return what + "a FIFO";
  if (S_ISSOCK(st.st_mode)) return what + "a socket";
  if (!S_ISREG(st.st_mode)) return what + "not a regular file";
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return std::string("exists but cannot be read: ") + std::strerror(errno);
  char head[8] = {};
  const size_t n = std::fread(head, 1, sizeof head, f);
  std::fclose(f);
  // Any version of the format counts as Kiln's: an old-format cache is stale and may be rebuilt.
  if (n < 7 || std::memcmp(head, kMagic, 7) != 0)
    return "exists and is not a Kiln cache file (it does not start with \"KILNCAC\"; " + std::to_string(st.st_size) +
           " bytes)";
  return "";
}

CacheWriter::CacheWriter(std::string path, Shape x, Shape y)
    : path_(std::move(path)), x_(std::move(x)), y_(std::move(y)) {
  std::error_code ec;
  auto parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  // A name no other writer (this process or another) uses; O_EXCL never opens an existing file.
  static std::atomic<uint64_t> counter{0};
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
    tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0 || !(f_ = ::fdopen(fd, "wb"))) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw DataError("cache: cannot create the temporary file " + tmp_ + ": " + std::strerror(err));
  }
  std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
  auto h = header(x_, y_, 0, 0, 0, 0);  // placeholder with the final length
  write(h.data(), h.size());
  payload_ = 0;
}

CacheWriter::~CacheWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}

void CacheWriter::write(const void* p, size_t n) {
  if (std::fwrite(p, 1, n, f_) != n)
    throw DataError("cache: writing " + tmp_ + " failed at byte " + std::to_string(payload_) + ": " +
                    std::strerror(errno) + " (disk full?)");
}

void CacheWriter::append(const Element& e) {
  const Shape xs = e.batch > 0 ? x_.with_batch(e.batch) : x_, ys = e.batch > 0 ? y_.with_batch(e.batch) : y_;
  if (!(e.x.shape == xs) || !(e.y.shape == ys))
    throw DataError("cache " + path_ + ": element " + std::to_string(elements_) + " has shapes x " + e.x.shape.str() +
                    ", y " + e.y.shape.str() + ", expected x " + xs.str() + ", y " + ys.str());
  int64_t batch = e.batch;
  write(&batch, sizeof batch);
  write(e.x.data.data(), e.x.bytes());
  write(e.y.data.data(), e.y.bytes());
  crc_ = static_cast<uint32_t>(crc32_z(crc_, reinterpret_cast<const Bytef*>(&batch), sizeof batch));
  crc_ = static_cast<uint32_t>(crc32_z(crc_, reinterpret_cast<const Bytef*>(e.x.data.data()), e.x.bytes()));
  crc_ = static_cast<uint32_t>(crc32_z(crc_, reinterpret_cast<const Bytef*>(e.y.data.data()), e.y.bytes()));
  payload_ += sizeof batch + e.x.bytes() + e.y.bytes();
  ++elements_;
  examples_ += static_cast<uint64_t>(e.batch > 0 ? e.batch : 1);
}

void CacheWriter::commit() {
  auto h = header(x_, y_, elements_, examples_, payload_, crc_);
  bool ok = std::fflush(f_) == 0 && std::fseek(f_, 0, SEEK_SET) == 0 &&
            std::fwrite(h.data(), 1, h.size(), f_) == h.size() && std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
  int err = errno;
  ok = std::fclose(f_) == 0 && ok;
  f_ = nullptr;
  // Checked again just before the rename: something may have appeared at <path> while the cache was filled.
  if (ok) {
    if (std::string problem = cache_target_problem(path_); !problem.empty()) {
      std::remove(tmp_.c_str());
      throw DataError("cache: " + path_ + " " + problem + "; it was left untouched and the cache was not written. " +
                      "Delete it if it is no longer needed, or choose another cache `path`");
    }
  }
  if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    if (ok) err = errno;
    std::remove(tmp_.c_str());
    throw DataError("cache: cannot complete " + path_ + " (from " + tmp_ + "): " + std::strerror(err));
  }
}

CacheReader::CacheReader(const std::string& path, Shape x, Shape y)
    : in_(path, "cache"), x_(std::move(x)), y_(std::move(y)) {}

std::unique_ptr<CacheReader> CacheReader::open(const std::string& path, const Shape& x, const Shape& y,
                                               std::string& why) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    why = "no such file";
    return nullptr;
  }
  if (!std::filesystem::is_regular_file(path, ec)) {  // never open a FIFO or device: reading it may block
    why = "not a regular file";
    return nullptr;
  }
  try {
    std::unique_ptr<CacheReader> r(new CacheReader(path, x, y));
    auto want = header(x, y, 0, 0, 0, 0);
    std::vector<uint8_t> h(want.size());
    if (r->in_.read_some(h.data(), h.size()) != h.size()) {
      why = "shorter than its header";
      return nullptr;
    }
    if (std::memcmp(h.data(), kMagic, 8) != 0) {
      why = "not a Kiln cache file (bad magic)";
      return nullptr;
    }
    uint32_t version, crc, hcrc;
    uint64_t elements, examples, payload;
    std::memcpy(&version, h.data() + 8, 4);
    if (version != kVersion) {
      why = "cache format version " + std::to_string(version) + ", this build reads " + std::to_string(kVersion);
      return nullptr;
    }
    uint32_t hlen;
    std::memcpy(&hlen, h.data() + 12, 4);
    const size_t shapes_at = 44, shapes_end = want.size() - 4;
    if (hlen != want.size() ||
        std::memcmp(h.data() + shapes_at, want.data() + shapes_at, shapes_end - shapes_at) != 0) {
      why = "written for other element shapes (expected x " + x.str() + ", y " + y.str() + ")";
      return nullptr;
    }
    std::memcpy(&elements, h.data() + 16, 8);
    std::memcpy(&examples, h.data() + 24, 8);
    std::memcpy(&payload, h.data() + 32, 8);
    std::memcpy(&crc, h.data() + 40, 4);
    std::memcpy(&hcrc, h.data() + h.size() - 4, 4);
    if (hcrc != static_cast<uint32_t>(crc32_z(0, h.data(), h.size() - 4))) {
      why = "header checksum mismatch (corrupt header)";
      return nullptr;
    }
    if (r->in_.file_bytes() != h.size() + payload) {
      why = "length " + std::to_string(r->in_.file_bytes()) + " bytes, header says " +
            std::to_string(h.size() + payload) + " (truncated?)";
      return nullptr;
    }
    // Walk every record: checks the layout, builds the index and the checksum.
    std::vector<float> buf;
    uint32_t c = 0;
    uint64_t off = h.size(), ex = 0;
    for (uint64_t i = 0; i < elements; ++i) {
      int64_t batch = 0;
      if (r->in_.read_some(&batch, 8) != 8 || batch < 0 || batch > (1 << 24)) {
        why = "record " + std::to_string(i) + " at byte " + std::to_string(off) + " is damaged";
        return nullptr;
      }
      buf.resize(record_floats(batch, x, y));
      const size_t bytes = buf.size() * sizeof(float);
      if (r->in_.read_some(buf.data(), bytes) != bytes) {
        why = "record " + std::to_string(i) + " at byte " + std::to_string(off) + " is truncated";
        return nullptr;
      }
      c = static_cast<uint32_t>(crc32_z(c, reinterpret_cast<const Bytef*>(&batch), 8));
      c = static_cast<uint32_t>(crc32_z(c, reinterpret_cast<const Bytef*>(buf.data()), bytes));
      r->offsets_.push_back(off);
      off += 8 + bytes;
      ex += static_cast<uint64_t>(batch > 0 ? batch : 1);
    }
    if (off != h.size() + payload || ex != examples) {
      why = "records do not add up to the header's counts";
      return nullptr;
    }
    if (c != crc) {
      why = "checksum mismatch (data corrupt)";
      return nullptr;
    }
    r->examples_ = examples;
    r->seek(0);
    return r;
  } catch (const DataError& e) {
    why = e.what();
    return nullptr;
  }
}

void CacheReader::seek(uint64_t index) {
  index_ = index;
  if (index < offsets_.size()) in_.seek(offsets_[index]);
}

Element CacheReader::next() {
  if (index_ >= offsets_.size()) in_.fail("read past the last cached element " + std::to_string(offsets_.size()));
  in_.seek(offsets_[index_]);
  Element e;
  in_.read_exact(&e.batch, 8, "cached element " + std::to_string(index_));
  e.x = HostTensor(e.batch > 0 ? x_.with_batch(e.batch) : x_);
  e.y = HostTensor(e.batch > 0 ? y_.with_batch(e.batch) : y_);
  in_.read_exact(e.x.data.data(), e.x.bytes(), "cached element " + std::to_string(index_));
  in_.read_exact(e.y.data.data(), e.y.bytes(), "cached element " + std::to_string(index_));
  ++index_;
  return e;
}

}  // namespace kiln::data
