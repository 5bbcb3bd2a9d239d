// Reading safetensors files (Hugging Face's format, what `kiln export` writes): the file is memory-mapped and its
// header checked whole before any tensor is read, since a header is data from elsewhere and never trusted.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/tensor.hpp"

namespace kiln {

// safetensors' own bound on the header (its MAX_HEADER_SIZE): a longer one is refused before it is read.
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as the header spells it: "F32", "F16", "BF16", "F64", "I64", ...
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data that follows the header
};

class SafetensorsFile {
 public:
  // Maps `path` and checks its header: the length field within the file and at most kMaxSafetensorsHeader, valid
  // JSON (an object of tensors and "__metadata__"), every tensor's dtype known, its shape valid, its data_offsets
  // inside the data and exactly as long as dtype and shape say, no two tensors' bytes overlapping, no name twice.
  // Throws DataError "<path>: ..." naming the tensor and the values found.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // in header order
  const SafetensorsTensor* find(const std::string& name) const;               // null when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor's values as float32 (F32, F16, BF16 and F64 are converted; other dtypes are a DataError), checked
  // finite in the file's bytes before anything is allocated (a DataError naming the first non-finite element).
  // `transpose`: a rank-2 tensor is returned transposed. `rows` >= 0: only its first `rows` rows (along dim 0).
  HostTensor read(const SafetensorsTensor& t, bool transpose = false, int64_t rows = -1) const;

 private:
  std::string path_;
  const unsigned char* map_ = nullptr;  // the whole file, read-only
  size_t size_ = 0;
  size_t data_start_ = 0;  // 8 + header length
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Bytes per element of a safetensors dtype, 0 for a name safetensors does not define.
size_t safetensors_dtype_size(const std::string& dtype);

}  // namespace kiln
