// On-disk format of the file cache. A header (magic "KILNCAC1", version, element shapes, element and example
// counts, payload length, CRC-32 of the payload, CRC-32 of the header) followed by one record per element:
// int64 batch (0 = single example), then x and y as float32, native byte order.
// The writer writes to a fresh "<path>.tmp.<pid>.<n>" and renames it to <path> only after the header is final and the
// data is synced, so a crash never leaves a file that looks complete; the reader validates everything before use.
// Only a Kiln cache (a regular file starting with the magic) or nothing is ever replaced: see cache_target_problem.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "byte_reader.hpp"
#include "kiln/data.hpp"

namespace kiln::data {

// What makes `path` unfit to be (re)written as a cache, or "" when nothing is there or a Kiln cache file is (which
// may be rebuilt). Directories, device nodes, FIFOs, sockets, dangling links and any file that does not start with
// the cache magic (a user's text file, the training data itself) are never replaced.
std::string cache_target_problem(const std::string& path);

class CacheWriter {
 public:
  CacheWriter(std::string path, Shape x, Shape y);  // throws DataError if the temp file cannot be created
  ~CacheWriter();                                   // removes the temp file unless committed
  CacheWriter(const CacheWriter&) = delete;
  CacheWriter& operator=(const CacheWriter&) = delete;

  void append(const Element& e);  // DataError if the shapes differ from the declared ones or a write fails
  void commit();  // final header, fsync, rename over <path>; DataError if <path> became something not to replace

 private:
  void write(const void* p, size_t n);
  std::string path_, tmp_;
  Shape x_, y_;
  std::FILE* f_ = nullptr;
  uint64_t elements_ = 0, examples_ = 0, payload_ = 0;
  uint32_t crc_ = 0;
};

class CacheReader {
 public:
  // Opens and fully validates a cache for elements of shapes x, y. Returns null and sets `why` when the file is
  // missing, truncated, corrupt or holds other shapes. Memory stays bounded by one element.
  static std::unique_ptr<CacheReader> open(const std::string& path, const Shape& x, const Shape& y, std::string& why);

  uint64_t elements() const { return offsets_.size(); }
  uint64_t examples() const { return examples_; }
  void seek(uint64_t index);  // index <= elements()
  Element next();             // the element at the current index; advances

 private:
  CacheReader(const std::string& path, Shape x, Shape y);
  ByteReader in_;
  Shape x_, y_;
  std::vector<uint64_t> offsets_;  // byte offset of each record
  uint64_t examples_ = 0, index_ = 0;
};

}  // namespace kiln::data
