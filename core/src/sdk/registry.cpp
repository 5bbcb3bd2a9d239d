// The host's registry of factories, filled by the core's built-ins and by plugins.
#include <algorithm>

#include "kiln/error.hpp"
#include "kiln/plugin.hpp"

namespace kiln {

namespace {
template <class Map>
std::vector<std::string> keys_of(const Map& m) {
  std::vector<std::string> v;
  for (const auto& [k, _] : m) v.push_back(k);
  return v;
}
template <class Map>
const typename Map::mapped_type& find_or_throw(const Map& m, const std::string& name, const char* what) {
  auto it = m.find(name);
  if (it != m.end()) return it->second;
  std::string known;
  for (const auto& [k, _] : m) known += (known.empty() ? "" : ", ") + k;
  throw ConfigError(std::string("unknown ") + what + " '" + name +
                    "'; registered: " + (known.empty() ? "none (is its plugin loaded? see `kiln plugins`)" : known));
}
}  // namespace

void Registry::note(const std::string& what) { provided_[current_].push_back(what); }

void Registry::add_backend(const std::string& name, std::function<std::unique_ptr<Backend>(const BackendOptions&)> f) {
  backends_[name] = std::move(f);
  note("backend " + name);
}
void Registry::add_layer(const std::string& type, LayerFactory f) {
  layers_[type] = std::move(f);
  note("layer " + type);
}
void Registry::add_strategy(const std::string& type, StrategyFactory f) {
  strategies_[type] = std::move(f);
  note("strategy " + type);
}
void Registry::add_stage(const std::string& type, StageFactory f) {
  stages_[type] = std::move(f);
  note("stage " + type);
}
void Registry::add_communicator(const std::string& name, CommunicatorFactory f) {
  communicators_[name] = std::move(f);
  note("communicator " + name);
}
void Registry::add_process_group(const std::string& name, ProcessGroupFactory f) {
  process_groups_[name] = std::move(f);
  note("process group " + name);
}
void Registry::add_group_communicator(const std::string& name, GroupCommunicatorFactory f) {
  group_communicators_[name] = std::move(f);
  note("communicator " + name + " across processes");
}

OpKind Registry::add_op(OpDesc d) {
  d.plugin = current_;
  const std::string name = d.name;
  OpKind k = register_op(std::move(d));
  note("op " + name);
  return k;
}
void Registry::add_kernel(const std::string& backend, OpKind op, Kernel k) {
  register_kernel(backend, op, std::move(k));
  // A backend's kernels for the core's own ops are what makes it a backend; `kiln plugins` lists the others.
  if (op_desc(op).plugin != "core") note("kernel " + std::string(op_name(op)) + " for " + backend);
}

void Registry::add_unsupported(const std::string& backend, OpKind op, std::string reason) {
  declare_unsupported(backend, op, std::move(reason));
}

namespace {
std::vector<std::pair<std::string, LayerFactory>>& core_layers() {
  static std::vector<std::pair<std::string, LayerFactory>> v;
  return v;
}
}  // namespace

void add_core_layer(std::string type, LayerFactory f) { core_layers().emplace_back(std::move(type), std::move(f)); }

const std::function<std::unique_ptr<Backend>(const BackendOptions&)>& Registry::backend(const std::string& n) const {
  return find_or_throw(backends_, n, "backend");
}
const LayerFactory& Registry::layer(const std::string& t) const { return find_or_throw(layers_, t, "layer type"); }
const StrategyFactory& Registry::strategy(const std::string& t) const {
  return find_or_throw(strategies_, t, "strategy type");
}
const StageFactory& Registry::stage(const std::string& t) const { return find_or_throw(stages_, t, "data stage type"); }
const CommunicatorFactory& Registry::communicator(const std::string& n) const {
  return find_or_throw(communicators_, n, "communicator");
}
const ProcessGroupFactory& Registry::process_group(const std::string& n) const {
  return find_or_throw(process_groups_, n, "process group");
}
const GroupCommunicatorFactory& Registry::group_communicator(const std::string& n) const {
  return find_or_throw(group_communicators_, n, "communicator across processes");
}
std::vector<std::string> Registry::backend_names() const { return keys_of(backends_); }
std::vector<std::string> Registry::layer_names() const { return keys_of(layers_); }
std::vector<std::string> Registry::stage_names() const { return keys_of(stages_); }
std::vector<std::string> Registry::strategy_names() const { return keys_of(strategies_); }

void register_builtin_strategies(Registry& reg);  // strategy_single.cpp

Registry Registry::with_builtins() {
  Registry r;
  r.set_current_plugin("core");
  check_builtin_ops();
  // By name: core_layers() fills in the order libkiln_core's files happen to be initialized (link order), which
  // `kiln plugins` would otherwise show.
  std::vector<std::pair<std::string, LayerFactory>> layers = core_layers();
  std::sort(layers.begin(), layers.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [type, f] : layers) r.add_layer(type, f);
  register_builtin_strategies(r);
  return r;
}

}  // namespace kiln
