// Plugins: shared libraries that register factories in the host's Registry.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/data.hpp"
#include "kiln/device.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/layer.hpp"
#include "kiln/op_table.hpp"
#include "kiln/strategy.hpp"

namespace kiln {

// Bumped on any change of a public interface a plugin compiles against.
inline constexpr int kApiVersion =
    12;  // 2: the op table (custom ops and kernels, CustomAttrs); 3: LayerNormAttrs, gelu/silu, LossAttrs::soft_labels,
         // StageContext::pipeline; 4: BatchedGemm, Permute (PermuteAttrs), SoftmaxAttrs::causal, GemmAttrs::batch; 5:
         // BatchNormAttrs, TensorRole::buffer, SumSquares, ClipByGlobalNorm; 6: ProcessGroup, Strategy::process_group,
         // Registry::add_process_group, Stage::label_names, GroupCommunicatorFactory, Registry::add_group_communicator;
         // 7: BatchNormAttrs::sync, Executor::write, the kRunFused device extension (FusedRunner); 8: Device's copies,
         // upload_async, supports and run are checked once in the core and call the backend's protected
         // do_copy_from_host, do_copy_to_host, do_copy_on_device, do_upload_async, runs_kernel, do_supports and do_run;
         // 9: mixed precision: BufferView::dtype, TensorInfo::dtype, OpKind::Cast (CastAttrs), OpDesc::low_precision
         // and f32_outputs, GradContext::dtype/new_tensor(shape, type); 10: Stage::random_access/at/reading,
         // StageStats::bytes_read, StageContext::decoded_budget/rows_begin/rows_end, the optimizer attributes'
         // lr_scale; 11: Stage::fill, Runner::host_view; 12: Stage::recycle
#ifndef KILN_VERSION_STRING
#define KILN_VERSION_STRING "0.1.0"
#endif
// Compiler and standard library of this build: a plugin built differently is refused.
#define KILN_BUILD_FINGERPRINT_STR2(x) #x
#define KILN_BUILD_FINGERPRINT_STR(x) KILN_BUILD_FINGERPRINT_STR2(x)
#if defined(__clang__)
#define KILN_BUILD_FINGERPRINT \
  "clang-" KILN_BUILD_FINGERPRINT_STR(__clang_major__) "/libstdc++" KILN_BUILD_FINGERPRINT_STR(_GLIBCXX_RELEASE)
#elif defined(__GNUC__)
#define KILN_BUILD_FINGERPRINT \
  "gcc-" KILN_BUILD_FINGERPRINT_STR(__GNUC__) "/libstdc++" KILN_BUILD_FINGERPRINT_STR(_GLIBCXX_RELEASE)
#else
#define KILN_BUILD_FINGERPRINT "unknown"
#endif

struct PluginDescriptor {
  const char* name;
  const char* version;
  int api_version;
  const char* fingerprint;
  const char* description;
};

// Where factories live. The host owns it; plugins add to it from their entry point.
class Registry {
 public:
  void add_backend(const std::string& name, std::function<std::unique_ptr<Backend>(const BackendOptions&)> f);
  void add_layer(const std::string& type, LayerFactory f);
  void add_strategy(const std::string& type, StrategyFactory f);
  void add_stage(const std::string& type, StageFactory f);
  void add_communicator(const std::string& name, CommunicatorFactory f);
  // A group of processes (MPI) that a strategy's `communicator` or `process_group` key may name.
  void add_process_group(const std::string& name, ProcessGroupFactory f);
  // A communicator that spans the processes of any process group by itself (NCCL across MPI ranks), for a strategy
  // whose `communicator` names it together with a `process_group`.
  void add_group_communicator(const std::string& name, GroupCommunicatorFactory f);
  // A plugin's own op (op_table.hpp): returns its kind for layers and gradient rules to emit. The descriptor's
  // `plugin` is set to the registering plugin. Throws Error for a name taken by another plugin or a built-in.
  OpKind add_op(OpDesc d);
  // A kernel for an op on one backend (a kind that backend runs: HostKernel for "cpu", ShaderKernel for "vulkan",
  // StreamKernel for "cuda", or the backend's own).
  void add_kernel(const std::string& backend, OpKind op, Kernel k);
  // `backend` cannot run `op` at all, for this reason (kernel_registry.hpp declare_unsupported).
  void add_unsupported(const std::string& backend, OpKind op, std::string reason);

  // Lookups throw ConfigError listing what is registered when `name` is unknown.
  const std::function<std::unique_ptr<Backend>(const BackendOptions&)>& backend(const std::string& name) const;
  const LayerFactory& layer(const std::string& type) const;
  const StrategyFactory& strategy(const std::string& type) const;
  const StageFactory& stage(const std::string& type) const;
  const CommunicatorFactory& communicator(const std::string& name) const;
  bool has_communicator(const std::string& n) const { return communicators_.count(n) != 0; }
  const ProcessGroupFactory& process_group(const std::string& name) const;
  bool has_process_group(const std::string& n) const { return process_groups_.count(n) != 0; }
  const GroupCommunicatorFactory& group_communicator(const std::string& name) const;
  bool has_group_communicator(const std::string& n) const { return group_communicators_.count(n) != 0; }
  bool has_backend(const std::string& n) const { return backends_.count(n) != 0; }
  bool has_layer(const std::string& n) const { return layers_.count(n) != 0; }
  bool has_stage(const std::string& n) const { return stages_.count(n) != 0; }
  bool has_strategy(const std::string& n) const { return strategies_.count(n) != 0; }
  std::vector<std::string> backend_names() const;
  std::vector<std::string> layer_names() const;
  std::vector<std::string> stage_names() const;
  std::vector<std::string> strategy_names() const;

  // The plugin currently registering (for "what each provides" in `kiln plugins`).
  void set_current_plugin(const std::string& p) { current_ = p; }
  const std::map<std::string, std::vector<std::string>>& provided() const { return provided_; }

  // The registry with the core's built-in layers and the `single` strategy.
  static Registry with_builtins();

 private:
  void note(const std::string& what);
  std::map<std::string, std::function<std::unique_ptr<Backend>(const BackendOptions&)>> backends_;
  std::map<std::string, LayerFactory> layers_;
  std::map<std::string, StrategyFactory> strategies_;
  std::map<std::string, StageFactory> stages_;
  std::map<std::string, CommunicatorFactory> communicators_;
  std::map<std::string, ProcessGroupFactory> process_groups_;
  std::map<std::string, GroupCommunicatorFactory> group_communicators_;
  std::string current_ = "core";
  std::map<std::string, std::vector<std::string>> provided_;
};

// A layer of the core, registered when libkiln_core loads from the file of its op family (KILN_CORE_OPS; flatten,
// which emits no op, from core/src/model/layers.cpp); Registry::with_builtins() adds every one, by name.
void add_core_layer(std::string type, LayerFactory f);

// The one symbol a plugin exports. Use KILN_PLUGIN(desc, register_fn) in exactly one source file.
struct PluginEntry {
  const PluginDescriptor* (*descriptor)();
  void (*register_all)(Registry&);
};

}  // namespace kiln

#include <boost/dll/alias.hpp>

// Defines the plugin's exported entry `kiln_plugin` (Boost.DLL alias).
#define KILN_PLUGIN(DESCRIPTOR_FN, REGISTER_FN)                                            \
  namespace kiln_plugin_entry_ns {                                                         \
  extern "C" const ::kiln::PluginEntry kiln_plugin_entry_v = {DESCRIPTOR_FN, REGISTER_FN}; \
  }                                                                                        \
  BOOST_DLL_ALIAS(kiln_plugin_entry_ns::kiln_plugin_entry_v, kiln_plugin)
