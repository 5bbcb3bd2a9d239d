// docs/checkpoint.md is how a reader outside Kiln checks a checkpoint: the version-1 checksum computed from the
// constants it gives (its FNV offset basis is not the standard one) must be the one load_checkpoint accepts.
#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <sstream>

#include "kiln/checkpoint.hpp"
#include "test_support.hpp"

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}
}  // namespace

TEST_CASE("a version-1 checkpoint checksummed with docs/checkpoint.md's FNV-1a basis and prime loads",
          "[checkpoint][docs]") {
  const std::string doc = slurp(std::string(KILN_SOURCE_DIR) + "/docs/checkpoint.md");
  std::smatch basis, prime;
  REQUIRE(std::regex_search(doc, basis, std::regex("offset basis (\\d+)")));
  REQUIRE(std::regex_search(doc, prime, std::regex("prime (\\d+)")));

  const auto dir = kiln::test::temp_dir("ckpt_doc");
  kiln::Checkpoint c;
  c.epoch = 1;
  c.step = 9;
  c.tensors.emplace("w", kiln::HostTensor(kiln::Shape{2, 3}, 0.5f));
  const std::string v2 = (dir / "v2.kiln").string();
  kiln::save_checkpoint(v2, c);
  std::string v1 = slurp(v2);
  v1.resize(v1.size() - 8);  // the body, without version 2's checksum
  v1.replace(0, 8, "KILNCKP1");
  uint64_t h = std::stoull(basis[1].str());
  const uint64_t p = std::stoull(prime[1].str());
  for (char ch : v1) h = (h ^ static_cast<uint8_t>(ch)) * p;
  v1.append(reinterpret_cast<const char*>(&h), 8);
  const std::string path = (dir / "v1.kiln").string();
  std::ofstream(path, std::ios::binary) << v1;
  INFO("docs/checkpoint.md gives the offset basis " << basis[1] << " and the prime " << prime[1]);
  const auto back = kiln::load_checkpoint(path);
  CHECK(back.step == 9);
  CHECK(back.tensors.at("w").data == c.tensors.at("w").data);
  // The Python reader's version-1 lines give the same numbers.
  std::smatch snippet;
  REQUIRE(std::regex_search(doc, snippet,
                            std::regex("`h = (\\d+)`, then for each byte\\s+`h = \\(\\(h \\^ b\\) \\* (\\d+)\\)")));
  CHECK(snippet[1] == basis[1]);
  CHECK(snippet[2] == prime[1]);
}
