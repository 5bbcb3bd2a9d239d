// Completeness of the backends built here: every op of the core's op set has a kernel on every backend, or the
// backend declared it unsupported with a reason (which supports() gives and docs/op_support.md shows).
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"
#include "test_support.hpp"

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Creates the backend (a backend may register its kernels only then: the cuda plugin loads its runtime library
// lazily) and checks that it lacks no op of the core.
void require_complete(const std::string& backend) {
  auto& reg = kiln::test::registry();
  if (!reg.has_backend(backend)) KILN_SKIP("backend " << backend << " is not built into this tree");
  std::string unavailable;
  try {
    auto b = reg.backend(backend)(kiln::BackendOptions{});
    // Enumerating loads what a backend loads lazily (the cuda plugin's runtime library, with its kernels).
    if (b->enumerate().empty()) unavailable = b->unavailable_reason();
  } catch (const kiln::Error& e) {
    KILN_SKIP("backend " << backend << " cannot be created here: " << e.what());
  }
  const std::vector<std::string> missing = kiln::missing_builtin_kernels(backend);
  // A backend whose runtime could not load registered nothing: there is nothing to check on this machine.
  if (!unavailable.empty() && missing.size() >= static_cast<size_t>(kiln::OpKind::Count_))
    KILN_SKIP("backend " << backend << " did not load its kernels here: " << unavailable);
  INFO("backend " << backend << " has no kernel and no declared reason for: " << joined(missing));
  CHECK(missing.empty());
}

}  // namespace

TEST_CASE("the cpu backend has a kernel for every op of the core", "[conformance][kernels]") {
  require_complete("cpu");
}
TEST_CASE("the vulkan backend has a kernel or a declared reason for every op of the core", "[conformance][kernels]") {
  require_complete("vulkan");
}
TEST_CASE("the cuda backend has a kernel or a declared reason for every op of the core", "[conformance][kernels]") {
  require_complete("cuda");
}

TEST_CASE("a backend without kernels lacks every op of the core until it declares them unsupported",
          "[conformance][kernels]") {
  (void)kiln::test::registry();  // the core's ops and the plugins' are registered
  const std::string b = "test_backend_without_kernels";
  std::vector<std::string> core_ops;
  for (size_t k = 0; k < kiln::op_count(); ++k)
    if (kiln::op_desc(static_cast<kiln::OpKind>(k)).plugin == "core")
      core_ops.emplace_back(kiln::op_name(static_cast<kiln::OpKind>(k)));
  REQUIRE(core_ops.size() >= static_cast<size_t>(kiln::OpKind::Count_));
  CHECK(kiln::missing_builtin_kernels(b) == core_ops);
  kiln::declare_unsupported(b, kiln::OpKind::Gemm, "no matrix unit");
  const auto after = kiln::missing_builtin_kernels(b);
  CHECK(after.size() == core_ops.size() - 1);
  CHECK(kiln::missing_kernel_reason(b, kiln::OpKind::Gemm) ==
        "op 'gemm' is not supported by the " + b + " backend: no matrix unit");
  CHECK(kiln::missing_kernel_reason(b, kiln::OpKind::Add).find("has no " + b + " kernel") != std::string::npos);
}
