// libFuzzer harness: the data cache's file reader (plugins/data/cache_file.cpp, CacheReader), which opens a cache
// file written by an earlier run and must refuse any damage before using it.
// Input: byte 0 = options (bits 0-1: the element shapes the reader expects; bit 2: repair the header's payload
// length and both CRC-32s so the mutated records reach the record walk instead of failing the checksum), then the
// file's bytes. An opened cache is read through: every element, then a seek back.
#include <zlib.h>

#include <cstring>
#include <vector>

#include "../../plugins/data/cache_file.hpp"
#include "fuzz_support.hpp"

using namespace kiln;

namespace {

struct Shapes {
  Shape x, y;
};

size_t header_length(const Shapes& s) { return 44 + 4 + 8 * s.x.rank() + 4 + 8 * s.y.rank() + 4; }

void repair(std::vector<uint8_t>& f, const Shapes& s) {
  const size_t h = header_length(s);
  if (f.size() < h) return;
  const uint64_t payload = f.size() - h;
  std::memcpy(f.data() + 32, &payload, 8);
  const auto crc = static_cast<uint32_t>(crc32_z(0, f.data() + h, payload));
  std::memcpy(f.data() + 40, &crc, 4);
  const auto hcrc = static_cast<uint32_t>(crc32_z(0, f.data(), h - 4));
  std::memcpy(f.data() + h - 4, &hcrc, 4);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Shapes shapes[] = {
      {Shape{2}, Shape{}}, {Shape{1, 2, 2}, Shape{}}, {Shape{3}, Shape{2}}, {Shape{}, Shape{}}};
  fuzz::Bytes in(data, size);
  const uint8_t opts = in.u8();
  const Shapes& s = shapes[opts & 3];
  std::vector<uint8_t> file(in.rest(), in.rest() + in.left());
  if (opts & 4) repair(file, s);
  const auto& dir = fuzz::scratch_dir("cache");
  const std::string path = fuzz::write_file(dir / "data.cache", file.data(), file.size());
  try {
    std::string why;
    auto r = data::CacheReader::open(path, s.x, s.y, why);
    if (!r) return 0;
    for (uint64_t i = 0; i < r->elements(); ++i) r->next();
    r->seek(r->elements() / 2);
    if (r->elements() > 0) r->next();
  } catch (const kiln::Error& e) {
    kiln::fuzz::refused(e);
  }
  return 0;
}
