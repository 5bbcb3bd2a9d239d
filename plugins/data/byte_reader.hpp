// Sequential, buffered reading of a plain or gzip file (detected by the magic bytes 1f 8b), with seeking by
// uncompressed offset. Memory stays bounded by the buffer whatever the file size. Plain files can also be read at
// any offset from several threads at once (read_at, by pread).
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

typedef struct gzFile_s* gzFile;

namespace kiln::data {

class ByteReader {
 public:
  // Throws DataError naming `path` if it cannot be opened. `who` prefixes messages ("idx", "cifar10"). Every byte
  // read (uncompressed, for gzip) is added to `*counted` when given (a source's StageStats::bytes_read).
  ByteReader(std::string path, std::string who, std::atomic<uint64_t>* counted = nullptr);
  ~ByteReader();
  ByteReader(const ByteReader&) = delete;
  ByteReader& operator=(const ByteReader&) = delete;

  const std::string& path() const { return path_; }
  bool gzip() const { return gzip_; }
  uint64_t file_bytes() const { return file_bytes_; }  // size on disk
  uint64_t offset() const { return offset_; }          // uncompressed offset of the next byte
  void count_into(std::atomic<uint64_t>* counted) { counted_ = counted; }

  // Reads exactly n bytes; a short read is a DataError naming the file, the offset and `what`.
  void read_exact(void* dst, size_t n, const std::string& what);
  // Reads up to n bytes; 0 at the end of the file. Corrupt gzip data is a DataError.
  size_t read_some(void* dst, size_t n);
  void seek(uint64_t offset);
  // Reads exactly n bytes at `offset` of a plain file without moving offset(); safe from several threads at once
  // (and alongside read_some). A gzip file has no random access: calling it is a logic error (kiln::Error).
  void read_at(uint64_t offset, void* dst, size_t n, const std::string& what) const;
  // Uncompressed length: the file size for plain files; for gzip, the trailer's ISIZE when it agrees with
  // `expected` (mod 2^32), else counted by streaming through the whole file. Leaves the reader at offset 0.
  uint64_t uncompressed_bytes(uint64_t expected);
  [[noreturn]] void fail(const std::string& what) const;

 private:
  std::string path_;
  std::string who_;
  gzFile f_ = nullptr;
  int fd_ = -1;  // plain files: the descriptor read_at preads from
  std::atomic<uint64_t>* counted_ = nullptr;
  bool gzip_ = false;
  uint64_t file_bytes_ = 0;
  uint64_t offset_ = 0;
};

}  // namespace kiln::data
