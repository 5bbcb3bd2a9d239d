// The conformance case table: the cases every op brings in its descriptor (OpDesc::cases), built-in ops and
// plugins' alike, so an op's cases live with the op (a built-in family's in core/ops/<family>.cpp).
#include <string>
#include <vector>

#include "conformance_impl.hpp"
#include "kiln/op_table.hpp"

namespace kiln::conformance {

std::vector<OpCase> all_cases() {
  std::vector<OpCase> all;
  for (size_t k = 0; k < op_count(); ++k) {
    const OpDesc& d = op_desc(static_cast<OpKind>(k));
    if (!d.cases) continue;
    for (OpCase c : d.cases()) {
      c.kind = static_cast<OpKind>(k);
      if (c.id.rfind(d.name + "/", 0) != 0) c.id = d.name + "/" + c.id;
      all.push_back(std::move(c));
    }
  }
  return all;
}

}  // namespace kiln::conformance
