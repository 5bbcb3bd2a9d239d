// Plugins' kernels, keyed by (backend, op).
#include "kiln/kernel_registry.hpp"

#include <map>
#include <mutex>
#include <shared_mutex>

#include "kiln/op_table.hpp"

namespace kiln {
namespace {

struct Kernels {
  std::shared_mutex mu;
  std::map<std::pair<std::string, OpKind>, Kernel> table;  // node-based: pointers stay valid as it grows
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
  t.table[{backend, op}] = std::move(k);
}

const Kernel* find_kernel(const std::string& backend, OpKind op) {
  Kernels& t = kernels();
  std::shared_lock lock(t.mu);
  auto it = t.table.find({backend, op});
  return it == t.table.end() ? nullptr : &it->second;
}

std::string missing_kernel_reason(const std::string& backend, OpKind op) {
  const OpDesc& d = op_desc(op);
  std::string others;
  Kernels& t = kernels();
  {
    std::shared_lock lock(t.mu);
    for (const auto& [key, _] : t.table)
      if (key.second == op) others += (others.empty() ? "" : ", ") + key.first;
  }
  return "op '" + d.name + "' (plugin '" + d.plugin + "') has no " + backend + " kernel; kernels exist for: " +
         (others.empty() ? "none" : others);
}

}  // namespace kiln
