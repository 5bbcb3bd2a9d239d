// Sequential, buffered reading of a plain or gzip file (detected by the magic bytes 1f 8b), with seeking by
// uncompressed offset. Memory stays bounded by the buffer whatever the file size.
#pragma once
#include <cstdint>
#include <string>

typedef struct gzFile_s* gzFile;

namespace kiln::data {

class ByteReader {
 public:
  // Throws DataError naming `path` if it cannot be opened. `who` prefixes messages ("idx", "cifar10").
  ByteReader(std::string path, std::string who);
  ~ByteReader();
  ByteReader(const ByteReader&) = delete;
  ByteReader& operator=(const ByteReader&) = delete;

  const std::string& path() const { return path_; }
  bool gzip() const { return gzip_; }
  uint64_t file_bytes() const { return file_bytes_; }  // size on disk
  uint64_t offset() const { return offset_; }          // uncompressed offset of the next byte

  // Reads exactly n bytes; a short read is a DataError naming the file, the offset and `what`.
  void read_exact(void* dst, size_t n, const std::string& what);
  // Reads up to n bytes; 0 at the end of the file. Corrupt gzip data is a DataError.
  size_t read_some(void* dst, size_t n);
  void seek(uint64_t offset);
  // Uncompressed length: the file size for plain files; for gzip, the trailer's ISIZE when it agrees with
  // `expected` (mod 2^32), else counted by streaming through the whole file. Leaves the reader at offset 0.
  uint64_t uncompressed_bytes(uint64_t expected);
  [[noreturn]] void fail(const std::string& what) const;

 private:
  std::string path_;
  std::string who_;
  gzFile f_ = nullptr;
  bool gzip_ = false;
  uint64_t file_bytes_ = 0;
  uint64_t offset_ = 0;
};

}  // namespace kiln::data
