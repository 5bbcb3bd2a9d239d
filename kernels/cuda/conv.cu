// Convolutions through cuDNN's legacy API (cudnnConvolution{Forward,BackwardData,BackwardFilter}), with the
// algorithm chosen per shape by cudnnGet*Algorithm_v7 among those whose workspace fits the budget, deterministic
// ones first, FMA math unless TF32 was asked for (KILN_CUDA_TF32=1).
// Kiln's padding is top/left with the bottom/right implied by oh/ow, which may be asymmetric; cuDNN pads
// symmetrically. Such shapes run on an explicitly zero-padded copy of the input (kept in the workspace).
// Each device keeps its plans (ConvEngine, a per-device state on its cuDNN handle); its extension
// "cuda.conv_report" lists them.
// 16-bit storage: when x, w and y (dy, dx, dw) are all bfloat16 or all float16, cuDNN reads and writes them in that
// type with float32 accumulation (descriptors of CUDNN_DATA_BFLOAT16 / CUDNN_DATA_HALF, a CUDNN_DATA_FLOAT
// convolution, tensor-op math allowed). A shape no cuDNN algorithm runs in 16 bits runs the float32 plan on float32
// copies in the workspace; other mixes of types go through the device's float32 conversion (dispatch.cpp).
#include <cudnn.h>

#include <array>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "common.cuh"
#include "cuda_device.hpp"
#include "handles.hpp"
#include "kiln/allocator.hpp"
#include "kiln/error.hpp"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

// T: float, or uint16_t for the 16-bit types, whose bits are only moved (all-zero bits are +0 in both).
template <class T>
__global__ void shift_copy_kernel(const T* in, T* out, int64_t total, int64_t ih, int64_t iw, int64_t oh, int64_t ow,
                                  int64_t dy, int64_t dx) {
  KILN_GRID_STRIDE(i, total) {
    const int64_t x = i % ow, y = (i / ow) % oh, p = i / (ow * oh);
    const int64_t sy = y + dy, sx = x + dx;
    out[i] = (sy >= 0 && sy < ih && sx >= 0 && sx < iw) ? in[(p * ih + sy) * iw + sx] : T(0);
  }
}

// out(p, y, x) = in(p, y + dy, x + dx), 0 where that falls outside `in` (explicit padding and cropping); elements
// of type t.
void shift_copy(cudaStream_t s, DType t, const void* in, void* out, int64_t planes, int64_t ih, int64_t iw, int64_t oh,
                int64_t ow, int64_t dy, int64_t dx) {
  const int64_t total = planes * oh * ow;
  if (total == 0) return;
  if (t == DType::f32)
    shift_copy_kernel<float><<<grid_for(total), kThreads, 0, s>>>(
        static_cast<const float*>(in), static_cast<float*>(out), total, ih, iw, oh, ow, dy, dx);
  else
    shift_copy_kernel<uint16_t><<<grid_for(total), kThreads, 0, s>>>(
        static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), total, ih, iw, oh, ow, dy, dx);
  KILN_CUDA_LAUNCHED("shift_copy_kernel");
}

cudnnDataType_t cudnn_type(DType t) {
  return t == DType::bf16 ? CUDNN_DATA_BFLOAT16 : t == DType::f16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

class ConvEngine final : public CudaDeviceState {
 public:
  ConvEngine(cudnnHandle_t handle, bool tf32);
  ~ConvEngine() override;
  ConvEngine(const ConvEngine&) = delete;
  ConvEngine& operator=(const ConvEngine&) = delete;

  static Support supports(const ConvAttrs& a);
  // Workspace for the op on buffers of type t with at most `budget` bytes for cuDNN itself (the padded copy, and
  // float32 copies of 16-bit buffers where needed, come on top). Throws DeviceError when no algorithm runs the shape.
  size_t workspace_bytes(OpKind kind, const ConvAttrs& a, size_t budget, DType t);
  // Enqueues the op (its buffers all of type call.out[0].dtype); call.workspace must hold
  // workspace_bytes(kind, a, budget, that type) for some budget.
  void run(OpKind kind, const ConvAttrs& a, const OpCall& call, cudaStream_t stream, size_t budget);
  // "conv2d_forward n=32 c=3 ...: algo 1, FMA math, 1.2 MiB" for each planned shape (reports, tests).
  std::string report() const override;

 private:
  struct Plan;
  using Key = std::array<int64_t, 16>;
  const Plan& plan(OpKind kind, const ConvAttrs& a, size_t budget, DType t);
  const Plan& plan_locked(OpKind kind, const ConvAttrs& a, size_t budget, DType t);  // mu_ held
  std::unique_ptr<Plan> build(OpKind kind, const ConvAttrs& a, size_t budget, bool padded, DType t, size_t& smallest);
  void execute(const Plan& p, OpKind kind, const ConvAttrs& a, const OpCall& call, cudaStream_t stream);
  void execute_via_f32(const Plan& p, OpKind kind, const ConvAttrs& a, const OpCall& call, cudaStream_t stream);

  cudnnHandle_t handle_;
  bool tf32_;
  mutable std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

struct ConvEngine::Plan {
  OpKind kind{};
  ConvAttrs attrs;
  DType dtype = DType::f32;  // of every buffer the plan reads and writes
  // A 16-bit shape cuDNN has no algorithm for: float32 copies of in0, in1 and out at these workspace offsets
  // (copy_bytes in all), then the float32 plan with its own workspace. Null for a plan cuDNN runs itself.
  const Plan* via_f32 = nullptr;
  size_t copy_offset[3] = {}, copy_bytes = 0;
  bool padded = false;
  int64_t hp = 0, wp = 0;  // padded input height/width (padded plans)
  size_t pad_bytes = 0;    // the padded copy at the start of the workspace, 256-aligned
  int algo = 0;
  cudnnMathType_t math = CUDNN_FMA_MATH;
  bool deterministic = true;
  size_t cudnn_bytes = 0;
  TensorDesc x, y;  // x: input (or padded input); y: output of the forward convolution
  FilterDesc w;
  ConvDesc conv;
  size_t total() const { return via_f32 ? copy_bytes + via_f32->total() : pad_bytes + cudnn_bytes; }
  // What comes on top of cuDNN's own workspace.
  size_t overhead() const { return via_f32 ? copy_bytes + via_f32->pad_bytes : pad_bytes; }
};

ConvEngine::ConvEngine(cudnnHandle_t handle, bool tf32) : handle_(handle), tf32_(tf32) {}
ConvEngine::~ConvEngine() = default;

constexpr size_t kAlign = 256;
size_t align_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

bool symmetric(const ConvAttrs& a) {
  const int64_t ty = a.h + 2 * a.pad_h - a.r, tx = a.w + 2 * a.pad_w - a.s;
  return ty >= 0 && tx >= 0 && ty / a.stride_h + 1 == a.oh && tx / a.stride_w + 1 == a.ow;
}

bool empty(const ConvAttrs& a) {
  for (int64_t v : {a.n, a.c, a.h, a.w, a.k, a.r, a.s, a.oh, a.ow})
    if (v == 0) return true;
  return false;
}

std::string shape_text(OpKind kind, const ConvAttrs& a) {
  std::ostringstream o;
  o << op_name(kind) << " (n=" << a.n << " c=" << a.c << " h=" << a.h << " w=" << a.w << " k=" << a.k << " r=" << a.r
    << " s=" << a.s << " stride=" << a.stride_h << "x" << a.stride_w << " pad=" << a.pad_h << "x" << a.pad_w
    << " out=" << a.oh << "x" << a.ow << ")";
  return o.str();
}

// Picks the first algorithm (in cuDNN's expected-speed order, deterministic ones first) whose workspace under
// the math type we allow fits `budget`. `get` lists cuDNN's ranking, `size` asks one algorithm's workspace.
// tensor_ops: TF32 was asked for, or the data is 16-bit (tensor cores with float32 accumulation).
template <class Perf, class Get, class Size>
bool choose(cudnnConvolutionDescriptor_t conv, bool tensor_ops, int count, size_t budget, Get get, Size size, int& algo,
            cudnnMathType_t& math, bool& deterministic, size_t& bytes, size_t& smallest) {
  const cudnnMathType_t base = tensor_ops ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, base));
  std::vector<Perf> perf(static_cast<size_t>(count));
  int returned = 0;
  KILN_CUDNN_CHECK(get(count, &returned, perf.data()));
  perf.resize(static_cast<size_t>(returned));
  // Algorithms the heuristic left out are tried last, in enum order.
  for (int a = 0; a < count; ++a) {
    bool listed = false;
    for (const auto& p : perf) listed = listed || static_cast<int>(p.algo) == a;
    if (!listed) {
      Perf extra{};
      extra.algo = static_cast<decltype(extra.algo)>(a);
      extra.status = CUDNN_STATUS_SUCCESS;
      extra.determinism = CUDNN_NON_DETERMINISTIC;  // unknown: ranked with the non-deterministic ones
      extra.mathType = base;
      perf.push_back(extra);
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& p : perf) {
      const bool det = p.determinism == CUDNN_DETERMINISTIC;
      if (p.status != CUDNN_STATUS_SUCCESS || det != (pass == 0)) continue;
      const cudnnMathType_t m = tensor_ops ? p.mathType : CUDNN_FMA_MATH;
      if (cudnnSetConvolutionMathType(conv, m) != CUDNN_STATUS_SUCCESS) continue;
      size_t need = 0;
      if (size(static_cast<int>(p.algo), &need) != CUDNN_STATUS_SUCCESS) continue;
      smallest = std::min(smallest, need);
      if (need > budget) continue;
      algo = static_cast<int>(p.algo);
      math = m;
      deterministic = det;
      bytes = need;
      return true;
    }
  }
  return false;
}

int as_int(int64_t v) { return static_cast<int>(v); }

Support ConvEngine::supports(const ConvAttrs& a) {
  for (int64_t v : {a.n, a.c, a.h, a.w, a.k, a.r, a.s, a.pad_h, a.pad_w, a.oh, a.ow})
    if (v < 0 || v > INT_MAX) return {false, "cuDNN takes convolution sizes in [0, 2^31): found " + std::to_string(v)};
  if (a.stride_h < 1 || a.stride_w < 1 || a.stride_h > INT_MAX || a.stride_w > INT_MAX)
    return {false, "strides must be >= 1, found " + std::to_string(a.stride_h) + "x" + std::to_string(a.stride_w)};
  for (int64_t e : {a.n * a.c * a.h * a.w, a.k * a.c * a.r * a.s, a.n * a.k * a.oh * a.ow,
                    a.n * a.c * ((a.oh - 1) * a.stride_h + a.r) * ((a.ow - 1) * a.stride_w + a.s)})
    if (e > INT_MAX)
      return {false, "cuDNN's legacy API takes tensors of fewer than 2^31 elements, found " + std::to_string(e)};
  return {};
}

std::unique_ptr<ConvEngine::Plan> ConvEngine::build(OpKind kind, const ConvAttrs& a, size_t budget, bool padded,
                                                    DType t, size_t& smallest) {
  auto p = std::make_unique<Plan>();
  p->kind = kind;
  p->attrs = a;
  p->dtype = t;
  p->padded = padded;
  int64_t in_h = a.h, in_w = a.w, pad_h = a.pad_h, pad_w = a.pad_w;
  if (padded) {
    p->hp = in_h = (a.oh - 1) * a.stride_h + a.r;
    p->wp = in_w = (a.ow - 1) * a.stride_w + a.s;
    pad_h = pad_w = 0;
    p->pad_bytes = align_up(static_cast<size_t>(a.n * a.c * in_h * in_w) * dtype_size(t));
  }
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
  p->x.reset(x);
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
  p->y.reset(y);
  KILN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
  p->w.reset(w);
  KILN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
  p->conv.reset(conv);
  const cudnnDataType_t data = cudnn_type(t);
  KILN_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, data, as_int(a.n), as_int(a.c), as_int(in_h), as_int(in_w)));
  KILN_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, data, as_int(a.n), as_int(a.k), as_int(a.oh), as_int(a.ow)));
  KILN_CUDNN_CHECK(
      cudnnSetFilter4dDescriptor(w, data, CUDNN_TENSOR_NCHW, as_int(a.k), as_int(a.c), as_int(a.r), as_int(a.s)));
  // Accumulation in float32 for every storage type.
  KILN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, as_int(pad_h), as_int(pad_w), as_int(a.stride_h),
                                                   as_int(a.stride_w), 1, 1, CUDNN_CROSS_CORRELATION,
                                                   CUDNN_DATA_FLOAT));
  const bool tensor_ops = tf32_ || t != DType::f32;
  // cuDNN must agree with Kiln on the output size, or the shape goes through the padded path.
  int dims[4] = {};
  if (cudnnGetConvolutionNdForwardOutputDim(conv, x, w, 4, dims) != CUDNN_STATUS_SUCCESS || dims[2] != a.oh ||
      dims[3] != a.ow)
    return nullptr;
  const size_t cudnn_budget = budget;
  bool ok = false;
  switch (kind) {
    case OpKind::Conv2dForward:
      ok = choose<cudnnConvolutionFwdAlgoPerf_t>(
          conv, tensor_ops, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, cudnn_budget,
          [&](int n, int* r, cudnnConvolutionFwdAlgoPerf_t* perf) {
            return cudnnGetConvolutionForwardAlgorithm_v7(handle_, x, w, conv, y, n, r, perf);
          },
          [&](int algo, size_t* b) {
            return cudnnGetConvolutionForwardWorkspaceSize(handle_, x, w, conv, y,
                                                           static_cast<cudnnConvolutionFwdAlgo_t>(algo), b);
          },
          p->algo, p->math, p->deterministic, p->cudnn_bytes, smallest);
      break;
    case OpKind::Conv2dBackwardData:
      ok = choose<cudnnConvolutionBwdDataAlgoPerf_t>(
          conv, tensor_ops, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, cudnn_budget,
          [&](int n, int* r, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle_, w, y, conv, x, n, r, perf);
          },
          [&](int algo, size_t* b) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(handle_, w, y, conv, x,
                                                                static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), b);
          },
          p->algo, p->math, p->deterministic, p->cudnn_bytes, smallest);
      break;
    default:
      ok = choose<cudnnConvolutionBwdFilterAlgoPerf_t>(
          conv, tensor_ops, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, cudnn_budget,
          [&](int n, int* r, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
            return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle_, x, y, conv, w, n, r, perf);
          },
          [&](int algo, size_t* b) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(
                handle_, x, y, conv, w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), b);
          },
          p->algo, p->math, p->deterministic, p->cudnn_bytes, smallest);
      break;
  }
  if (!ok) return nullptr;
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, p->math));
  return p;
}

const ConvEngine::Plan& ConvEngine::plan(OpKind kind, const ConvAttrs& a, size_t budget, DType t) {
  std::lock_guard lock(mu_);
  return plan_locked(kind, a, budget, t);
}

const ConvEngine::Plan& ConvEngine::plan_locked(OpKind kind, const ConvAttrs& a, size_t budget, DType t) {
  const Key key = {static_cast<int64_t>(kind),
                   a.n,
                   a.c,
                   a.h,
                   a.w,
                   a.k,
                   a.r,
                   a.s,
                   a.stride_h,
                   a.stride_w,
                   a.pad_h,
                   a.pad_w,
                   a.oh,
                   a.ow,
                   static_cast<int64_t>(budget),
                   static_cast<int64_t>(t)};
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  size_t smallest = SIZE_MAX;
  std::unique_ptr<Plan> p;
  if (t == DType::f32) {
    if (symmetric(a)) p = build(kind, a, budget, false, t, smallest);
    if (!p) p = build(kind, a, budget, true, t, smallest);
  } else {
    // cuDNN may refuse a 16-bit configuration outright (an error from a descriptor or the heuristic) or have no
    // algorithm for it: either way the float32 plan runs on float32 copies instead.
    try {
      if (symmetric(a)) p = build(kind, a, budget, false, t, smallest);
      if (!p) p = build(kind, a, budget, true, t, smallest);
    } catch (const DeviceError&) {
      p = nullptr;
    }
    if (!p) {
      const Plan& f32 = plan_locked(kind, a, budget, DType::f32);  // throws when float32 has no algorithm either
      const OpArity ar = op_arity(kind, a);
      p = std::make_unique<Plan>();
      p->kind = kind;
      p->attrs = a;
      p->dtype = t;
      p->via_f32 = &f32;  // plans are never erased: the pointer stays valid
      const int64_t counts[3] = {ar.in[0], ar.in[1], ar.out[0]};
      for (int i = 0; i < 3; ++i) {
        p->copy_offset[i] = p->copy_bytes;
        p->copy_bytes += align_up(static_cast<size_t>(counts[i]) * sizeof(float));
      }
    }
  }
  if (!p)
    throw DeviceError(shape_text(kind, a) + ": no cuDNN algorithm runs this shape within the workspace budget of " +
                      format_bytes(budget) +
                      (smallest == SIZE_MAX ? std::string(" (none supports it at all)")
                                            : "; the smallest needs " + format_bytes(smallest) +
                                                  ". Raise KILN_CUDA_WORKSPACE_LIMIT or the memory limit"));
  return *plans_.emplace(key, std::move(p)).first->second;
}

size_t ConvEngine::workspace_bytes(OpKind kind, const ConvAttrs& a, size_t budget, DType t) {
  if (empty(a)) return 0;
  return plan(kind, a, budget, t).total();
}

void ConvEngine::run(OpKind kind, const ConvAttrs& a, const OpCall& call, cudaStream_t stream, size_t budget) {
  if (empty(a)) {  // no taps: every output element is a sum over nothing (float32 here: conv_takes_types)
    fill(stream, static_cast<float*>(call.out[0].raw()), static_cast<int64_t>(call.out[0].bytes / sizeof(float)), 0.f);
    return;
  }
  const DType t = call.out[0].dtype;
  const size_t given = call.workspace.block ? call.workspace.bytes : 0;
  const Plan* p = &plan(kind, a, budget, t);
  if (p->total() > given) p = &plan(kind, a, given > p->overhead() ? given - p->overhead() : 0, t);
  if (p->total() > given)
    throw DeviceError(shape_text(kind, a) + ": the workspace given has " + format_bytes(given) + ", the op needs " +
                      format_bytes(p->total()) + " (ask Device::workspace_bytes for the size)");
  if (p->via_f32)
    execute_via_f32(*p, kind, a, call, stream);
  else
    execute(*p, kind, a, call, stream);
}

// The float32 plan on float32 copies at the start of the workspace: inputs converted in, the output back (cuDNN
// writes it with beta = 0, so its old values are not needed).
void ConvEngine::execute_via_f32(const Plan& p, OpKind kind, const ConvAttrs& a, const OpCall& call,
                                 cudaStream_t stream) {
  const OpArity ar = op_arity(kind, a);
  const int64_t counts[3] = {ar.in[0], ar.in[1], ar.out[0]};
  OpCall f = call;
  BufferView* copies[3] = {&f.in[0], &f.in[1], &f.out[0]};
  for (int i = 0; i < 3; ++i) {
    copies[i]->block = call.workspace.block;
    copies[i]->offset = call.workspace.offset + p.copy_offset[i];
    copies[i]->bytes = static_cast<size_t>(counts[i]) * sizeof(float);
    copies[i]->dtype = DType::f32;
  }
  f.workspace.offset = call.workspace.offset + p.copy_bytes;
  f.workspace.bytes = call.workspace.bytes - p.copy_bytes;  // run() checked total() = copy_bytes + the plan's
  cast_values(stream, call.in[0].raw(), call.in[0].dtype, f.in[0].raw(), DType::f32, counts[0]);
  cast_values(stream, call.in[1].raw(), call.in[1].dtype, f.in[1].raw(), DType::f32, counts[1]);
  execute(*p.via_f32, kind, a, f, stream);
  cast_values(stream, f.out[0].raw(), DType::f32, call.out[0].raw(), call.out[0].dtype, counts[2]);
}

// Runs cuDNN's plan `p` on the call's buffers (all of p.dtype); the workspace holds p.total().
void ConvEngine::execute(const Plan& pl, OpKind kind, const ConvAttrs& a, const OpCall& call, cudaStream_t stream) {
  const Plan* p = &pl;
  void* out = call.out[0].raw();
  auto in = [&](size_t i) { return call.in[i].raw(); };
  const size_t given = call.workspace.block ? call.workspace.bytes : 0;
  char* ws = given ? static_cast<char*>(call.workspace.block->ptr) + call.workspace.offset : nullptr;
  void* cudnn_ws = p->cudnn_bytes ? ws + p->pad_bytes : nullptr;
  void* padded = p->padded ? ws : nullptr;
  const float one = 1.f, zero = 0.f;  // float scaling for float32 and 16-bit data alike
  const auto algo = p->algo;
  const int64_t planes = a.n * a.c;
  const DType t = p->dtype;
  switch (kind) {
    case OpKind::Conv2dForward: {
      const void* x = in(0);
      if (p->padded) {
        shift_copy(stream, t, x, padded, planes, a.h, a.w, p->hp, p->wp, -a.pad_h, -a.pad_w);
        x = padded;
      }
      KILN_CUDNN_CHECK(cudnnConvolutionForward(handle_, &one, p->x.get(), x, p->w.get(), in(1), p->conv.get(),
                                               static_cast<cudnnConvolutionFwdAlgo_t>(algo), cudnn_ws, p->cudnn_bytes,
                                               &zero, p->y.get(), out));
      break;
    }
    case OpKind::Conv2dBackwardData: {
      void* dx = p->padded ? padded : out;
      KILN_CUDNN_CHECK(cudnnConvolutionBackwardData(handle_, &one, p->w.get(), in(1), p->y.get(), in(0), p->conv.get(),
                                                    static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), cudnn_ws,
                                                    p->cudnn_bytes, &zero, p->x.get(), dx));
      if (p->padded)  // crop; input rows/cols no window reaches get 0
        shift_copy(stream, t, padded, out, planes, p->hp, p->wp, a.h, a.w, a.pad_h, a.pad_w);
      break;
    }
    default: {
      const void* x = in(0);
      if (p->padded) {
        shift_copy(stream, t, x, padded, planes, a.h, a.w, p->hp, p->wp, -a.pad_h, -a.pad_w);
        x = padded;
      }
      KILN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle_, &one, p->x.get(), x, p->y.get(), in(1), p->conv.get(),
                                                      static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), cudnn_ws,
                                                      p->cudnn_bytes, &zero, p->w.get(), out));
      break;
    }
  }
}

std::string ConvEngine::report() const {
  std::lock_guard lock(mu_);
  std::string s;
  for (const auto& [key, p] : plans_) {
    if (p->via_f32) {
      s += shape_text(p->kind, p->attrs) + " " + dtype_name(p->dtype) +
           ": no cuDNN algorithm in this type, the float32 plan on float32 copies, workspace " +
           format_bytes(p->total()) + "\n";
      continue;
    }
    s += shape_text(p->kind, p->attrs) + (p->dtype == DType::f32 ? "" : std::string(" ") + dtype_name(p->dtype)) +
         ": algo " + std::to_string(p->algo) + (p->math == CUDNN_FMA_MATH ? ", FMA math" : ", tensor-op math") +
         (p->deterministic ? "" : ", non-deterministic") + (p->padded ? ", explicit padding" : "") + ", workspace " +
         format_bytes(p->total()) + "\n";
  }
  return s;
}

// cuDNN's legacy API takes x, w and y of one type: all bfloat16 or all float16 run in that type.
bool conv_takes_types(const OpCall& c) {
  const DType t = c.out[0].dtype;
  return t != DType::f32 && c.in[0].dtype == t && c.in[1].dtype == t && !empty(std::get<ConvAttrs>(c.attrs));
}

const size_t kConvState = add_device_state("conv", [](CudaDevice& d) -> std::unique_ptr<CudaDeviceState> {
  return std::make_unique<ConvEngine>(d.cudnn(), d.tf32());
});

const CudaKernel conv_kernel{
    .run =
        [](const CudaOp& op) {
          op.device.state<ConvEngine>(kConvState)
              .run(op.call.kind, op.attrs<ConvAttrs>(), op.call, op.stream, op.device.workspace_limit());
        },
    .support = [](OpKind, const OpAttrs& a) { return ConvEngine::supports(std::get<ConvAttrs>(a)); },
    // The buffers' type: all one 16-bit type (conv_takes_types), or float32 (converted by the device if need be).
    .workspace =
        [](const CudaDevice& d, const OpCall& c) {
          return d.state<ConvEngine>(kConvState)
              .workspace_bytes(c.kind, std::get<ConvAttrs>(c.attrs), d.workspace_limit(), c.out[0].dtype);
        },
    .takes_types = conv_takes_types};

}  // namespace

KILN_CUDA_KERNELS(conv) {
  for (OpKind k : {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter})
    register_cuda_kernel(k, conv_kernel);
}

}  // namespace kiln::cuda::kernels
