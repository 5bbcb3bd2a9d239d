// The "cuda" plugin's entry: descriptor + registration of the backend and the NCCL communicator.
//
// This library links no CUDA library. Everything that does (cudart, cuBLAS, cuDNN, NCCL: ~150 MiB of resident
// memory once loaded and relocated) lives in cuda/libkiln_cuda_impl.so beside it, which is loaded the first time a
// "cuda" backend or "nccl" communicator is actually created. A run on the CPU or Vulkan backend never pays for it,
// and a host whose CUDA libraries are missing still loads the plugin: its backend then lists no device and says why.
#include "kiln/plugin.hpp"

#include <dlfcn.h>

#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/error.hpp"
#include "visible_devices.hpp"

namespace kiln::cuda {

namespace {

using MakeBackend = Backend* (*)(const BackendOptions*);
using MakeNccl = Communicator* (*)(Device* const*, size_t);
using MakeNcclGroup = Communicator* (*)(Device* const*, size_t, ProcessGroup*);

struct Impl {
  std::string path, error;  // error: why it could not be loaded ("" when loaded)
  MakeBackend make_backend = nullptr;
  MakeNccl make_nccl = nullptr;
  MakeNcclGroup make_nccl_group = nullptr;
};

// Loads the runtime part once; the library stays loaded for the life of the process (the objects it makes have
// their code there).
const Impl& impl() {
  static Impl i;
  static std::once_flag once;
  std::call_once(once, [] {
    Dl_info self{};
    if (!dladdr(reinterpret_cast<void*>(&impl), &self) || !self.dli_fname) {
      i.error = "cannot find the cuda plugin's own path (dladdr failed)";
      return;
    }
    i.path = (std::filesystem::path(self.dli_fname).parent_path() / "cuda" / "libkiln_cuda_impl.so").string();
    void* h = dlopen(i.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      i.error = "the CUDA backend's runtime library " + i.path + " could not be loaded: " + (e ? e : "unknown error");
      return;
    }
    const auto register_kernels = reinterpret_cast<void (*)()>(dlsym(h, "kiln_cuda_register_kernels"));
    i.make_backend = reinterpret_cast<MakeBackend>(dlsym(h, "kiln_cuda_make_backend"));
    i.make_nccl = reinterpret_cast<MakeNccl>(dlsym(h, "kiln_cuda_make_nccl"));
    i.make_nccl_group = reinterpret_cast<MakeNcclGroup>(dlsym(h, "kiln_cuda_make_nccl_group"));
    if (!i.make_backend || !register_kernels) {
      i.error =
          i.path + " has no kiln_cuda_make_backend or kiln_cuda_register_kernels entry (a library from another build?)";
      return;
    }
    // The built-in ops' kernels live in the runtime part and join the kernel registry now, as a plugin's do when
    // it loads; a device is made only after this.
    try {
      register_kernels();
    } catch (const std::exception& e) {
      i.error = "the CUDA backend's runtime library " + i.path + " could not register its kernels: " + e.what();
    }
  });
  return i;
}

// The "cuda" backend as registered. Making it is cheap (the session makes every backend to read its [device]
// keys): the runtime part, and with it the built-in ops' kernels, is loaded on the first enumerate() or open(),
// and never when CUDA_VISIBLE_DEVICES=-1 hides every device. Without the runtime part it lists no devices and
// gives the reason.
class CudaFrontBackend final : public Backend {
 public:
  explicit CudaFrontBackend(const BackendOptions& o) : options_(o) {}
  std::string name() const override { return "cuda"; }
  int priority() const override { return 300; }
  void check_config() const override {
    if (auto v = visible_devices_env()) parse_visible_devices(*v);
  }
  std::vector<DeviceInfo> enumerate() override { return load() ? real_->enumerate() : std::vector<DeviceInfo>{}; }
  std::string unavailable_reason() const override { return real_ ? real_->unavailable_reason() : why_; }
  std::unique_ptr<Device> open(int index) override {
    if (!load()) throw DeviceError("cuda: cannot open device " + std::to_string(index) + ": " + why_);
    return real_->open(index);
  }

 private:
  // The runtime part's backend, made once; false with why_ set when there is none to make.
  bool load() {
    if (real_) return true;
    if (auto v = visible_devices_env(); v && hides_every_device(*v)) {
      why_ = "CUDA_VISIBLE_DEVICES=\"-1\" hides every CUDA device";
      return false;
    }
    const Impl& i = impl();
    if (!i.error.empty()) {
      why_ = i.error;
      return false;
    }
    real_.reset(i.make_backend(&options_));
    return true;
  }

  BackendOptions options_;
  std::unique_ptr<Backend> real_;
  std::string why_;
};

}  // namespace

const PluginDescriptor* descriptor() {
#ifdef KILN_CUDA_HAVE_NCCL
  static const char* what =
      "CUDA backend: cuBLAS GEMM, cuDNN convolutions, CUDA kernels and graphs, NCCL communicator (in one process or "
      "across MPI ranks)";
#else
  static const char* what =
      "CUDA backend: cuBLAS GEMM, cuDNN convolutions, CUDA kernels and graphs (built without NCCL)";
#endif
  static const PluginDescriptor d{"cuda", KILN_VERSION_STRING, kApiVersion, KILN_BUILD_FINGERPRINT, what};
  return &d;
}

void register_all(Registry& reg) {
  reg.add_backend("cuda", [](const BackendOptions& o) -> std::unique_ptr<Backend> {
    return std::make_unique<CudaFrontBackend>(o);
  });
#ifdef KILN_CUDA_HAVE_NCCL
  reg.add_communicator("nccl", [](std::span<Device* const> devices) -> std::unique_ptr<Communicator> {
    const Impl& i = impl();
    if (!i.error.empty()) throw Error("nccl communicator: " + i.error);
    if (!i.make_nccl) throw Error("nccl communicator: " + i.path + " was built without NCCL");
    return std::unique_ptr<Communicator>(i.make_nccl(devices.data(), devices.size()));
  });
  // Across processes: the process group (the mpi plugin) carries the NCCL unique id; this plugin never links MPI.
  reg.add_group_communicator(
      "nccl", [](std::span<Device* const> devices, ProcessGroup& group) -> std::unique_ptr<Communicator> {
        const Impl& i = impl();
        if (!i.error.empty()) throw Error("nccl communicator: " + i.error);
        if (!i.make_nccl_group)
          throw Error("nccl communicator: " + i.path + " was built without NCCL across processes (another build?)");
        return std::unique_ptr<Communicator>(i.make_nccl_group(devices.data(), devices.size(), &group));
      });
#endif
}

}  // namespace kiln::cuda

KILN_PLUGIN(kiln::cuda::descriptor, kiln::cuda::register_all)
