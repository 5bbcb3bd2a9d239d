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
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~EnvVar() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
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
  CHECK(config_error("[device]\nmemory_limit = \"60%\"\ngrowth = false\nselect = \"most_free_memory\"\n", true) ==
        "<ok>");
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
      {"[memory]\nrecompute_layers = [\"dense_9\"]\n", "memory.recompute_layers",
       "\"dense_9\" is not a layer of the model; layers: \"fc\""},
      {"[memory]\nrecompute_layers = [\"fc\", \"fc\"]\n", "memory.recompute_layers", "listed twice"},
      {"[memory]\nrecompute = \"auto\"\nrecompute_layers = [\"fc\"]\n", "memory.recompute_layers",
       "only used with recompute = \"layers\""},
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
  Session s(Config::load_string(
                kBase + "[memory]\ninplace = true\nrecompute_layers = [\"fc\"]\nsweep_batches = [1, 8]\n", "m.toml"),
            test::registry());
  CHECK(s.model().savers.inplace);
  CHECK(s.model().savers.recompute == RecomputeMode::layers);
  CHECK(s.model().savers.recompute_layers == std::vector<std::string>{"fc"});
  CHECK(s.memory_settings().sweep_batches == std::vector<int64_t>{1, 8});
  Session d(Config::load_string(kBase, "m.toml"), test::registry());
  CHECK_FALSE(d.model().savers.inplace);
  CHECK(d.model().savers.recompute == RecomputeMode::none);
}

TEST_CASE("CUDA_VISIBLE_DEVICES entries are validated instead of silently truncated", "[memory][cuda]") {
  if (!test::registry().has_backend("cuda")) KILN_SKIP("this build has no CUDA backend");
  EnvVar off("KILN_RESERVATION_DIR", "off");
  const std::string cuda = "[device]\nbackend = \"cuda\"\n";
  for (const char* good : {"0", "2,0,1", "GPU-8e4f2a1c-1b2d-4c3e-9f00-aabbccddeeff,1", "MIG-GPU-8e4f2a1c/1/0", "-1"}) {
    EnvVar env("CUDA_VISIBLE_DEVICES", good);
    INFO("CUDA_VISIBLE_DEVICES=\"" << good << "\"");
    CHECK(config_error(cuda) == "<ok>");
  }
  struct Case {
    std::string value, names;
  };
  const std::vector<Case> bad = {
      {"0,-1,1", "entry \"-1\""}, {"0,1,0", "entry \"0\" is listed twice"},
      {"01,1", "listed twice"},   {"0,,1", "is empty"},
      {"0,", "is empty"},         {"", "hides every GPU"},
      {"gpu0", "entry \"gpu0\""}, {"1.5", "entry \"1.5\""},
      {" 1", "entry \" 1\""},     {"GPU-", "entry \"GPU-\""},
      {"-1,0", "entry \"-1\""},
  };
  for (const auto& c : bad) {
    EnvVar env("CUDA_VISIBLE_DEVICES", c.value.c_str());
    INFO("CUDA_VISIBLE_DEVICES=\"" << c.value << "\"");
    const std::string m = config_error(cuda);
    CHECK_THAT(m, Catch::Contains(c.names));
    CHECK_THAT(m, Catch::Contains("CUDA_VISIBLE_DEVICES=\"" + c.value + "\""));
    CHECK_THAT(config_error("[device]\nbackend = \"auto\"\n"), Catch::Contains(c.names));
  }
  // Checked when the run may use CUDA (backend "cuda" or "auto"), not for other backends.
  EnvVar bad_env("CUDA_VISIBLE_DEVICES", "0,-1");
  CHECK(config_error("[device]\nbackend = \"cpu\"\n") == "<ok>");
}

TEST_CASE("CUDA_VISIBLE_DEVICES=-1 hides every CUDA device: auto goes on to the next backend, cuda has none",
          "[memory][cuda]") {
  if (!test::registry().has_backend("cuda")) KILN_SKIP("this build has no CUDA backend");
  EnvVar off("KILN_RESERVATION_DIR", "off");
  EnvVar env("CUDA_VISIBLE_DEVICES", "-1");
  Session a(Config::load_string(kBase + "[device]\nbackend = \"auto\"\n", "mem.toml"), test::registry());
  a.open_devices(false);
  REQUIRE(a.devices().size() == 1);
  CHECK(a.devices()[0].device->info().backend != "cuda");
  Session c(Config::load_string(kBase + "[device]\nbackend = \"cuda\"\n", "mem.toml"), test::registry());
  CHECK_THROWS_WITH(c.open_devices(false), Catch::Contains("CUDA_VISIBLE_DEVICES=\"-1\" hides every CUDA device") &&
                                               Catch::Contains("fallback"));
  Session f(Config::load_string(kBase + "[device]\nbackend = \"cuda\"\nfallback = \"cpu\"\n", "mem.toml"),
            test::registry());
  f.open_devices(false);
  REQUIRE(f.devices().size() == 1);
  CHECK(f.devices()[0].device->info().type == DeviceType::cpu);
  CHECK(f.devices()[0].device->info().host_addressable);
}

namespace {

// A backend that shows the CPU backend's devices as another kind of device, to test how "auto" chooses; it
// writes its name to `opened` when it opens one.
class DisguisedBackend final : public Backend {
 public:
  DisguisedBackend(std::string name, int priority, DeviceType type, bool host, std::shared_ptr<std::string> opened,
                   const BackendOptions& o)
      : name_(std::move(name)),
        priority_(priority),
        type_(type),
        host_(host),
        opened_(std::move(opened)),
        cpu_(test::registry().backend("cpu")(o)) {}
  std::string name() const override { return name_; }
  int priority() const override { return priority_; }
  std::vector<DeviceInfo> enumerate() override {
    auto list = cpu_->enumerate();
    for (auto& d : list) d.backend = name_, d.type = type_, d.host_addressable = host_;
    return list;
  }
  std::unique_ptr<Device> open(int index) override {
    *opened_ = name_;
    return cpu_->open(index);
  }

 private:
  std::string name_;
  int priority_;
  DeviceType type_;
  bool host_;
  std::shared_ptr<std::string> opened_;
  std::unique_ptr<Backend> cpu_;
};

}  // namespace

TEST_CASE("backend auto takes the highest-priority backend with a usable device, a CPU behind a GPU API is not one",
          "[memory]") {
  EnvVar off("KILN_RESERVATION_DIR", "off");
  EnvVar hide("CUDA_VISIBLE_DEVICES", "-1");  // a GPU of this host must not win the test
  Registry reg = test::registry();
  auto opened = std::make_shared<std::string>();
  auto add = [&](const std::string& name, int prio, DeviceType type, bool host) {
    reg.add_backend(name, [=](const BackendOptions& o) {
      return std::make_unique<DisguisedBackend>(name, prio, type, host, opened, o);
    });
  };
  auto chosen = [&](const std::string& device) {
    opened->clear();
    Session s(Config::load_string(kBase + device, "auto.toml"), reg);
    s.open_devices(false);
    return opened->empty() ? s.devices().at(0).device->info().backend : *opened;
  };
  add("emulated", 1000, DeviceType::cpu, false);  // like lavapipe: a CPU whose memory the host reaches by copies
  add("never", -1, DeviceType::gpu, false);       // below 0: auto never takes it
  const std::string auto_ = "[device]\nbackend = \"auto\"\n";
  const std::string first = chosen(auto_);
  CHECK(first != "emulated");
  CHECK(first != "never");
  add("fast_gpu", 900, DeviceType::gpu, false);
  CHECK(chosen(auto_) == "fast_gpu");
  add("host_cpu", 950, DeviceType::cpu, true);
  CHECK(chosen(auto_) == "host_cpu");  // a host CPU device of higher priority is usable
  // Named, a backend is used whatever its priority or device type.
  CHECK(chosen("[device]\nbackend = \"emulated\"\n") == "emulated");
  CHECK(chosen("[device]\nbackend = \"never\"\n") == "never");
  // Each backend reads its own [device] keys (the CPU backend: threads); a key no backend reads is rejected with
  // the nearest known one.
  CHECK(config_error("[device]\nthreads = 1\n") == "<ok>");
  CHECK_THAT(config_error("[device]\nthread = 1\n"),
             Catch::Contains("device.thread") && Catch::Contains("did you mean 'threads'"));
}

TEST_CASE("limits of logical CPU devices sharing the host's memory must fit it together", "[memory][parallel]") {
  EnvVar off("KILN_RESERVATION_DIR", "off");
  const std::string dp = "[strategy]\ntype = \"data_parallel\"\n";
  auto open = [&](const std::string& device, const std::string& strategy) {
    auto s = std::make_unique<Session>(
        Config::load_string(kBase + "[device]\nvirtual_devices = 2\n" + device + strategy, "mem.toml"),
        test::registry());
    s->open_devices(false);
    return s;
  };
  auto cpu = test::registry().backend("cpu")(BackendOptions{});
  const size_t host = cpu->enumerate().at(0).total_memory;
  // 60% on each of two devices is 120% of one memory: refused, naming the key (with its line), each device and its
  // limit, the sum and the physical total, and what would fit.
  try {
    open("memory_limit = \"60%\"\n", dp);
    FAIL("two 60% limits on one host memory were accepted");
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK_THAT(m, Catch::Contains("mem.toml:") && Catch::Contains("device.memory_limit") && Catch::Contains("\"60%\""));
    const std::string each = format_bytes(parse_memory_size("60%", host));
    CHECK_THAT(m, Catch::Contains("cpu:0 " + each + " + cpu:1 " + each));
    CHECK_THAT(m, Catch::Contains("(120% of it)"));
    CHECK_THAT(m, Catch::Contains("the host's " + format_bytes(host) + " of physical memory"));
    CHECK_THAT(m, Catch::Contains("(\"50%\") per device for 2 devices"));
  }
  // Bytes likewise: two limits of 0.6 x the host each.
  const std::string bytes = std::to_string(host / 10 * 6);
  CHECK_THROWS_WITH(open("memory_limit = " + bytes + "\n", dp),
                    Catch::Contains("device.memory_limit") && Catch::Contains("120% of it"));
  // 50% each fits exactly.
  auto half = open("memory_limit = \"50%\"\n", dp);
  REQUIRE(half->devices().size() == 2);
  CHECK(half->devices()[0].allocator->limit() + half->devices()[1].allocator->limit() <= host);
  // Without memory_limit the devices split the host's memory instead of each claiming all of it.
  auto split = open("", dp);
  REQUIRE(split->devices().size() == 2);
  CHECK(split->devices()[0].allocator->limit() == host / 2);
  CHECK(split->devices()[1].allocator->limit() == host / 2);
  // One device opened (strategy single) may take 60%: nothing shares it.
  auto single = open("memory_limit = \"60%\"\n", "");
  REQUIRE(single->devices().size() == 1);
  CHECK(single->devices()[0].allocator->limit() == parse_memory_size("60%", host));
}
