// Kernels keyed by (backend, op), and the ops a backend declared it cannot run.
#include "kiln/kernel_registry.hpp"

#include <map>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "kiln/op_table.hpp"

namespace kiln {
namespace {

struct Kernels {
  std::shared_mutex mu;
  std::map<std::pair<std::string, OpKind>, Kernel> table;  // node-based: pointers stay valid as it grows
  // Kernels replaced by a later registration. Every Registry registers its plugins' kernels again (a second run in
  // one process: kiln.Run in Python, the tests), and an open device keeps what find_kernel returned (the cpu
  // backend caches it per op): freeing the replaced kernel would leave that device calling freed memory.
  std::vector<Kernel> replaced;
  std::map<std::pair<std::string, OpKind>, std::string> unsupported;
};
Kernels& kernels() {
  static Kernels k;
  return k;
}

}  // namespace

void register_kernel(const std::string& backend, OpKind op, Kernel k) {
  (void)op_desc(op);  // throws for an op nothing registered
  Kernels& t = kernels();
  std::unique_lock lock(t.mu);
  auto [it, added] = t.table.try_emplace({backend, op}, k);
  if (added) return;
  t.replaced.push_back(std::move(it->second));
  it->second = std::move(k);
}

const Kernel* find_kernel(const std::string& backend, OpKind op) {
  Kernels& t = kernels();
  std::shared_lock lock(t.mu);
  auto it = t.table.find({backend, op});
  return it == t.table.end() ? nullptr : &it->second;
}

void declare_unsupported(const std::string& backend, OpKind op, std::string reason) {
  (void)op_desc(op);
  Kernels& t = kernels();
  std::unique_lock lock(t.mu);
  t.unsupported[{backend, op}] = std::move(reason);
}

std::string unsupported_reason(const std::string& backend, OpKind op) {
  Kernels& t = kernels();
  std::shared_lock lock(t.mu);
  auto it = t.unsupported.find({backend, op});
  return it == t.unsupported.end() ? std::string() : it->second;
}

std::string missing_kernel_reason(const std::string& backend, OpKind op) {
  const OpDesc& d = op_desc(op);
  if (std::string why = unsupported_reason(backend, op); !why.empty())
    return "op '" + d.name + "' is not supported by the " + backend + " backend: " + why;
  std::string others;
  Kernels& t = kernels();
  {
    std::shared_lock lock(t.mu);
    for (const auto& [key, _] : t.table)
      if (key.second == op) others += (others.empty() ? "" : ", ") + key.first;
  }
  return "op '" + d.name + "' (plugin '" + d.plugin + "') has no " + backend +
         " kernel; kernels exist for: " + (others.empty() ? "none" : others);
}

std::vector<std::string> missing_builtin_kernels(const std::string& backend) {
  std::vector<std::string> missing;
  for (size_t i = 0; i < op_count(); ++i) {
    const auto k = static_cast<OpKind>(i);
    if (op_desc(k).plugin != "core") continue;
    if (!find_kernel(backend, k) && unsupported_reason(backend, k).empty()) missing.push_back(op_desc(k).name);
  }
  return missing;
}

}  // namespace kiln
