// The safetensors reader: mmap, a strict JSON header parser with its own bounds, and checks of every offset and
// byte count before a tensor is touched. Format: 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data.
#include "kiln/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "kiln/error.hpp"
#include "kiln/files.hpp"
#include "kiln/half.hpp"

namespace kiln {

namespace {

// A JSON value of the header. Numbers are kept as text and read as integers where the format wants them.
struct Json {
  enum Kind { null, boolean, number, string, array, object } kind = null;
  std::string text;  // string value, or the number as written
  std::vector<Json> items;
  // An object's members, each with its name in `key` (a vector of pairs would need Json complete here, which
  // clang's libstdc++ instantiation refuses).
  std::vector<Json> members;
  std::string key;
};

class JsonParser {
 public:
  JsonParser(const char* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  Json document() {
    Json v = value(0);
    ws();
    if (i_ != n_) fail("unexpected '" + std::string(1, p_[i_]) + "' after the header's JSON object");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw DataError(path_ + ": not a safetensors header Kiln reads: " + why + " at header byte " + std::to_string(i_));
  }
  void ws() {
    while (i_ < n_ && (p_[i_] == ' ' || p_[i_] == '\t' || p_[i_] == '\n' || p_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < n_ && p_[i_] == c) return ++i_, true;
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  Json value(int depth) {
    // The format nests three deep ({name: {shape: [..]}}); anything far deeper is no header of it.
    if (depth > 16) fail("JSON nested more than 16 deep");
    ws();
    if (i_ >= n_) fail("the header ends inside a value");
    Json v;
    const char c = p_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Json::object;
      if (eat('}')) return v;
      do {
        ws();
        std::string key = str();
        expect(':');
        v.members.push_back(value(depth + 1));
        v.members.back().key = std::move(key);
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind = Json::array;
      if (eat(']')) return v;
      do v.items.push_back(value(depth + 1));
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::string;
      v.text = str();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Json::number;
      const size_t b = i_;
      while (i_ < n_ && (std::isdigit(static_cast<unsigned char>(p_[i_])) || std::strchr("+-.eE", p_[i_]))) ++i_;
      v.text.assign(p_ + b, i_ - b);
    } else if (n_ - i_ >= 4 && std::memcmp(p_ + i_, "true", 4) == 0) {
      i_ += 4, v.kind = Json::boolean, v.text = "true";
    } else if (n_ - i_ >= 5 && std::memcmp(p_ + i_, "false", 5) == 0) {
      i_ += 5, v.kind = Json::boolean, v.text = "false";
    } else if (n_ - i_ >= 4 && std::memcmp(p_ + i_, "null", 4) == 0) {
      i_ += 4;
    } else {
      fail("unexpected '" + std::string(1, c) + "'");
    }
    return v;
  }
  static void utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6)), out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12)), out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18)), out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f)), out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  uint32_t hex4() {
    if (n_ - i_ < 4) fail("a \\u escape cut short");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = p_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f')
        v |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        v |= static_cast<uint32_t>(h - 'A' + 10);
      else
        fail("a bad \\u escape");
    }
    return v;
  }
  std::string str() {
    if (i_ >= n_ || p_[i_] != '"') fail("expected a string");
    ++i_;
    std::string s;
    while (true) {
      if (i_ >= n_) fail("a string without its closing quote");
      const char c = p_[i_++];
      if (c == '"') return s;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character inside a string");
      if (c != '\\') {
        s += c;
        continue;
      }
      if (i_ >= n_) fail("a string without its closing quote");
      const char e = p_[i_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          s += e;
          break;
        case 'b':
          s += '\b';
          break;
        case 'f':
          s += '\f';
          break;
        case 'n':
          s += '\n';
          break;
        case 'r':
          s += '\r';
          break;
        case 't':
          s += '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xd800 && cp < 0xdc00 && n_ - i_ >= 6 && p_[i_] == '\\' && p_[i_ + 1] == 'u') {
            i_ += 2;
            const uint32_t lo = hex4();
            if (lo < 0xdc00 || lo >= 0xe000) fail("a bad surrogate pair");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          utf8(s, cp);
          break;
        }
        default:
          fail("a bad escape '\\" + std::string(1, e) + "'");
      }
    }
  }

  const char* p_;
  size_t n_;
  const std::string& path_;
  size_t i_ = 0;
};

// A non-negative integer of the header (a shape's dim, an offset); DataError otherwise.
uint64_t json_uint(const Json& v, const std::string& path, const std::string& what) {
  const bool digits = v.kind == Json::number && !v.text.empty() &&
                      std::all_of(v.text.begin(), v.text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || v.text.size() > 19)
    throw DataError(path + ": " + what + " is " + (v.kind == Json::number ? v.text : "not a number") +
                    ", expected a non-negative integer below 10^19");
  return std::stoull(v.text);
}

std::string offsets_text(const SafetensorsTensor& t) {
  return "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
}

// "(2, 5)" for element 13 of a tensor of shape (4, 8): where a value sits, for messages.
std::string index_text(size_t flat, const Shape& s) {
  std::vector<int64_t> at(s.rank());
  for (size_t k = s.rank(); k-- > 0;) {
    const auto d = static_cast<size_t>(std::max<int64_t>(s[k], 1));
    at[k] = static_cast<int64_t>(flat % d);
    flat /= d;
  }
  std::string r = "[";
  for (size_t k = 0; k < at.size(); ++k) r += (k ? ", " : "") + std::to_string(at[k]);
  return r + "]";
}

// Reads element i of raw data of a float dtype as a double.
double element(const unsigned char* p, const std::string& dtype, size_t i) {
  if (dtype == "F32") {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  if (dtype == "F64") {
    double d;
    std::memcpy(&d, p + 8 * i, 8);
    return d;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dtype == "F16" ? f16_to_float(h) : bf16_to_float(h);
}

}  // namespace

size_t safetensors_dtype_size(const std::string& d) {
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E5M2" || d == "F8_E4M3") return 1;
  if (d == "I16" || d == "U16" || d == "F16" || d == "BF16") return 2;
  if (d == "I32" || d == "U32" || d == "F32") return 4;
  if (d == "I64" || d == "U64" || d == "F64") return 8;
  return 0;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  require_regular_file(path, "a safetensors file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw DataError(path + ": cannot stat: " + std::strerror(errno));
  }
  size_ = static_cast<size_t>(st.st_size);
  // The length field is checked before anything else is read or mapped: a lying header costs nothing.
  unsigned char len_bytes[8];
  if (size_ < 8 || ::pread(fd, len_bytes, 8, 0) != 8) {
    ::close(fd);
    throw DataError(path + ": " + std::to_string(size_) +
                    " bytes, shorter than the 8-byte header length every safetensors file starts with");
  }
  uint64_t hlen = 0;
  for (int k = 0; k < 8; ++k) hlen |= static_cast<uint64_t>(len_bytes[k]) << (8 * k);
  if (hlen > kMaxSafetensorsHeader) {
    ::close(fd);
    throw DataError(path + ": its header length field says " + std::to_string(hlen) + " bytes, more than the " +
                    std::to_string(kMaxSafetensorsHeader) +
                    " safetensors allows: not a safetensors file, or a damaged one (nothing was read)");
  }
  if (hlen > size_ - 8) {
    ::close(fd);
    throw DataError(path + ": its header length field says " + std::to_string(hlen) + " bytes, but the file has " +
                    std::to_string(size_ - 8) + " after the length field: truncated, or not a safetensors file");
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw DataError(path + ": cannot map the file: " + std::strerror(errno));
  map_ = static_cast<const unsigned char*>(m);
  data_start_ = 8 + static_cast<size_t>(hlen);
  try {
    const char* h = reinterpret_cast<const char*>(map_ + 8);
    if (hlen == 0 || h[0] != '{')
      throw DataError(path + ": the header does not start with '{' (safetensors' JSON object): not a safetensors file");
    Json doc = JsonParser(h, static_cast<size_t>(hlen), path).document();
    const uint64_t data_bytes = size_ - data_start_;
    for (auto& v : doc.members) {
      const std::string& name = v.key;
      const std::string at = "tensor '" + name + "'";
      if (name == "__metadata__") {
        if (v.kind != Json::object) throw DataError(path + ": __metadata__ is not an object of strings");
        for (auto& s : v.members) {
          const std::string& k = s.key;
          if (s.kind != Json::string) throw DataError(path + ": __metadata__ '" + k + "' is not a string");
          metadata_[k] = s.text;
        }
        continue;
      }
      if (v.kind != Json::object) throw DataError(path + ": " + at + " is not an object {dtype, shape, data_offsets}");
      if (index_.count(name)) throw DataError(path + ": the header names " + at + " twice");
      SafetensorsTensor t;
      t.name = name;
      bool has_dtype = false, has_shape = false, has_offsets = false;
      std::vector<int64_t> dims;
      for (auto& f : v.members) {
        const std::string& k = f.key;
        if (k == "dtype") {
          if (f.kind != Json::string || safetensors_dtype_size(f.text) == 0)
            throw DataError(path + ": " + at + " has dtype " + (f.kind == Json::string ? "'" + f.text + "'" : "?") +
                            ", not one of safetensors' (F32, F16, BF16, F64, I64, ...)");
          t.dtype = f.text, has_dtype = true;
        } else if (k == "shape") {
          if (f.kind != Json::array) throw DataError(path + ": " + at + " has a shape that is not a list");
          if (f.items.size() > 16)
            throw DataError(path + ": " + at + " has " + std::to_string(f.items.size()) + " dims");
          for (auto& d : f.items) {
            const uint64_t x = json_uint(d, path, at + " shape dim");
            if (x > (uint64_t{1} << 48))
              throw DataError(path + ": " + at + " has dim " + d.text + ", not a valid shape");
            dims.push_back(static_cast<int64_t>(x));
          }
          has_shape = true;
        } else if (k == "data_offsets") {
          if (f.kind != Json::array || f.items.size() != 2)
            throw DataError(path + ": " + at + " has data_offsets that are not [begin, end]");
          t.begin = json_uint(f.items[0], path, at + " data_offsets begin");
          t.end = json_uint(f.items[1], path, at + " data_offsets end");
          has_offsets = true;
        } else {
          throw DataError(path + ": " + at + " has key '" + k + "'; safetensors' are dtype, shape and data_offsets");
        }
      }
      if (!has_dtype || !has_shape || !has_offsets)
        throw DataError(path + ": " + at + " lacks " + (!has_dtype ? "dtype" : !has_shape ? "shape" : "data_offsets"));
      t.shape = Shape(dims);
      // The byte count, without overflow: every dim <= 2^48, and the product is checked against 2^62 as it grows.
      uint64_t count = 1;
      for (int64_t d : dims) {
        if (d != 0 && count > (uint64_t{1} << 62) / static_cast<uint64_t>(d))
          throw DataError(path + ": " + at + " has shape " + t.shape.str() + ", more values than any file holds");
        count *= static_cast<uint64_t>(d);
      }
      const uint64_t need = count * safetensors_dtype_size(t.dtype);
      if (t.begin > t.end)
        throw DataError(path + ": " + at + " has data_offsets " + offsets_text(t) + " that end before they begin");
      if (t.end > data_bytes)
        throw DataError(path + ": " + at + " has data_offsets " + offsets_text(t) + " past the end of the data (" +
                        std::to_string(data_bytes) + " bytes after the header): the file is truncated or damaged");
      if (t.end - t.begin != need)
        throw DataError(path + ": " + at + " is " + t.dtype + " of shape " + t.shape.str() + ", " +
                        std::to_string(need) + " bytes, but its data_offsets " + offsets_text(t) + " hold " +
                        std::to_string(t.end - t.begin));
      index_.emplace(name, tensors_.size());
      tensors_.push_back(std::move(t));
    }
    // No two tensors may share bytes (a write to one would change the other, and a file that claims so is damaged).
    std::vector<const SafetensorsTensor*> by_begin;
    for (auto& t : tensors_)
      if (t.end > t.begin) by_begin.push_back(&t);
    std::sort(by_begin.begin(), by_begin.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (size_t k = 1; k < by_begin.size(); ++k)
      if (by_begin[k]->begin < by_begin[k - 1]->end)
        throw DataError(path + ": tensors '" + by_begin[k - 1]->name + "' " + offsets_text(*by_begin[k - 1]) +
                        " and '" + by_begin[k]->name + "' " + offsets_text(*by_begin[k]) +
                        " overlap in the data: the header is damaged");
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(map_), size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), size_);
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

HostTensor SafetensorsFile::read(const SafetensorsTensor& t, bool transpose, int64_t rows) const {
  const std::string at = path_ + ": tensor '" + t.name + "' (" + t.dtype + ", shape " + t.shape.str() + ")";
  if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16" && t.dtype != "F64")
    throw DataError(at + ": Kiln starts from floating-point weights (F32, F16, BF16 or F64), not " + t.dtype);
  const unsigned char* p = map_ + data_start_ + t.begin;
  const size_t n = static_cast<size_t>(t.shape.numel());
  for (size_t i = 0; i < n; ++i)
    if (const double v = element(p, t.dtype, i); !std::isfinite(v))
      throw DataError(at + " holds " +
                      (std::isnan(v) ? std::string("NaN")
                       : v > 0       ? "inf"
                                     : "-inf") +
                      " at element " + std::to_string(i) + " " + index_text(i, t.shape) +
                      ": the weights to start from must be finite numbers");
  Shape src = t.shape;
  if (rows >= 0 && (src.rank() == 0 || rows > src[0]))
    throw DataError(at + ": cannot take its first " + std::to_string(rows) + " rows");
  if (rows >= 0) src[0] = rows;
  if (transpose && src.rank() != 2) throw DataError(at + ": only a matrix (2 dims) can be transposed");
  const int64_t R = src.rank() == 2 ? src[0] : 0, C = src.rank() == 2 ? src[1] : 0;
  HostTensor out(transpose ? Shape{C, R} : src);
  const size_t m = out.data.size();
  if (!transpose) {
    if (t.dtype == "F32" || t.dtype == "F64") {
      for (size_t i = 0; i < m; ++i) out.data[i] = static_cast<float>(element(p, t.dtype, i));
    } else {
      to_float(p, t.dtype == "F16" ? DType::f16 : DType::bf16, out.data.data(), m);  // a row prefix is a prefix
    }
    return out;
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      out.data[static_cast<size_t>(c * R + r)] =
          static_cast<float>(element(p, t.dtype, static_cast<size_t>(r * C + c)));
  return out;
}

}  // namespace kiln
