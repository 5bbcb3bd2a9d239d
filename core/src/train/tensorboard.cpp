// TensorBoard event files: TFRecord framing and the few protobuf fields of Event and Summary, written by hand.
#include "tensorboard.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/error.hpp"

namespace kiln {

namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> a{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected Castagnoli polynomial
      a[i] = c;
    }
    return a;
  }();
  return t;
}

// Protobuf wire format: varint, 64-bit (wire type 1), length-delimited (2) and 32-bit (5) fields.
void varint(std::string& o, uint64_t v) {
  while (v >= 0x80) {
    o += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  o += static_cast<char>(v);
}
void tag(std::string& o, int field, int wire) {
  varint(o, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire));
}
void fixed64(std::string& o, int field, double v) {
  tag(o, field, 1);
  char b[8];
  std::memcpy(b, &v, 8);
  o.append(b, 8);
}
void fixed32(std::string& o, int field, float v) {
  tag(o, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  o.append(b, 4);
}
void bytes(std::string& o, int field, const std::string& v) {
  tag(o, field, 2);
  varint(o, v.size());
  o += v;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto& t = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." + host + "." +
          std::to_string(::getpid());
  f_ = std::fopen(path_.c_str(), "wbx");  // never over an existing file
  if (!f_) throw Error(path_ + ": cannot create the TensorBoard event file: " + std::strerror(errno));
  std::string e;
  fixed64(e, 1, now_seconds());
  bytes(e, 3, "brain.Event:2");  // file_version
  record(e);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [name, v] : values) {
    std::string value;
    bytes(value, 1, name);                     // Summary.Value.tag
    fixed32(value, 2, static_cast<float>(v));  // Summary.Value.simple_value
    bytes(summary, 1, value);                  // Summary.value
  }
  std::string e;
  fixed64(e, 1, now_seconds());  // Event.wall_time
  tag(e, 2, 0);                  // Event.step
  varint(e, static_cast<uint64_t>(step));
  bytes(e, 5, summary);  // Event.summary
  record(e);
}

void TensorBoardWriter::record(const std::string& data) {
  const uint64_t len = data.size();
  char head[12];
  std::memcpy(head, &len, 8);
  const uint32_t lc = masked_crc32c(head, 8);
  std::memcpy(head + 8, &lc, 4);
  const uint32_t dc = masked_crc32c(data.data(), data.size());
  if (std::fwrite(head, 1, 12, f_) != 12 || std::fwrite(data.data(), 1, data.size(), f_) != data.size() ||
      std::fwrite(&dc, 1, 4, f_) != 4)
    throw Error(path_ + ": writing the TensorBoard event file failed (disk full?)");
}

void TensorBoardWriter::flush() { std::fflush(f_); }

std::vector<std::string> read_tfrecords(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open the event file");
  const std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < b.size()) {
    if (b.size() - pos < 12) throw Error(path + ": a record at byte " + std::to_string(pos) + " is cut short");
    uint64_t len;
    uint32_t lc, dc;
    std::memcpy(&len, b.data() + pos, 8);
    std::memcpy(&lc, b.data() + pos + 8, 4);
    if (lc != masked_crc32c(b.data() + pos, 8)) throw Error(path + ": bad length CRC at byte " + std::to_string(pos));
    if (len > b.size() - pos - 12 || b.size() - pos - 12 - len < 4)
      throw Error(path + ": the record at byte " + std::to_string(pos) + " is longer than the file");
    std::memcpy(&dc, b.data() + pos + 12 + len, 4);
    if (dc != masked_crc32c(b.data() + pos + 12, len))
      throw Error(path + ": bad data CRC at byte " + std::to_string(pos));
    out.emplace_back(b.substr(pos + 12, len));
    pos += 12 + len + 4;
  }
  return out;
}

int remove_tensorboard_events(const std::string& dir) {
  int removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code rm;
    if (it->path().filename().string().rfind("events.out.tfevents.", 0) == 0 && it->is_regular_file(rm) &&
        std::filesystem::remove(it->path(), rm))
      ++removed;
  }
  return removed;
}

}  // namespace kiln
