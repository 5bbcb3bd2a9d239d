// The CUDA plugin without a GPU: it loads, registers its backend and communicator, lists no devices with the
// driver's reason, refuses to open one, and formats library errors. With a GPU the same tests check what the
// device reports instead.
#include <dlfcn.h>

#include <regex>

#include "kiln/error.hpp"
#include "test_cuda_support.hpp"

using namespace kiln;
namespace kc = kiln::test::cuda;

TEST_CASE("cuda plugin loads and registers the cuda backend and the nccl communicator", "[cuda]") {
  if (!std::filesystem::exists(kc::plugin_path())) {
    KILN_SKIP("this build has no CUDA backend (nvcc or the CUDA toolkit was not found)");
  }
  test::registry();  // loads every plugin of the build
  const LoadedPlugin* cuda = nullptr;
  for (const auto& p : test::loader().plugins())
    if (p.path.find("libkiln_cuda.so") != std::string::npos) cuda = &p;
  REQUIRE(cuda);
  INFO("loader error: " << cuda->error);
  REQUIRE(cuda->error.empty());
  CHECK(std::string(cuda->descriptor.name) == "cuda");
  REQUIRE(test::registry().has_backend("cuda"));
  // The plugin registers "nccl" whenever it was built with NCCL, and says so in its description.
  const bool with_nccl = std::string(cuda->descriptor.description).find("NCCL communicator") != std::string::npos;
  CHECK(test::registry().has_communicator("nccl") == with_nccl);
  CHECK(test::registry().has_group_communicator("nccl") == with_nccl);  // the same, across MPI ranks
}

TEST_CASE("cuda backend without a device lists none and gives the driver's reason", "[cuda]") {
  std::string why;
  auto b = kc::backend_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(b, why);
  CHECK(b->name() == "cuda");
  const auto devices = b->enumerate();
  if (!devices.empty()) {
    // A GPU machine: what enumerate() says about each device instead.
    for (const auto& d : devices) {
      INFO(d.label() << " " << d.name << " " << d.hardware_id);
      CHECK(d.backend == "cuda");
      CHECK((d.type == DeviceType::gpu || d.type == DeviceType::integrated_gpu));
      CHECK_FALSE(d.host_addressable);
      CHECK(d.name.find("(sm_") != std::string::npos);
      CHECK(d.name.find("GPU-") != std::string::npos);  // the UUID
      CHECK(std::regex_match(d.hardware_id, std::regex("[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.0")));
      CHECK(d.total_memory > 0);
      CHECK(d.free_memory <= d.total_memory);
    }
    CHECK(b->unavailable_reason().empty());
    return;
  }
  const std::string reason = b->unavailable_reason();
  INFO("reason: " << reason);
  // "cudaGetDeviceCount: cudaErrorInsufficientDriver: CUDA driver version is insufficient ..." or similar.
  REQUIRE(reason.rfind("cudaGetDeviceCount: ", 0) == 0);
  CHECK(reason.size() > std::string("cudaGetDeviceCount: ").size() + 10);
  try {
    b->open(0);
    FAIL("open(0) succeeded without a device");
  } catch (const DeviceError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("cuda:0") != std::string::npos);
    CHECK(msg.find(reason) != std::string::npos);
  }
}

TEST_CASE("cuda backend refuses an index past the devices present", "[cuda]") {
  std::string why;
  auto b = kc::backend_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(b, why);
  CHECK_THROWS_AS(b->open(64), DeviceError);
  CHECK_THROWS_WITH(b->open(64), Catch::Contains("cuda:64"));
  CHECK_THROWS_AS(b->open(-1), DeviceError);
}

namespace {

using FormatFn = size_t (*)(const char*, int, const char*, char*, size_t);

std::string format(FormatFn f, const char* lib, int code, const char* call) {
  char buf[1024];
  const size_t n = f(lib, code, call, buf, sizeof buf);
  REQUIRE(n == std::string(buf).size());
  return buf;
}

}  // namespace

TEST_CASE("cuda error messages name the call, the library's error name and its text", "[cuda]") {
  if (!std::filesystem::exists(kc::plugin_path())) {
    KILN_SKIP("this build has no CUDA backend");
  }
  void* lib = dlopen(kc::impl_path().c_str(), RTLD_NOW | RTLD_LOCAL);
  INFO("dlopen: " << (lib ? "" : dlerror()));
  REQUIRE(lib);
  auto f = reinterpret_cast<FormatFn>(dlsym(lib, "kiln_cuda_format_error"));
  REQUIRE(f);

  const std::string oom = format(f, "cuda", 2, "cudaMalloc(&p, bytes)");  // cudaErrorMemoryAllocation
  CHECK(oom.rfind("CUDA call cudaMalloc(&p, bytes) failed: ", 0) == 0);
  CHECK_THAT(oom, Catch::Contains("cudaErrorMemoryAllocation") && Catch::Contains("out of memory"));
  CHECK_THAT(oom, Catch::Contains("[status 2]"));

  const std::string nodev = format(f, "cuda", 100, "cudaGetDeviceCount(&n)");  // cudaErrorNoDevice
  CHECK_THAT(nodev, Catch::Contains("cudaErrorNoDevice") && Catch::Contains("Hint: ") &&
                        Catch::Contains("CUDA_VISIBLE_DEVICES"));

  const std::string blas = format(f, "cublas", 7, "cublasGemmEx(...)");  // CUBLAS_STATUS_INVALID_VALUE
  CHECK(blas.rfind("cuBLAS call cublasGemmEx(...) failed: CUBLAS_STATUS_INVALID_VALUE (", 0) == 0);

  const std::string dnn = format(f, "cudnn", 2000, "cudnnConvolutionForward(...)");  // CUDNN_STATUS_BAD_PARAM
  CHECK_THAT(dnn, Catch::StartsWith("cuDNN call cudnnConvolutionForward(...) failed: CUDNN_STATUS_BAD_PARAM"));

  const std::string nccl = format(f, "nccl", 4, "ncclAllReduce(...)");  // ncclInvalidArgument
  CHECK_THAT(nccl, Catch::StartsWith("NCCL call ncclAllReduce(...) failed: ncclInvalidArgument (invalid argument"));

  CHECK(f("opencl", 1, "x", nullptr, 0) == 0);
  char small[8];
  const size_t full = f("cuda", 2, "cudaMalloc(&p, bytes)", small, sizeof small);
  CHECK(full == oom.size());
  CHECK(std::string(small) == oom.substr(0, 7));
  dlclose(lib);
}

TEST_CASE("nccl communicator refuses devices that are not CUDA devices", "[cuda]") {
  if (!test::registry().has_communicator("nccl")) {
    KILN_SKIP("this build has no NCCL communicator");
  }
  const auto& make = test::registry().communicator("nccl");
  CHECK_THROWS_WITH(make({}), Catch::Contains("no devices"));
  if (!test::registry().has_backend("cpu")) KILN_SKIP("no cpu backend in this build: the cpu half is not checked");
  auto cpu = test::registry().backend("cpu")(BackendOptions{});
  auto dev = cpu->open(0);
  Device* devs[] = {dev.get()};
  try {
    make(devs);
    FAIL("a cpu device was accepted");
  } catch (const DeviceError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("cpu:0") && Catch::Contains("not a CUDA device"));
  }
}

namespace {
// A process group in this process: rank `rank` of `replies.size()`; all_gather answers with `replies` for the other
// ranks and counts its calls. Stands in for the mpi plugin, which this test does not need.
class ScriptedGroup final : public ProcessGroup {
 public:
  ScriptedGroup(int rank, std::vector<std::string> replies) : rank_(rank), replies_(std::move(replies)) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(replies_.size()); }
  std::string host() const override { return "host-" + std::to_string(rank_); }
  std::vector<std::vector<uint8_t>> all_gather(std::span<const uint8_t> mine) override {
    ++gathers;
    std::vector<std::vector<uint8_t>> out;
    for (const auto& r : replies_) out.emplace_back(r.begin(), r.end());
    out.at(static_cast<size_t>(rank_)).assign(mine.begin(), mine.end());
    return out;
  }
  void all_reduce_sum(std::span<float>) override {}
  std::unique_ptr<Communicator> communicator(std::span<Device* const>) override { return nullptr; }
  int gathers = 0;

 private:
  int rank_;
  std::vector<std::string> replies_;
};
}  // namespace

TEST_CASE(
    "nccl across processes: a rank without CUDA devices tells the group before it stops, naming itself and its host",
    "[cuda]") {
  if (!test::registry().has_group_communicator("nccl")) {
    KILN_SKIP("this build has no NCCL communicator");
  }
  const auto& make = test::registry().group_communicator("nccl");
  {
    ScriptedGroup group(1, {"host-0\n1\ncuda:0\t0000:3b:00.0\n", ""});
    CHECK_THROWS_WITH(make({}, group), Catch::Contains("nccl communicator across 2 processes: rank 1 (host host-1)") &&
                                           Catch::Contains("no devices given"));
    CHECK(group.gathers == 1);  // the others learn it instead of waiting in their next collective
  }
  if (!test::registry().has_backend("cpu")) KILN_SKIP("no cpu backend in this build: the cpu half is not checked");
  auto cpu = test::registry().backend("cpu")(BackendOptions{});
  auto dev = cpu->open(0);
  Device* devs[] = {dev.get()};
  ScriptedGroup group(0, {"", "host-1\n1\ncuda:0\t0000:3b:00.0\n"});
  try {
    make(devs, group);
    FAIL("a cpu device was accepted");
  } catch (const DeviceError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("rank 0 (host host-0)") && Catch::Contains("cpu:0") &&
                                          Catch::Contains("not a CUDA device"));
  }
  CHECK(group.gathers == 1);
}

namespace {
std::string needed_libraries(const std::filesystem::path& lib) {  // the DT_NEEDED entries, as readelf prints them
  std::string out;
  if (FILE* p = popen(("readelf -d '" + lib.string() + "' 2>&1").c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p))
      if (std::string(buf).find("(NEEDED)") != std::string::npos) out += buf;
    pclose(p);
  }
  return out;
}
}  // namespace

TEST_CASE("the cuda plugin itself links no CUDA library, its runtime part does, and is loaded on first use", "[cuda]") {
  if (!std::filesystem::exists(kc::plugin_path())) {
    KILN_SKIP("this build has no CUDA backend");
  }
  const std::string plugin = needed_libraries(kc::plugin_path()), impl = needed_libraries(kc::impl_path());
  INFO("plugin needs:\n" << plugin << "runtime part needs:\n" << impl);
  REQUIRE_FALSE(plugin.empty());  // readelf ran
  for (const char* lib : {"libcudart", "libcublas", "libcudnn", "libnccl"})
    CHECK(plugin.find(lib) == std::string::npos);
  CHECK(impl.find("libcudart") != std::string::npos);
  CHECK(impl.find("libcudnn") != std::string::npos);
}

TEST_CASE("without its runtime part the cuda plugin still loads, lists no device and says why", "[cuda]") {
  if (!std::filesystem::exists(kc::plugin_path())) {
    KILN_SKIP("this build has no CUDA backend");
  }
  auto dir = test::temp_dir("cuda-no-impl");  // the plugin alone, without cuda/libkiln_cuda_impl.so beside it
  std::filesystem::copy_file(kc::plugin_path(), dir / "libkiln_cuda.so");
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  loader.load((dir / "libkiln_cuda.so").string(), reg);
  REQUIRE(reg.has_backend("cuda"));
  auto b = reg.backend("cuda")(BackendOptions{});
  CHECK(b->enumerate().empty());
  CHECK_THAT(b->unavailable_reason(), Catch::Contains("libkiln_cuda_impl.so could not be loaded"));
  CHECK_THROWS_WITH(b->open(0), Catch::Contains("cannot open device 0") && Catch::Contains("libkiln_cuda_impl.so"));
  if (reg.has_communicator("nccl")) {
    std::vector<Device*> none;
    CHECK_THROWS_WITH(reg.communicator("nccl")(none), Catch::Contains("could not be loaded"));
    ScriptedGroup group(0, {""});
    REQUIRE(reg.has_group_communicator("nccl"));
    CHECK_THROWS_WITH(reg.group_communicator("nccl")(none, group), Catch::Contains("could not be loaded"));
  }
}
