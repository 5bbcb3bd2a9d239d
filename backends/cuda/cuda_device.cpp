#include "cuda_device.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "check.hpp"
#include "kiln/allocator.hpp"
#include "kiln/error.hpp"
#include "nvml.hpp"

namespace kiln::cuda {
namespace {

std::string format_uuid(const cudaUUID_t& id) {
  const auto* u = reinterpret_cast<const unsigned char*>(id.bytes);
  char buf[48];
  std::snprintf(buf, sizeof buf, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return buf;
}

bool env_flag(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  return std::strcmp(v, "0") != 0 && std::strcmp(v, "false") != 0 && std::strcmp(v, "off") != 0;
}

char* address(const BufferView& v) { return v.block ? static_cast<char*>(v.block->ptr) + v.offset : nullptr; }

}  // namespace

DeviceInfo describe_device(int ordinal) {
  cudaDeviceProp p{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&p, ordinal));
  DeviceInfo info;
  info.backend = "cuda";
  info.index = ordinal;
  const std::string uuid = format_uuid(p.uuid);
  info.name = std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " + uuid + ")";
  char bus[32];
  std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
  info.hardware_id = bus;
  Nvml& nvml = Nvml::instance();
  if (auto m = nvml.memory(uuid)) {  // no CUDA context on devices this process may never use
    info.total_memory = m->total;
    info.free_memory = m->free;
  } else {
    int previous = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&previous));
    KILN_CUDA_CHECK(cudaSetDevice(ordinal));
    size_t free = 0, total = 0;
    const cudaError_t e = cudaMemGetInfo(&free, &total);
    cudaSetDevice(previous);
    if (e != cudaSuccess) throw_error(Library::cuda, e, "cudaMemGetInfo(&free, &total)", __FILE__, __LINE__);
    info.total_memory = total;
    info.free_memory = free;
  }
  info.processes = nvml.processes(uuid);
  return info;
}

CudaDevice::CudaDevice(int ordinal, DeviceInfo info) : ordinal_(ordinal), info_(std::move(info)) {
  activate();
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, ordinal_));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&cc_minor_, cudaDevAttrComputeCapabilityMinor, ordinal_));
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_.reset(s);
  cublasHandle_t b = nullptr;
  KILN_CUBLAS_CHECK(cublasCreate(&b));
  cublas_.reset(b);
  KILN_CUBLAS_CHECK(cublasSetStream(cublas_.get(), s));
  cudnnHandle_t d = nullptr;
  KILN_CUDNN_CHECK(cudnnCreate(&d));
  cudnn_.reset(d);
  KILN_CUDNN_CHECK(cudnnSetStream(cudnn_.get(), s));

  tf32_ = env_flag("KILN_CUDA_TF32", false);
  graphs_enabled_ = env_flag("KILN_CUDA_GRAPHS", true);
  workspace_limit_ = std::min<size_t>(size_t{256} << 20, info_.total_memory / 16);
  if (const char* w = std::getenv("KILN_CUDA_WORKSPACE_LIMIT"); w && *w) {
    try {
      workspace_limit_ = parse_memory_size(w, info_.total_memory);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("environment variable KILN_CUDA_WORKSPACE_LIMIT: ") + e.what());
    }
  }
  size_t free = 0, total = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  info_.free_memory = free;
  info_.total_memory = total;

  for (const DeviceStateMaker& m : device_state_makers()) states_.emplace_back(m.name, m.make(*this));
  staging_ = std::make_unique<PinnedStaging>(s);
  graphs_ = std::make_unique<GraphRecorder>(s, [this](const OpCall& c, const void* scalars) { execute(c, scalars); });
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(ordinal_);  // not activate(): a destructor must not throw
  graphs_.reset();          // ends a capture left open, destroys the graphs
  cudaStreamSynchronize(stream_.get());
  if (upload_stream_) cudaStreamSynchronize(upload_stream_.get());
  cudaGetLastError();
}

void CudaDevice::activate() const { KILN_CUDA_CHECK(cudaSetDevice(ordinal_)); }

size_t CudaDevice::query_free_memory() {
  std::lock_guard lock(mu_);
  activate();
  size_t free = 0, total = 0;
  KILN_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  info_.free_memory = free;
  return free;
}

Block* CudaDevice::allocate_block(size_t bytes) {
  std::lock_guard lock(mu_);
  activate();
  graphs_->boundary();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so later calls do not report it
    return nullptr;
  }
  if (e != cudaSuccess) throw_error(Library::cuda, e, "cudaMalloc(&p, bytes)", __FILE__, __LINE__);
  return new Block{p, nullptr, bytes, next_block_id_++};
}

void CudaDevice::free_block(Block* b) noexcept {
  if (!b) return;
  std::lock_guard lock(mu_);
  try {
    activate();
    graphs_->boundary();
  } catch (const std::exception&) {
    // A broken context cannot run pending work; the memory is released below regardless.
  }
  cudaFree(b->ptr);  // synchronizes the device: nothing still uses the block afterwards
  cudaGetLastError();
  delete b;
}

void CudaDevice::do_copy_from_host(const void* src, const BufferView& dst) {
  std::lock_guard lock(mu_);
  activate();
  graphs_->boundary();
  staging_->to_device(src, address(dst), dst.bytes);
}

void CudaDevice::do_copy_to_host(const BufferView& src, void* dst) {
  std::lock_guard lock(mu_);
  activate();
  graphs_->boundary();
  staging_->to_host(address(src), dst, src.bytes);
}

void CudaDevice::do_copy_on_device(const BufferView& src, const BufferView& dst) {
  std::lock_guard lock(mu_);
  activate();
  graphs_->boundary();
  // cudaMemcpyDefault: the source may be on another CUDA device (peer copy) or in host memory (unified addressing).
  KILN_CUDA_CHECK(cudaMemcpyAsync(address(dst), address(src), src.bytes, cudaMemcpyDefault, stream_.get()));
}

void CudaDevice::synchronize() {
  std::lock_guard lock(mu_);
  activate();
  graphs_->boundary();
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  if (upload_stream_) KILN_CUDA_CHECK(cudaStreamSynchronize(upload_stream_.get()));
}

uint64_t CudaDevice::do_upload_async(const void* src, const BufferView& dst) {
  std::lock_guard lock(mu_);
  activate();
  graphs_->boundary();  // every op enqueued so far is on the op stream, so the mark below follows them
  if (!upload_stream_) {
    cudaStream_t s = nullptr;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    upload_stream_.reset(s);
    upload_staging_ = std::make_unique<PinnedStaging>(s);
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ops_mark_.reset(e);
  }
  // The destination may still be read by ops already enqueued (the step before the one this batch is for).
  KILN_CUDA_CHECK(cudaEventRecord(ops_mark_.get(), stream_.get()));
  KILN_CUDA_CHECK(cudaStreamWaitEvent(upload_stream_.get(), ops_mark_.get(), 0));
  if (dst.bytes) upload_staging_->to_device(src, address(dst), dst.bytes);
  EventHandle done;
  if (!spare_events_.empty()) {
    done = std::move(spare_events_.back());
    spare_events_.pop_back();
  } else {
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    done.reset(e);
  }
  KILN_CUDA_CHECK(cudaEventRecord(done.get(), upload_stream_.get()));
  const uint64_t ticket = next_ticket_++;
  uploads_.emplace_back(ticket, std::move(done));
  return ticket;
}

void CudaDevice::wait_upload(uint64_t ticket) {
  std::lock_guard lock(mu_);
  activate();
  graphs_->boundary();
  for (auto it = uploads_.begin(); it != uploads_.end(); ++it)
    if (it->first == ticket) {
      KILN_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), it->second.get(), 0));  // the op stream waits, not the host
      // The wait took the event's current record; recording it again for a later upload does not change that.
      spare_events_.push_back(std::move(it->second));
      uploads_.erase(it);
      return;
    }
  throw DeviceError(info_.label() + ": wait_upload: ticket " + std::to_string(ticket) +
                    " is not pending (never issued, or already waited on)");
}

void CudaDevice::begin_sequence(uint64_t step_id) {
  if (!graphs_enabled_) return;
  std::lock_guard lock(mu_);
  activate();
  graphs_->begin(step_id);
}

void CudaDevice::end_sequence() {
  if (!graphs_enabled_) return;
  std::lock_guard lock(mu_);
  activate();
  graphs_->end();
}

std::unique_lock<std::mutex> CudaDevice::lock_for_external_work() {
  std::unique_lock lock(mu_);
  activate();
  graphs_->boundary();
  return lock;
}

void* CudaDevice::extension(std::string_view name) {
  if (name == "cuda.stream") return stream_.get();
  if (name == "cuda.device") return this;
  if (name == "cuda.ordinal") return &ordinal_;
  if (name == "cuda.workspace_limit") return &workspace_limit_;
  if (name == "cuda.graph_report") {
    std::lock_guard lock(mu_);
    const auto& s = graphs_->stats();
    report_ = "graphs " + std::string(graphs_enabled_ ? "on" : "off (KILN_CUDA_GRAPHS=0)") +
              ": eager_steps=" + std::to_string(s.eager_steps) + " captures=" + std::to_string(s.captures) +
              " replays=" + std::to_string(s.replays) + " mismatches=" + std::to_string(s.mismatches) +
              " capture_failures=" + std::to_string(s.capture_failures) +
              (s.last_problem.empty() ? "" : "; last problem: " + s.last_problem);
    return report_.data();
  }
  for (const auto& [state_name, state] : states_)
    if (name == "cuda." + state_name + "_report") {
      std::lock_guard lock(mu_);
      report_ = state->report();
      return report_.data();
    }
  return nullptr;
}

}  // namespace kiln::cuda
