// The checks every device shares, written once in the core (Device, device.hpp): the copies' views and sizes,
// copy_on_device's overlap rule, and the reason an op cannot run. Each contract runs on every backend of this build
// that has a device here (cpu; vulkan through lavapipe; cuda where a GPU is present, else skipped), so a backend
// that answered differently (a larger destination, an overlapping copy, its own wording) fails here.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

constexpr size_t kBlockBytes = 256;

// A raw block of the device, freed at the end of the scope.
struct RawBlock {
  Device& d;
  Block* b;
  explicit RawBlock(Device& dev, size_t bytes = kBlockBytes) : d(dev), b(dev.allocate_block(bytes)) { REQUIRE(b); }
  ~RawBlock() { d.free_block(b); }
  RawBlock(const RawBlock&) = delete;
  RawBlock& operator=(const RawBlock&) = delete;
  BufferView view(size_t offset, size_t bytes) const { return BufferView{b, offset, bytes}; }
  BufferView all() const { return view(0, b->bytes); }
};

std::vector<float> ramp(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

std::vector<float> download(Device& d, const BufferView& v) {
  std::vector<float> out(v.bytes / sizeof(float));
  d.copy_to_host(v, out.data());
  return out;
}

// Runs `check` on device 0 of `backend`, or skips the test case saying why there is none here.
void on_backend(const std::string& backend, const std::function<void(Device&)>& check) {
  if (!test::registry().has_backend(backend)) KILN_SKIP("the " << backend << " backend is not built in this tree");
  auto b = test::registry().backend(backend)(BackendOptions{});
  if (b->enumerate().empty()) KILN_SKIP("no " << backend << " device: " << b->unavailable_reason());
  auto d = b->open(0);
  INFO("device " << d->info().label() << " (" << d->info().name << ")");
  check(*d);
  d->synchronize();
}

// One test case per backend, so a backend without a device here skips alone.
#define KILN_DEVICE_CONTRACT(name, fn)                                          \
  TEST_CASE(name " (cpu)", "[device][cpu]") { on_backend("cpu", fn); }          \
  TEST_CASE(name " (vulkan)", "[device][vulkan]") { on_backend("vulkan", fn); } \
  TEST_CASE(name " (cuda, skipped without a CUDA device)", "[device][cuda]") { on_backend("cuda", fn); }

// The message every device gives for a view that breaks the copies' contract.
Catch::Matchers::StdString::ContainsMatcher names(const Device& d, const std::string& fn, const std::string& what) {
  return Catch::Contains(d.info().label() + " " + fn + ": " + what);
}

// Old behaviour this catches: the Vulkan backend copied into the front of a larger destination.
void equal_sizes(Device& d) {
  RawBlock a(d), b(d);
  const std::vector<float> src = ramp(kBlockBytes / 4, 1.f), sentinel(kBlockBytes / 4, -7.f);
  d.copy_from_host(src.data(), a.all());
  d.copy_from_host(sentinel.data(), b.all());
  CHECK_THROWS_WITH(d.copy_on_device(a.view(0, 64), b.view(0, 128)),
                    names(d, "copy_on_device", "source has 64 bytes, destination 128 (sizes must be equal)"));
  CHECK_THROWS_AS(d.copy_on_device(a.view(0, 128), b.view(0, 64)), DeviceError);
  CHECK(download(d, b.all()) == sentinel);  // a refused copy wrote nothing
  d.copy_on_device(a.view(0, 64), b.view(64, 64));
  const std::vector<float> got = download(d, b.all());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("float " << i);
    CHECK(got[i] == (i >= 16 && i < 32 ? src[i - 16] : -7.f));
  }
}
KILN_DEVICE_CONTRACT("copy_on_device requires equal sizes: a larger destination is refused like a smaller one",
                     equal_sizes)

// Old behaviour this catches: the CPU backend copied overlapping views (memmove); CUDA's cudaMemcpyAsync was handed
// them too.
void overlap(Device& d) {
  RawBlock a(d);
  const std::vector<float> src = ramp(kBlockBytes / 4, 1.f);
  d.copy_from_host(src.data(), a.all());
  CHECK_THROWS_WITH(
      d.copy_on_device(a.view(0, 128), a.view(64, 128)),
      names(d, "copy_on_device", "source (128 bytes at offset 0) and destination (128 bytes at offset 64) overlap"));
  CHECK_THROWS_AS(d.copy_on_device(a.view(64, 128), a.view(0, 128)), DeviceError);
  CHECK_THROWS_AS(d.copy_on_device(a.view(0, 128), a.view(4, 128)), DeviceError);
  CHECK(download(d, a.all()) == src);
  d.copy_on_device(a.view(32, 128), a.view(32, 128));  // a view onto itself: nothing to do
  CHECK(download(d, a.all()) == src);
  d.copy_on_device(a.view(0, 128), a.view(128, 128));  // adjacent, not overlapping
  const std::vector<float> got = download(d, a.all());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("float " << i);
    CHECK(got[i] == src[i % 32]);
  }
}
KILN_DEVICE_CONTRACT("copy_on_device refuses overlapping views and does nothing for a view onto itself", overlap)

// Old behaviour this catches: each backend worded its own refusal ("destination range is outside its block",
// "overruns its block", "runs past its block"; a missing block was "is not memory of" on Vulkan).
void outside_block(Device& d) {
  RawBlock a(d), b(d);
  std::vector<float> host(64, 1.f);
  const BufferView past = a.view(200, 64), none{nullptr, 0, 16};
  const std::string outside = "(64 bytes at offset 200) is outside its block of 256 bytes";
  CHECK_THROWS_WITH(d.copy_from_host(host.data(), past), names(d, "copy_from_host", "destination " + outside));
  CHECK_THROWS_WITH(d.copy_to_host(past, host.data()), names(d, "copy_to_host", "source " + outside));
  CHECK_THROWS_WITH(d.copy_on_device(past, b.view(0, 64)), names(d, "copy_on_device", "source " + outside));
  CHECK_THROWS_WITH(d.copy_on_device(b.view(0, 64), past), names(d, "copy_on_device", "destination " + outside));
  CHECK_THROWS_WITH(d.upload_async(host.data(), past), names(d, "upload_async", "destination " + outside));
  CHECK_THROWS_WITH(d.copy_from_host(host.data(), none),
                    names(d, "copy_from_host", "destination of 16 bytes has no block"));
  CHECK_THROWS_WITH(d.copy_to_host(none, host.data()), names(d, "copy_to_host", "source of 16 bytes has no block"));
  CHECK_THROWS_WITH(d.copy_on_device(none, b.view(0, 16)),
                    names(d, "copy_on_device", "source of 16 bytes has no block"));
  CHECK_THROWS_WITH(d.upload_async(host.data(), none),
                    names(d, "upload_async", "destination of 16 bytes has no block"));
  // Up to the block's last byte is inside it; a copy of 0 bytes needs no block and does nothing.
  const std::vector<float> tail = ramp(16, 5.f);
  d.copy_from_host(tail.data(), a.view(192, 64));
  const BufferView empty{nullptr, 0, 0};
  d.copy_from_host(nullptr, empty);
  d.copy_to_host(empty, nullptr);
  d.copy_on_device(empty, empty);
  d.copy_on_device(a.view(256, 0), b.view(0, 0));
  d.wait_upload(d.upload_async(nullptr, empty));  // still a ticket to wait on
  CHECK(download(d, a.view(192, 64)) == tail);
}
KILN_DEVICE_CONTRACT("copies refuse a view outside its block or without one, in the same words on every backend",
                     outside_block)

// Old behaviour this catches: offset + bytes wrapped around and passed every backend's range check (the copy then
// wrote through a wild address); a null host pointer went to memcpy or the staging copy.
void wrapped_range_and_null_pointer(Device& d) {
  RawBlock a(d);
  std::vector<float> host(4, 1.f);
  const BufferView wraps = a.view(std::numeric_limits<size_t>::max() - 7, 16);
  CHECK_THROWS_WITH(d.copy_from_host(host.data(), wraps),
                    names(d, "copy_from_host", "destination") && Catch::Contains("is outside its block of 256 bytes"));
  CHECK_THROWS_AS(d.copy_to_host(wraps, host.data()), DeviceError);
  CHECK_THROWS_AS(d.copy_on_device(wraps, a.view(0, 16)), DeviceError);
  CHECK_THROWS_AS(d.upload_async(host.data(), wraps), DeviceError);
  CHECK_THROWS_WITH(d.copy_from_host(nullptr, a.view(0, 16)),
                    names(d, "copy_from_host", "source is a null host pointer for 16 bytes"));
  CHECK_THROWS_WITH(d.copy_to_host(a.view(0, 16), nullptr),
                    names(d, "copy_to_host", "destination is a null host pointer for 16 bytes"));
  CHECK_THROWS_AS(d.upload_async(nullptr, a.view(0, 16)), DeviceError);
}
KILN_DEVICE_CONTRACT("copies refuse a range whose end wraps around and a null host pointer",
                     wrapped_range_and_null_pointer)

// A plugin's op, y = 2x, that no backend built here has a kernel for.
OpKind op_without_kernel() {
  static const OpKind k = [] {
    OpDesc d;
    d.name = "test_device_checks_without_kernel";
    d.plugin = "test_device_checks";
    d.attrs_index = OpAttrs(CustomAttrs{}).index();
    d.arity = [](const OpAttrs& a) -> OpArity {
      const int64_t n = std::get<CustomAttrs>(a).ints.at(0);
      return {{n}, {n}};
    };
    d.reference = [](const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
      for (int64_t i = 0; i < std::get<CustomAttrs>(a).ints[0]; ++i) out[0][i] = 2.f * in[0][i];
    };
    (void)test::registry();  // the built-in ops and the plugins' kernels first
    const OpKind kind = register_op(d);
    register_kernel("test_device_checks_elsewhere", kind, HostKernel{[](const OpCall&) {}});
    return kind;
  }();
  return k;
}

// A plugin's op whose kernel on every backend here is of a kind no backend runs.
struct ForeignKernel {
  int unused = 0;
};
OpKind op_with_foreign_kernel() {
  static const OpKind k = [] {
    OpDesc d = op_desc(op_without_kernel());
    d.name = "test_device_checks_foreign_kernel";
    const OpKind kind = register_op(d);
    for (const char* backend : {"cpu", "vulkan", "cuda"}) register_kernel(backend, kind, ForeignKernel{});
    return kind;
  }();
  return k;
}

// Old behaviour this catches: the Vulkan backend's run() said "vulkan: op ..." where the others said "vulkan:0: op
// ...", and an unknown kind escaped its run() as a plain Error from the op table; a kernel of a kind the backend
// does not run was reported as no kernel at all ("kernels exist for: <this backend>").
void missing_kernel(Device& d) {
  const std::string backend = d.info().backend;
  const OpKind k = op_without_kernel();
  RawBlock a(d);
  const OpCall call{k, CustomAttrs{{4}, {}}, {a.view(0, 16)}, {a.view(16, 16)}, {}};
  const Support s = d.supports(k, call.attrs);
  CHECK_FALSE(s.yes);
  CHECK(s.reason == missing_kernel_reason(backend, k));
  CHECK_THAT(s.reason,
             Catch::Contains("has no " + backend + " kernel; kernels exist for: test_device_checks_elsewhere"));
  CHECK_THROWS_AS(d.run(call), DeviceError);
  CHECK_THROWS_WITH(d.run(call), d.info().label() + ": " + s.reason);

  const OpKind foreign = op_with_foreign_kernel();
  const Support f = d.supports(foreign, call.attrs);
  CHECK_FALSE(f.yes);
  CHECK_THAT(f.reason, Catch::Contains("op 'test_device_checks_foreign_kernel' (plugin 'test_device_checks') has a " +
                                       backend + " kernel of a kind this backend does not run"));
  OpCall fc = call;
  fc.kind = foreign;
  CHECK_THROWS_WITH(d.run(fc), d.info().label() + ": " + f.reason);

  const auto unknown = static_cast<OpKind>(0xFFF0);
  CHECK(d.supports(unknown, ElementwiseAttrs{4}).reason == "unknown op kind 65520");
  OpCall uc = call;
  uc.kind = unknown;
  CHECK_THROWS_AS(d.run(uc), DeviceError);
  CHECK_THROWS_WITH(d.run(uc), d.info().label() + ": unknown op kind 65520");
}
KILN_DEVICE_CONTRACT("supports and run give one reason for an op the device has no kernel for", missing_kernel)

// A plugin's op whose attributes make a negative buffer size.
OpKind op_with_negative_size() {
  static const OpKind k = [] {
    OpDesc d = op_desc(op_without_kernel());
    d.name = "test_device_checks_negative_size";
    d.arity = [](const OpAttrs& a) -> OpArity { return {{std::get<CustomAttrs>(a).ints.at(0)}, {4}}; };
    return register_op(d);  // no kernel anywhere: the attributes are refused before a kernel is looked for
  }();
  return k;
}

// Old behaviour this catches: the CPU backend handed the attributes to its kernel unchecked (a gemm with
// elementwise attributes threw std::bad_variant_access out of supports()); CUDA checked the sizes of built-in ops
// only, and no backend looked at a plugin's op before looking for its kernel.
void attributes(Device& d) {
  const Support wrong = d.supports(OpKind::Gemm, ElementwiseAttrs{4});
  CHECK_FALSE(wrong.yes);
  CHECK_THAT(wrong.reason, Catch::Contains("gemm") && Catch::Contains("expected attributes"));
  const Support negative = d.supports(op_with_negative_size(), CustomAttrs{{-3}, {}});
  CHECK_FALSE(negative.yes);
  CHECK(
      negative.reason ==
      "op 'test_device_checks_negative_size' (plugin 'test_device_checks'): input 0 has a negative size of -3 floats");
  const Support bad_arity = d.supports(op_with_negative_size(), CustomAttrs{});  // ints.at(0) throws
  CHECK_FALSE(bad_arity.yes);
  CHECK(d.supports(OpKind::Gemm, GemmAttrs{2, 3, 4}).yes);
}
KILN_DEVICE_CONTRACT("supports refuses attributes that do not fit the op before asking for a kernel", attributes)

}  // namespace
