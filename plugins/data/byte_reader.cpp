#include "byte_reader.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/files.hpp"

namespace kiln::data {

namespace {
constexpr unsigned kGzBuffer = 256 * 1024;
}

ByteReader::ByteReader(std::string path, std::string who, std::atomic<uint64_t>* counted)
    : path_(std::move(path)), who_(std::move(who)), counted_(counted) {
  std::error_code ec;
  // A FIFO or device would block or never end: only regular files are read.
  if (std::string why = regular_file_problem(path_); !why.empty()) fail(why + ", expected a data file");
  std::FILE* probe = std::fopen(path_.c_str(), "rb");
  if (!probe) fail(std::string("cannot open: ") + std::strerror(errno));
  unsigned char magic[2] = {0, 0};
  size_t got = std::fread(magic, 1, 2, probe);
  std::fclose(probe);
  gzip_ = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  file_bytes_ = std::filesystem::file_size(path_, ec);
  if (ec) fail("cannot read its size: " + ec.message());
  f_ = gzopen(path_.c_str(), "rb");
  if (!f_) fail(std::string("cannot open: ") + std::strerror(errno));
  gzbuffer(f_, kGzBuffer);
  if (!gzip_) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(std::string("cannot open: ") + std::strerror(errno));
  }
}

ByteReader::~ByteReader() {
  if (f_) gzclose(f_);
  if (fd_ >= 0) ::close(fd_);
}

void ByteReader::fail(const std::string& what) const { throw DataError(who_ + ": " + path_ + ": " + what); }

size_t ByteReader::read_some(void* dst, size_t n) {
  auto* out = static_cast<unsigned char*>(dst);
  size_t total = 0;
  while (total < n) {
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - total, std::numeric_limits<int>::max() / 2));
    int r = gzread(f_, out + total, chunk);
    if (r < 0) {
      int code = 0;
      const char* msg = gzerror(f_, &code);
      fail("corrupt data near uncompressed byte offset " + std::to_string(offset_ + total) + ": " +
           (msg ? msg : "read error"));
    }
    if (r == 0) {
      int code = 0;
      const char* msg = gzerror(f_, &code);
      // zlib reports a gzip stream cut short as Z_BUF_ERROR at the end of the file.
      if (code != Z_OK && code != Z_STREAM_END)
        fail("corrupt or truncated gzip data at uncompressed byte offset " + std::to_string(offset_ + total) + ": " +
             (msg ? msg : "read error"));
      break;
    }
    total += static_cast<size_t>(r);
  }
  offset_ += total;
  if (counted_) counted_->fetch_add(total, std::memory_order_relaxed);
  return total;
}

void ByteReader::read_at(uint64_t offset, void* dst, size_t n, const std::string& what) const {
  if (fd_ < 0) throw Error(who_ + ": " + path_ + ": read_at on a gzip file (it has no random access)");
  auto* out = static_cast<unsigned char*>(dst);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd_, out + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      fail("cannot read " + what + " at byte offset " + std::to_string(offset + got) + ": " + std::strerror(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  if (counted_) counted_->fetch_add(got, std::memory_order_relaxed);
  if (got != n)
    fail("truncated: reading " + what + " needed " + std::to_string(n) + " bytes at byte offset " +
         std::to_string(offset) + ", but the file ends at offset " + std::to_string(offset + got) +
         " (was it modified while reading?)");
}

void ByteReader::read_exact(void* dst, size_t n, const std::string& what) {
  uint64_t at = offset_;
  size_t got = read_some(dst, n);
  if (got != n)
    fail("truncated: reading " + what + " needed " + std::to_string(n) + " bytes at byte offset " + std::to_string(at) +
         ", but the " + (gzip_ ? "uncompressed data ends" : "file ends") + " at offset " + std::to_string(at + got));
}

void ByteReader::seek(uint64_t offset) {
  if (offset == offset_) return;
  gzclearerr(f_);
  z_off_t r = gzseek(f_, static_cast<z_off_t>(offset), SEEK_SET);
  if (r < 0 || static_cast<uint64_t>(r) != offset) {
    int code = 0;
    const char* msg = gzerror(f_, &code);
    fail("cannot seek to byte offset " + std::to_string(offset) + ": " + (msg && *msg ? msg : "beyond the end"));
  }
  offset_ = offset;
}

uint64_t ByteReader::uncompressed_bytes(uint64_t expected) {
  if (!gzip_) return file_bytes_;
  uint64_t total = 0;
  if (file_bytes_ >= 18) {  // smallest gzip member: 10-byte header + 8-byte trailer
    std::FILE* f = std::fopen(path_.c_str(), "rb");
    unsigned char t[4] = {0, 0, 0, 0};
    bool ok = f && std::fseek(f, -4, SEEK_END) == 0 && std::fread(t, 1, 4, f) == 4;
    if (f) std::fclose(f);
    uint32_t isize = static_cast<uint32_t>(t[0]) | static_cast<uint32_t>(t[1]) << 8 |
                     static_cast<uint32_t>(t[2]) << 16 | static_cast<uint32_t>(t[3]) << 24;
    if (ok && isize == static_cast<uint32_t>(expected)) return expected;
  }
  // The trailer disagrees (or the file holds several gzip members): count by streaming.
  seek(0);
  std::vector<unsigned char> buf(kGzBuffer);
  for (size_t n; (n = read_some(buf.data(), buf.size())) > 0;) total += n;
  seek(0);
  return total;
}

}  // namespace kiln::data
