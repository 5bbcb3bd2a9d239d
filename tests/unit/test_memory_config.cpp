// Validation of every memory and device key: each bad value is a ConfigError naming the file, key and value.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/session.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

const std::string kBase = "[model]\ninput_shape = [4]\n[[model.layers]]\nname = \"fc\"\ntype = \"dense\"\nunits = 2\n";

// The ConfigError text of a session built from kBase + extra, or "<ok>".
std::string config_error(const std::string& extra, bool open = false) {
  try {
    Session s(Config::load_string(kBase + extra, "mem.toml"), test::registry());
    if (open) s.open_devices(false);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<ok>";
}

// RAII environment variable for one test.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) had_ = true, old_ = v;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~EnvVar() {
    if (had_) ::setenv(name_, old_.c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace

TEST_CASE("every [device] memory key is validated with the key and value named", "[memory]") {
  EnvVar off("KILN_RESERVATION_DIR", "off");
  struct Case {
    std::string toml, key, says;
    bool open;
  };
  const std::vector<Case> cases = {
      {"[device]\nmemory_limit = \"12 parsecs\"\n", "device.memory_limit", "unknown unit 'parsecs'", false},
      {"[device]\nmemory_limit = \"0%\"\n", "device.memory_limit", "(0, 100]", false},
      {"[device]\nmemory_limit = \"150%\"\n", "device.memory_limit", "(0, 100]", false},
      {"[device]\nmemory_limit = \"-1GiB\"\n", "device.memory_limit", "non-negative", false},
      {"[device]\nmemory_limit = \"\"\n", "device.memory_limit", "empty", false},
      {"[device]\nmemory_limit = \"900TiB\"\n", "memory_limit = \"900TiB\"", "exceeds", true},
      {"[device]\ngrowth = \"yes\"\n", "device.growth", "", false},
      {"[device]\nfallback = \"gpu\"\n", "device.fallback", "\"cpu\"", false},
      {"[device]\nselect = \"most_free\"\n", "device.select", "most_free_memory", false},
      {"[device]\nvisible = [0, 0]\n", "device.visible", "listed twice", false},
      {"[device]\nvisible = [0, -1, 1]\n", "device.visible", "-1", false},
      {"[device]\nvisible = [7]\n", "visible lists device 7", "has 1 device(s)", true},
      {"[device]\nfault_injection_block = -2\n", "device.fault_injection_block", "1-based", false},
      {"[device]\nthreads = -1\n", "device.threads", "positive", false},
      {"[device]\nvirtual_devices = 0\n", "device.virtual_devices", "1..64", false},
      {"[device]\nmemroy_limit = \"1GiB\"\n", "device.memroy_limit", "", false},
      {"[train]\nmemory_policy = \"lenient\"\n", "train.memory_policy", "\"fit\"", false},
  };
  for (const auto& c : cases) {
    INFO(c.toml);
    std::string m = config_error(c.toml, c.open);
    CHECK_THAT(m, Catch::Contains(c.key));
    CHECK_THAT(m, Catch::Contains(c.says));
    CHECK_THAT(m, Catch::Contains("mem.toml"));
  }
  CHECK(config_error("[device]\nmemory_limit = \"60%\"\ngrowth = false\nselect = \"most_free_memory\"\n", true) == "<ok>");
  CHECK(config_error("[device]\nmemory_limit = 1048576\n[train]\nmemory_policy = \"fit\"\n", true) == "<ok>");
}

TEST_CASE("every [memory] key is validated with the key and value named", "[memory]") {
  struct Case {
    std::string toml, key, says;
  };
  const std::vector<Case> cases = {
      {"[memory]\ninplace = 1\n", "memory.inplace", ""},
      {"[memory]\nrecompute = \"some\"\n", "memory.recompute", "\"auto\""},
      {"[memory]\nrecompute = \"layers\"\n", "memory.recompute_layers", "needs the layers"},
      {"[memory]\nrecompute_layers = [\"dense_9\"]\n", "memory.recompute_layers", "\"dense_9\" is not a layer of the model; layers: \"fc\""},
      {"[memory]\nrecompute_layers = [\"fc\", \"fc\"]\n", "memory.recompute_layers", "listed twice"},
      {"[memory]\nrecompute = \"auto\"\nrecompute_layers = [\"fc\"]\n", "memory.recompute_layers", "only used with recompute = \"layers\""},
      {"[memory]\nrecompute = \"auto\"\ncheckpoint_every = 1\n", "memory.checkpoint_every", ">= 2"},
      {"[memory]\ncheckpoint_every = 3\n", "memory.checkpoint_every", "only used with recompute = \"auto\""},
      {"[memory]\nsweep_batches = [1, 0]\n", "memory.sweep_batches", "positive"},
      {"[memory]\nrecomputation = \"auto\"\n", "memory.recomputation", ""},
  };
  for (const auto& c : cases) {
    INFO(c.toml);
    std::string m = config_error(c.toml);
    CHECK_THAT(m, Catch::Contains(c.key));
    CHECK_THAT(m, Catch::Contains(c.says));
  }
  Session s(Config::load_string(kBase + "[memory]\ninplace = true\nrecompute_layers = [\"fc\"]\nsweep_batches = [1, 8]\n", "m.toml"),
            test::registry());
  CHECK(s.model().savers.inplace);
  CHECK(s.model().savers.recompute == RecomputeMode::layers);
  CHECK(s.model().savers.recompute_layers == std::vector<std::string>{"fc"});
  CHECK(s.memory_settings().sweep_batches == std::vector<int64_t>{1, 8});
  Session d(Config::load_string(kBase, "m.toml"), test::registry());
  CHECK_FALSE(d.model().savers.inplace);
  CHECK(d.model().savers.recompute == RecomputeMode::none);
}

TEST_CASE("CUDA_VISIBLE_DEVICES entries are validated instead of silently truncated", "[memory]") {
  CHECK(parse_cuda_visible_devices("0") == std::vector<std::string>{"0"});
  CHECK(parse_cuda_visible_devices("2,0,1") == std::vector<std::string>{"2", "0", "1"});
  CHECK(parse_cuda_visible_devices("GPU-8e4f2a1c-1b2d-4c3e-9f00-aabbccddeeff,1").size() == 2);
  CHECK(parse_cuda_visible_devices("MIG-GPU-8e4f2a1c/1/0").size() == 1);
  struct Case {
    std::string value, names;
  };
  const std::vector<Case> bad = {
      {"0,-1,1", "entry \"-1\""},     {"0,1,0", "entry \"0\" is listed twice"}, {"01,1", "listed twice"},
      {"0,,1", "is empty"},           {"0,", "is empty"},                       {"", "hides every GPU"},
      {"gpu0", "entry \"gpu0\""},     {"1.5", "entry \"1.5\""},                 {" 1", "entry \" 1\""},
      {"GPU-", "entry \"GPU-\""},
  };
  for (const auto& c : bad) {
    INFO("CUDA_VISIBLE_DEVICES=\"" << c.value << "\"");
    try {
      parse_cuda_visible_devices(c.value);
      FAIL("accepted");
    } catch (const ConfigError& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains(c.names));
      CHECK_THAT(std::string(e.what()), Catch::Contains("CUDA_VISIBLE_DEVICES=\"" + c.value + "\""));
    }
  }
  // Checked when the configured backend is CUDA (or "auto" with CUDA available), not for other backends.
  EnvVar bad_env("CUDA_VISIBLE_DEVICES", "0,-1");
  CHECK(config_error("[device]\nbackend = \"cpu\"\n") == "<ok>");
  if (test::registry().has_backend("cuda")) CHECK_THAT(config_error("[device]\nbackend = \"cuda\"\n"), Catch::Contains("entry \"-1\""));
}
