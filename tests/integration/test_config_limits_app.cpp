// `kiln plan` on a config whose table header has 50,000 parts: it died of a stack overflow inside toml++ (exit 139);
// now the load refuses it, a config error (exit 2) naming the file and line.
#include <catch2/catch.hpp>
#include <fstream>

#include "test_support.hpp"

TEST_CASE("kiln plan refuses a table header of 50000 parts with a config error instead of crashing",
          "[config][limits]") {
  const auto d = kiln::test::temp_dir("config_limits_app");
  std::string header = "[a";
  for (int k = 1; k < 50000; ++k) header += ".a";
  const std::string path = (d / "deep.toml").string();
  std::ofstream(path) << "# line 1\n" << header << "]\nx = 1\n";
  const auto r = kiln::test::run_app("plan " + path);
  INFO(r.output.substr(0, 2000));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains(path + ":2: a table header of 50000 parts ('[a.a.a.") &&
                           Catch::Contains("at most 64 parts are accepted"));
}
