// Sources stream: reading a ~1 GB IDX file keeps the process's peak resident memory within a fixed bound.
#include <catch2/catch.hpp>
#include <fstream>

#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;

namespace {

// A field of /proc/self/status in KiB ("VmHWM", "VmRSS").
int64_t status_kib(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0); returns false where that is not possible.
bool reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// Writes an IDX pair of n 28x28 images in 1 MiB chunks (never the whole file in memory).
void write_large_idx(const std::filesystem::path& dir, uint32_t n, bool gzip) {
  const uint32_t chunk = 1337;  // images per write
  std::vector<uint8_t> head;
  put_be32(head, 0x00000803);
  put_be32(head, n);
  put_be32(head, 28);
  put_be32(head, 28);
  std::vector<uint8_t> body(static_cast<size_t>(chunk) * 784);
  gzFile gz = gzip ? gzopen((dir / "images").string().c_str(), "wb1") : nullptr;
  std::ofstream plain;
  if (!gzip) plain.open(dir / "images", std::ios::binary);
  auto write = [&](const uint8_t* p, size_t len) {
    if (gz)
      gzwrite(gz, p, static_cast<unsigned>(len));
    else
      plain.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(len));
  };
  write(head.data(), head.size());
  for (uint32_t i = 0; i < n; i += chunk) {
    const uint32_t m = std::min(chunk, n - i);
    for (uint32_t k = 0; k < m; ++k)
      for (uint32_t j = 0; j < 784; ++j) body[k * 784 + j] = static_cast<uint8_t>((i + k) * 31 + j);
    write(body.data(), static_cast<size_t>(m) * 784);
  }
  if (gz) gzclose(gz);
  plain.close();
  std::vector<uint8_t> lab;
  put_be32(lab, 0x00000801);
  put_be32(lab, n);
  for (uint32_t i = 0; i < n; ++i) lab.push_back(static_cast<uint8_t>(i % 10));
  write_bytes(dir / "labels", lab, gzip);
}

// Streams every example through scale > batch(256) and returns (examples, growth of peak RSS in MiB).
std::pair<int64_t, double> stream(const std::filesystem::path& dir) {
  auto p = build("stages = [{type = \"idx\", images = \"" + (dir / "images").string() + "\", labels = \"" +
                 (dir / "labels").string() + "\"}, {type = \"scale\"}, {type = \"batch\", size = 256}]");
  const int64_t before = status_kib("VmRSS");
  const bool can_reset = reset_peak();
  int64_t n = 0;
  double check = 0;
  for (auto b = p->next(); b; b = p->next()) {
    n += b->batch;
    check += b->x.data[0] + b->y.data[static_cast<size_t>(b->batch - 1)];
  }
  REQUIRE(check > 0);
  const int64_t peak = can_reset ? status_kib("VmHWM") : status_kib("VmRSS");
  return {n, static_cast<double>(peak - before) / 1024.0};
}

}  // namespace

// Bound: the pipeline holds one 256-example batch (0.8 MB of floats), a few examples and zlib's 256 KiB buffer;
// 64 MiB above the RSS before streaming leaves room for the allocator's slack, yet is 16x less than the file.
TEST_CASE("idx source streams a ~1 GB file with peak memory growth under 64 MiB", "[data]") {
  if (kiln::test::kAddressSanitizer)
    KILN_SKIP("peak RSS bounds do not hold under AddressSanitizer (its quarantine keeps freed memory)");
  auto dir = kiln::test::temp_dir("data-stream");
  const uint32_t n = 1300000;  // 1.02 GB of pixels
  write_large_idx(dir, n, false);
  REQUIRE(std::filesystem::file_size(dir / "images") == 16 + uint64_t{n} * 784);
  auto [count, growth_mib] = stream(dir);
  std::filesystem::remove_all(dir);
  REQUIRE(count == n);
  INFO("peak RSS growth " << growth_mib << " MiB");
  REQUIRE(growth_mib < 64);
}

TEST_CASE("idx source streams a large gzip file with peak memory growth under 64 MiB", "[data]") {
  if (kiln::test::kAddressSanitizer)
    KILN_SKIP("peak RSS bounds do not hold under AddressSanitizer (its quarantine keeps freed memory)");
  auto dir = kiln::test::temp_dir("data-stream-gz");
  const uint32_t n = 200000;  // 157 MB uncompressed
  write_large_idx(dir, n, true);
  auto [count, growth_mib] = stream(dir);
  std::filesystem::remove_all(dir);
  REQUIRE(count == n);
  INFO("peak RSS growth " << growth_mib << " MiB");
  REQUIRE(growth_mib < 64);
}
