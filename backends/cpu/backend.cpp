// CpuBackend: enumerates `virtual_devices` logical devices over the host and opens them.
#include "backend.hpp"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>

#include "gemm.hpp"
#include "kiln/error.hpp"

namespace kiln::cpu {
namespace {

// "MemTotal:       24000000 kB" -> bytes; 0 when the key is absent.
size_t meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0 || line.size() <= key.size() || line[key.size()] != ':') continue;
    std::istringstream fields(line.substr(key.size() + 1));
    size_t kb = 0;
    fields >> kb;
    return kb * 1024;
  }
  return 0;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown CPU" : line.substr(start);
  }
  return "unknown CPU";
}

// Cores in this process's affinity mask (taskset, cgroup cpusets), else what the hardware reports.
int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

size_t read_available_memory() { return meminfo_bytes("MemAvailable"); }

HostInfo read_host_info() { return {cpu_model(), meminfo_bytes("MemTotal"), read_available_memory()}; }

CpuBackend::CpuBackend(const BackendOptions& opts) {
  const ConfigNode& d = opts.device;  // [device] virtual_devices, threads, winograd
  const int64_t devices = d.get_int("virtual_devices", 1);
  if (devices < 1 || devices > 64) d.fail("virtual_devices", "expected 1..64, found " + std::to_string(devices));
  const int64_t threads = d.get_int("threads", 0);
  if (threads < 0) d.fail("threads", "expected 0 (all cores) or a positive count, found " + std::to_string(threads));
  // More threads than 4 per usable core only slows the kernels down, and a typo like 100000 would try to start
  // that many threads: refused, not clamped, so the run uses what the config says.
  const int cores = usable_cores(), max_threads = std::min(1024, 4 * cores);
  if (threads > max_threads)
    d.fail("threads", "[device] threads = " + std::to_string(threads) + " is more than this host can use: at most " +
                          std::to_string(max_threads) + " (4 per usable core, " + std::to_string(cores) +
                          " cores here, and never above 1024); use threads = 0 for one thread per core");
  winograd_ = d.get_bool("winograd", true);
  devices_ = static_cast<int>(devices);
  threads_ = static_cast<int>(threads);
  // 0: the devices share the cores this process may run on, since data-parallel runs them concurrently.
  if (threads_ == 0) threads_ = std::max(1, cores / devices_);
}

std::vector<DeviceInfo> CpuBackend::enumerate() {
  const HostInfo host = read_host_info();
  std::vector<DeviceInfo> out;
  for (int i = 0; i < devices_; ++i) {
    DeviceInfo d;
    d.backend = "cpu";
    d.index = i;
    d.type = DeviceType::cpu;
    d.host_addressable = true;  // blocks are host memory
    d.name = "CPU (" + host.cpu_model;
    if (devices_ > 1) d.name += ", logical " + std::to_string(i) + " of " + std::to_string(devices_);
    d.name += ", " + std::to_string(threads_) + (threads_ == 1 ? " thread)" : " threads)");
    d.hardware_id = "host-cpu:" + std::to_string(i);
    d.total_memory = host.total_memory;
    d.free_memory = host.available_memory;
    out.push_back(std::move(d));
  }
  return out;
}

std::unique_ptr<Device> CpuBackend::open(int index) {
  auto devices = enumerate();
  if (index < 0 || index >= static_cast<int>(devices.size())) {
    std::string present;
    for (const auto& d : devices) present += (present.empty() ? "" : ", ") + d.label() + " (" + d.name + ")";
    throw DeviceError("cpu backend: no device cpu:" + std::to_string(index) + "; devices present: " + present +
                      " (raise [device] virtual_devices for more logical CPU devices)");
  }
  blas_init();
  try {
    return std::make_unique<CpuDevice>(std::move(devices[static_cast<size_t>(index)]), threads_, winograd_);
  } catch (const std::system_error& e) {  // the kernels' thread pool could not start its threads
    throw DeviceError("cpu backend: opening cpu:" + std::to_string(index) +
                      " with [device] threads = " + std::to_string(threads_) + " failed: " + e.what() +
                      "; lower [device] threads or raise the process's thread/memory limits");
  }
}

}  // namespace kiln::cpu
