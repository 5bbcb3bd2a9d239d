// The registry of ONNX mappings (each op's, registered with its op) and the helpers every mapping shares.
#include "kiln/onnx_export.hpp"

#include <cstdio>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "kiln/error.hpp"
#include "kiln/op_table.hpp"

namespace kiln {
namespace {

struct Mappings {
  std::shared_mutex mu;
  std::map<OpKind, OnnxMapping> table;  // node-based: pointers stay valid as it grows
};
Mappings& mappings() {
  static Mappings m;
  return m;
}

}  // namespace

void register_onnx_mapping(OpKind k, OnnxMapping m) {
  const OpDesc& d = op_desc(k);  // throws for an op nothing registered
  if (!m) throw Error("register_onnx_mapping: op '" + d.name + "': empty mapping");
  Mappings& t = mappings();
  std::unique_lock lock(t.mu);
  t.table.insert_or_assign(k, std::move(m));
}

const OnnxMapping* find_onnx_mapping(OpKind k) {
  Mappings& t = mappings();
  std::shared_lock lock(t.mu);
  auto it = t.table.find(k);
  return it == t.table.end() ? nullptr : &it->second;
}

std::string OnnxEmitter::constant(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "const/%.9g", static_cast<double>(v));
  return float_initializer(buf, {}, {v});
}

std::string OnnxEmitter::reshape(const std::string& from, std::vector<int64_t> dims, const std::string& to) {
  dims[0] = -1;
  add(OnnxNode{"Reshape", {from, int64s(to + "/shape", dims)}, {to}, {}});
  return to;
}

}  // namespace kiln
