// The conformance suite's 16-bit cases (OpCase::in_dtype/out_dtype and the bf16/f16 variants of every op's cases):
// the cpu backend passes them, and host devices with 16-bit defects fail them: one that reads 16-bit bytes as
// float32, one that accumulates a matrix product in bfloat16, one that leaves a 16-bit element unwritten or
// writes past a 16-bit buffer. A device that refuses a type gets its cases reported unsupported, with its reason.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>

#include "kiln/conformance.hpp"
#include "kiln/half.hpp"
#include "kiln/op_table.hpp"
#include "kiln/reference.hpp"
#include "test_support.hpp"

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool is_16bit(const std::string& id) { return ends_with(id, ".bf16") || ends_with(id, ".f16"); }

enum class Flaw { none, reads_as_f32, bf16_accumulation, unwritten, past_the_end, float32_only };

// A host device that runs the reference on float32 copies of its buffers and rounds the results into them (what a
// converting backend does), except for its flaw.
class HalfDevice final : public kiln::Device {
 public:
  explicit HalfDevice(Flaw f) : flaw_(f) {
    info_.backend = "half16";
    info_.name = "host device for 16-bit storage";
    info_.hardware_id = "test";
    info_.total_memory = info_.free_memory = size_t(1) << 30;
    for (size_t k = 0; k < kiln::op_count(); ++k)
      if (!kiln::find_kernel("half16", static_cast<kiln::OpKind>(k)))
        kiln::register_kernel("half16", static_cast<kiln::OpKind>(k), kiln::HostKernel{});
  }
  const kiln::DeviceInfo& info() const override { return info_; }
  kiln::Support supports_dtype(kiln::DType t) const override {
    if (flaw_ == Flaw::float32_only) return Device::supports_dtype(t);
    return {};
  }
  kiln::Block* allocate_block(size_t bytes) override {
    if (bytes > (size_t(1) << 40)) return nullptr;
    // Twice the bytes asked for: the flaw that takes 16-bit buffers as float32 reads and writes twice their size,
    // which the suite must see in its guard words rather than as a write past this heap block.
    return new kiln::Block{new char[2 * bytes + 64](), nullptr, bytes, ++ids_};
  }
  void free_block(kiln::Block* b) noexcept override {
    delete[] static_cast<char*>(b->ptr);
    delete b;
  }
  void synchronize() override {}

 protected:
  void do_copy_from_host(const void* src, const kiln::BufferView& dst) override {
    std::memcpy(dst.raw(), src, dst.bytes);
  }
  void do_copy_to_host(const kiln::BufferView& src, void* dst) override { std::memcpy(dst, src.raw(), src.bytes); }
  void do_copy_on_device(const kiln::BufferView& src, const kiln::BufferView& dst) override {
    std::memcpy(dst.raw(), src.raw(), src.bytes);
  }
  bool runs_kernel(const kiln::Kernel& k) const override { return k.get<kiln::HostKernel>() != nullptr; }
  kiln::Support do_supports(kiln::OpKind, const kiln::OpAttrs&, const kiln::OpArity&,
                            const kiln::Kernel&) const override {
    return {};
  }
  bool do_run(const kiln::OpCall& c) override {
    const kiln::OpArity ar = kiln::op_arity(c.kind, c.attrs);
    if (flaw_ == Flaw::reads_as_f32) {  // every buffer taken as float32, whatever it holds
      std::vector<const float*> in;
      std::vector<float*> out;
      for (const auto& v : c.in) in.push_back(v.host());
      for (const auto& v : c.out) out.push_back(v.host());
      kiln::reference_op(c.kind, c.attrs, in, out);
      return true;
    }
    // float32 copies, one per distinct buffer (an output written in place shares its input's).
    std::map<std::pair<const void*, size_t>, std::vector<float>> copies;
    auto copy_of = [&](const kiln::BufferView& v, int64_t n) -> std::vector<float>& {
      auto [it, fresh] = copies.try_emplace({v.block, v.offset});
      if (fresh) {
        it->second.resize(static_cast<size_t>(n));
        if (v.block) kiln::to_float(v.raw(), v.dtype, it->second.data(), it->second.size());
      }
      return it->second;
    };
    std::vector<const float*> in;
    std::vector<float*> out;
    for (size_t i = 0; i < c.in.size(); ++i) in.push_back(copy_of(c.in[i], ar.in[i]).data());
    for (size_t o = 0; o < c.out.size(); ++o) out.push_back(copy_of(c.out[o], ar.out[o]).data());
    if (flaw_ == Flaw::bf16_accumulation && c.kind == kiln::OpKind::Gemm)
      gemm_in_bf16(std::get<kiln::GemmAttrs>(c.attrs), in[0], in[1], out[0]);
    else
      kiln::reference_op(c.kind, c.attrs, in, out);
    for (size_t o = 0; o < c.out.size(); ++o) {
      const kiln::BufferView& v = c.out[o];
      if (!v.block) continue;
      size_t n = static_cast<size_t>(ar.out[o]);
      if (flaw_ == Flaw::unwritten && o == 0 && v.dtype != kiln::DType::f32 && n > 0) --n;
      kiln::from_float(out[o], v.raw(), v.dtype, n);
      if (flaw_ == Flaw::past_the_end && o == 0 && v.dtype != kiln::DType::f32)
        std::memset(static_cast<char*>(v.raw()) + v.bytes, 0, 2);  // the first 2 bytes after the buffer
    }
    return true;
  }

 private:
  // y = alpha op(A) op(B) + beta y with the running sum rounded to bfloat16 after every term.
  static void gemm_in_bf16(const kiln::GemmAttrs& a, const float* A, const float* B, float* y) {
    for (int64_t i = 0; i < a.m; ++i)
      for (int64_t j = 0; j < a.n; ++j) {
        float s = 0;
        for (int64_t p = 0; p < a.k; ++p) {
          const float x = a.trans_a ? A[p * a.m + i] : A[i * a.k + p];
          const float w = a.trans_b ? B[j * a.k + p] : B[p * a.n + j];
          s = kiln::round_to(s + x * w, kiln::DType::bf16);
        }
        y[i * a.n + j] = a.alpha * s + (a.beta != 0 ? a.beta * y[i * a.n + j] : 0.f);
      }
  }
  Flaw flaw_;
  kiln::DeviceInfo info_;
  uint64_t ids_ = 0;
};

class HalfBackend final : public kiln::Backend {
 public:
  explicit HalfBackend(Flaw f) : flaw_(f) {}
  std::string name() const override { return "half16"; }
  std::vector<kiln::DeviceInfo> enumerate() override { return {HalfDevice(flaw_).info()}; }
  std::unique_ptr<kiln::Device> open(int) override { return std::make_unique<HalfDevice>(flaw_); }

 private:
  Flaw flaw_;
};

kiln::BackendResult run_on(kiln::Registry& reg, const std::string& backend, const std::string& op, std::string& log) {
  kiln::ConformanceOptions o;
  o.backend = backend;
  o.op = op;
  o.tolerance_dir = KILN_SOURCE_DIR "/data/conformance/tolerances";
  o.fault_injection = false;
  o.gradients = false;
  std::ostringstream out;
  const kiln::ConformanceReport report = kiln::run_conformance_suite(reg, o, out);
  log = out.str();
  REQUIRE(report.backends.size() == 1);
  return report.backends[0];
}

kiln::BackendResult run_flawed(Flaw f, const std::string& op, std::string& log) {
  kiln::Registry reg;
  reg.add_backend("half16", [f](const kiln::BackendOptions&) { return std::make_unique<HalfBackend>(f); });
  return run_on(reg, "half16", op, log);
}

const kiln::CaseResult* find(const kiln::BackendResult& r, const std::string& id) {
  for (const auto& c : r.cases)
    if (c.id == id) return &c;
  return nullptr;
}

}  // namespace

TEST_CASE("every op with a 16-bit path has bf16 and f16 conformance cases with float32 kept where the policy keeps it",
          "[conformance][half]") {
  const std::vector<kiln::OpCase> all = kiln::conformance_cases();
  std::map<std::string, int> bf16, f16;
  for (const auto& c : all) {
    const std::string op(kiln::op_name(c.kind));
    bf16[op] += ends_with(c.id, ".bf16");
    f16[op] += ends_with(c.id, ".f16");
  }
  for (const char* op : {"gemm",
                         "batched_gemm",
                         "conv2d_forward",
                         "conv2d_backward_data",
                         "conv2d_backward_filter",
                         "bias_add",
                         "bias_grad",
                         "max_pool_forward",
                         "max_pool_backward",
                         "avg_pool_forward",
                         "activation_forward",
                         "activation_backward",
                         "softmax_forward",
                         "softmax_backward",
                         "softmax_cross_entropy",
                         "mean_squared_error",
                         "binary_cross_entropy",
                         "add",
                         "mul",
                         "copy",
                         "reduce_sum",
                         "concat",
                         "split",
                         "dropout_forward",
                         "embedding_forward",
                         "embedding_backward",
                         "layer_norm_forward",
                         "layer_norm_backward",
                         "permute",
                         "batch_norm_forward",
                         "batch_norm_backward",
                         "rms_norm_forward",
                         "rms_norm_backward"}) {
    INFO("op " << op);
    CHECK(bf16[op] > 0);
    CHECK(f16[op] == bf16[op]);
  }
  CHECK(bf16["adam_update"] == 0);  // optimizer state is float32 under every policy
  auto get = [&](const std::string& id) -> const kiln::OpCase& {
    for (const auto& c : all)
      if (c.id == id) return c;
    FAIL("no case " << id);
    return all.front();
  };
  using kiln::DType;
  // A loss: the prediction and its gradient 16-bit, the labels and the loss value float32.
  const auto& sce = get("softmax_cross_entropy/4x10.bf16");
  CHECK(sce.in_dtype == std::vector<DType>{DType::bf16, DType::f32});
  CHECK(sce.out_dtype == std::vector<DType>{DType::f32, DType::bf16});
  // Layer norm: gamma and beta are parameters, mean and rstd saved statistics.
  for (const auto& c : all)
    if (c.kind == kiln::OpKind::LayerNormForward && ends_with(c.id, ".f16") && c.in.size() == 3) {
      CHECK(c.in_dtype == std::vector<DType>{DType::f16, DType::f32, DType::f32});
      CHECK(c.out_dtype == std::vector<DType>{DType::f16, DType::f32, DType::f32});
      break;
    }
  // Long rows in bfloat16 where only float32 accumulation holds.
  const auto& g = get("gemm/long.nn.2x3x70000.bf16");
  CHECK(std::get<kiln::GemmAttrs>(g.attrs).k >= 70000);
  CHECK(g.in_dtype == std::vector<DType>{DType::bf16, DType::bf16});
  CHECK(std::get<kiln::SoftmaxAttrs>(get("softmax_forward/long.2x70000.bf16").attrs).cols >= 70000);
  CHECK(std::get<kiln::ReduceAttrs>(get("reduce_sum/long.2x70000x3.bf16").attrs).reduce >= 70000);
}

TEST_CASE("cpu backend passes the 16-bit conformance cases, casts included", "[conformance][half][cpu]") {
  auto& reg = kiln::test::registry();
  for (const std::string op : {"cast", "gemm", "softmax_forward", "layer_norm_forward", "reduce_sum", "add"}) {
    std::string log;
    const kiln::BackendResult r = run_on(reg, "cpu", op, log);
    INFO(log);
    REQUIRE(r.available);
    int halves = 0;
    for (const auto& c : r.cases) {
      INFO(c.id << ": " << c.detail);
      CHECK(c.status == kiln::CaseStatus::pass);
      halves += is_16bit(c.id) || c.id.find("bfloat16") != std::string::npos;
    }
    CHECK(halves >= 4);
  }
}

TEST_CASE("a device that reads 16-bit storage as float32 fails every 16-bit case and passes the float32 ones",
          "[conformance][half]") {
  std::string log;
  const kiln::BackendResult r = run_flawed(Flaw::reads_as_f32, "add", log);
  INFO(log);
  int halves = 0;
  for (const auto& c : r.cases) {
    INFO(c.id << ": " << c.detail);
    if (c.id.find("/0.") != std::string::npos) continue;  // nothing to read or write
    if (is_16bit(c.id)) {
      ++halves;
      CHECK(c.status == kiln::CaseStatus::fail);
    } else {
      CHECK(c.status == kiln::CaseStatus::pass);
    }
  }
  CHECK(halves >= 8);
  CHECK(log.find("repro: kiln conformance --backend half16 --device 0 --case 'add/") != std::string::npos);
}

TEST_CASE(
    "a faithful converting device passes the 16-bit cases, and one that accumulates in bfloat16 fails the long "
    "ones",
    "[conformance][half]") {
  std::string log;
  kiln::BackendResult good = run_flawed(Flaw::none, "gemm", log);
  {
    INFO(log);
    CHECK(good.count(kiln::CaseStatus::fail) == 0);
    CHECK(good.count(kiln::CaseStatus::pass) > 60);
  }
  const kiln::BackendResult bad = run_flawed(Flaw::bf16_accumulation, "gemm", log);
  INFO(log);
  for (const char* id : {"gemm/long.nn.2x3x70000.bf16", "gemm/long.tn.3x2x100003.bf16", "gemm/long.nn.2x3x70000.f16"}) {
    const kiln::CaseResult* c = find(bad, id);
    REQUIRE(c);
    INFO(id << ": " << c->detail);
    CHECK(c->status == kiln::CaseStatus::fail);
    CHECK(c->detail.find("normalized squared error") != std::string::npos);
  }
}

TEST_CASE("conformance finds an unwritten 16-bit element and a write past a 16-bit buffer", "[conformance][half]") {
  std::string log;
  run_flawed(Flaw::unwritten, "copy", log);
  CHECK(log.find("FAIL half16:0 copy/") != std::string::npos);
  CHECK(log.find(".bf16 -- output 0 element ") != std::string::npos);
  CHECK(log.find("was never written (reference") != std::string::npos);
  CHECK(log.find(".f16 -- output 0 element ") != std::string::npos);
  run_flawed(Flaw::past_the_end, "copy", log);
  CHECK(log.find(".bf16 -- bytes outside buffer 1 were overwritten") != std::string::npos);
  CHECK(log.find(".f16 -- bytes outside buffer 1 were overwritten") != std::string::npos);
}

TEST_CASE("a device that computes in float32 only reports the 16-bit cases unsupported with its reason",
          "[conformance][half]") {
  std::string log;
  const kiln::BackendResult r = run_flawed(Flaw::float32_only, "mul", log);
  INFO(log);
  CHECK(r.count(kiln::CaseStatus::fail) == 0);
  int halves = 0;
  for (const auto& c : r.cases)
    if (is_16bit(c.id)) {
      ++halves;
      INFO(c.id << ": " << c.detail);
      CHECK(c.status == kiln::CaseStatus::unsupported);
      CHECK(c.detail.find(" storage: ") != std::string::npos);
    }
  CHECK(halves > 0);
  CHECK(log.find("UNSUPPORTED half16:0 mul/") != std::string::npos);
}
