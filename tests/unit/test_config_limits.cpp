// Bounds on what reaches the TOML parser: a table header or dotted key of 50,000 parts overflowed the parser's stack
// (a crash, not an error), so Config refuses keys of more than 64 parts, nesting deeper than 64 and files over
// 16 MiB with a ConfigError naming the file and line. A --set is one line: a value with a line break lost its later
// lines without a word.
#include <catch2/catch.hpp>
#include <fstream>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "test_support.hpp"

using kiln::Config;
using kiln::ConfigError;

namespace {

std::string repeat(const std::string& s, size_t n, const std::string& sep = "") {
  std::string out;
  for (size_t k = 0; k < n; ++k) out += (k ? sep : "") + s;
  return out;
}

std::string write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// The ConfigError text of loading `path` with `sets`, or "(accepted)".
std::string load_error(const std::string& path, const std::vector<std::string>& sets = {}) {
  try {
    Config::load_file(path, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

const std::string kTrain = "[train]\nepochs = 3\n";

}  // namespace

TEST_CASE("a table header or dotted key of 50000 parts is a config error naming the file and line (not a crash)",
          "[config][limits]") {
  const auto d = kiln::test::temp_dir("config_limits");
  const std::string header = write(d / "header.toml", "# a comment\n\n[" + repeat("a", 50000, ".") + "]\nx = 1\n");
  std::string m = load_error(header);
  CHECK_THAT(m, Catch::StartsWith(header + ":3: a table header of 50000 parts ('[a.a.a."));
  CHECK_THAT(m, Catch::EndsWith("at most 64 parts are accepted"));
  CHECK(m.size() < 300);  // the header is shown abbreviated, not 100 KB of it

  const std::string aot = write(d / "aot.toml", "[[" + repeat("b", 50000, ".") + "]]\n");
  CHECK_THAT(load_error(aot), Catch::StartsWith(aot + ":1: a table header of 50000 parts ('[[b.b."));

  const std::string dotted = write(d / "dotted.toml", kTrain + repeat("a", 50000, ".") + " = 1\n");
  CHECK_THAT(load_error(dotted),
             Catch::StartsWith(dotted + ":3: a dotted key of 50000 parts ('a.a.a.") && Catch::Contains("at most 64"));

  // Quoted parts count as parts, and the dots inside them do not.
  const std::string quoted = write(d / "quoted.toml", repeat("\"q.q\"", 65, ".") + " = 1\n");
  CHECK_THAT(load_error(quoted), Catch::StartsWith(quoted + ":1: a dotted key of 65 parts"));
  // Inside an inline table too.
  const std::string inl = write(d / "inline.toml", "t = { " + repeat("k", 65, ".") + " = 1 }\n");
  CHECK_THAT(load_error(inl), Catch::StartsWith(inl + ":1: a dotted key of 65 parts"));

  // 64 parts are accepted, and so is the file's line count after strings and comments holding dots and brackets.
  const std::string ok =
      write(d / "ok.toml", "[" + repeat("a", 64, ".") + "]\nx = 1\n" + repeat("b", 64, ".") + " = 2\ns = \"" +
                               repeat("c", 500, ".") + "[[[{{{\"\nm = '''\n" + repeat("[", 100) + "\n" +
                               repeat("d", 100, ".") + "'''\n# " + repeat("[{", 100) + "\n[t]\n");
  CHECK(load_error(ok) == "(accepted)");
}

TEST_CASE("arrays and inline tables nested more than 64 deep are a config error naming the file and line",
          "[config][limits]") {
  const auto d = kiln::test::temp_dir("config_limits");
  // 100 deep: the parser's own limit (256) took it; the bound is well below the depth where recursion is a risk.
  const std::string arr = write(d / "arr.toml", kTrain + "x = 1\nv = " + repeat("[", 100) + repeat("]", 100) + "\n");
  CHECK(load_error(arr) == arr + ":4: arrays and inline tables nested 100 deep; at most 64 levels are accepted");
  const std::string tbl =
      write(d / "tbl.toml", "v = [\n  1,\n  " + repeat("{a = ", 50000) + "1" + repeat("}", 50000) + "\n]\n");
  CHECK(load_error(tbl) == tbl + ":3: arrays and inline tables nested 50001 deep; at most 64 levels are accepted");
  const std::string ok =
      write(d / "ok.toml", "v = " + repeat("[", 64) + repeat("]", 64) + "\nw = \"" + repeat("[", 100) + "\"\n");
  CHECK(load_error(ok) == "(accepted)");
}

TEST_CASE("a config file over 16 MiB is a config error naming its size", "[config][limits]") {
  const auto d = kiln::test::temp_dir("config_limits");
  const std::string big = write(d / "big.toml", kTrain + "# " + std::string(17u << 20, 'x') + "\n");
  CHECK(load_error(big) == big + ": the config is 17825814 bytes (17.0 MiB); a config is at most 16 MiB");
  CHECK_THROWS_WITH(Config::load_string(std::string(17u << 20, '\n'), "big.toml"),
                    Catch::StartsWith("big.toml: the config is 17825792 bytes"));
}

TEST_CASE("a --set with a line break is a config error naming the --set and the line after the break",
          "[config][limits]") {
  const auto d = kiln::test::temp_dir("config_limits");
  const std::string run = write(d / "run.toml", kTrain);
  // Before, "train.epochs=1\nfoo=2" set epochs to 1 and dropped foo=2 without a word.
  CHECK(load_error(run, {"train.epochs=1\nfoo=2"}) ==
        "--set 'train.epochs=1\\nfoo=2': a --set is one line, found a line break before 'foo=2'; give each key its own "
        "--set and write a line break inside a string as \\n (\"a\\nb\")");
  CHECK_THAT(load_error(run, {"run.name=\"\"\"a\nb\"\"\""}),
             Catch::StartsWith("--set 'run.name=\"\"\"a\\nb\"\"\"': a --set is one line, found a line break before "
                               "'b\"\"\"'"));
  CHECK_THAT(load_error(run, {"train.epochs=1\r\n"}),
             Catch::StartsWith("--set 'train.epochs=1\\r\\n': a --set is one line, found a line break;"));
  // A line break written as the escape inside a TOML string is a value like any other.
  auto c = Config::load_file(run, {"run.name=\"a\\nb\""});
  CHECK(c.root().table("run")->get_string("name") == "a\nb");
}

TEST_CASE("a --set key of more than 64 parts or a value nested more than 64 deep is a config error naming the --set",
          "[config][limits]") {
  const auto d = kiln::test::temp_dir("config_limits");
  const std::string run = write(d / "run.toml", kTrain);
  CHECK_THAT(
      load_error(run, {repeat("a", 50000, ".") + "=1"}),
      Catch::StartsWith("--set 'a.a.a.") && Catch::EndsWith("': the key has 50000 parts; at most 64 are accepted"));
  // Before, a value nested past the parser's limit became the string "[[[...]]]" without a word.
  CHECK_THAT(load_error(run, {"train.x=" + repeat("[", 300) + repeat("]", 300)}),
             Catch::StartsWith("--set 'train.x=[[[") &&
                 Catch::EndsWith("': arrays and inline tables nested 300 deep; at most 64 levels are accepted"));
  auto c = Config::load_file(run, {repeat("a", 64, ".") + "=" + repeat("[", 64) + repeat("]", 64)});
  CHECK(c.root().has("a"));
}
