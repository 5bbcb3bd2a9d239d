// The op set: every computation a backend runs. Each op has exact semantics written here; the core's
// reference implementation (reference.hpp) is the oracle every backend is checked against.
//
// Conventions for all ops:
//  - f32 arithmetic, row-major, dense. Under a 16-bit precision policy a buffer may hold bf16 or f16 values
//    (BufferView::dtype): the op reads them as float32 and rounds what it writes to the buffer's type; only
//    float32 is ever accumulated. Images are NCHW; convolution filters are KCRS (out, in, kh, kw).
//  - An op reads its `in` buffers and writes its `out` buffers. An output listed as "read-write" is read
//    before it is written (optimizer state, Axpby). Unless an op says "may alias", inputs and outputs do
//    not overlap. Every output element is written (no op leaves stale data), except where stated.
//  - Backward ops overwrite their outputs; the graph adds gradients explicitly (Add) where a tensor has
//    several consumers.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/tensor.hpp"

namespace kiln {

enum class OpKind : uint16_t {
  // y(m,n) = alpha * op(A) * op(B) + beta * y. in: A, B; out: y (read when beta != 0).
  // op(A) is A(m,k) or, with trans_a, A stored as (k,m); likewise B(k,n) or (n,k).
  Gemm,
  // y[o,c,i] = x[o,c,i] + b[c]. in: x, b; out: y (may alias x).
  BiasAdd,
  // db[c] = sum_{o,i} dy[o,c,i]. in: dy; out: db.
  BiasGrad,
  // y(n,k,oh,ow) = sum_{c,r,s} x(n,c,oh*sh - ph + r, ow*sw - pw + s) * w(k,c,r,s); x outside the image is 0.
  // in: x, w; out: y.
  Conv2dForward,
  // dx = gradient of Conv2dForward w.r.t. x. in: dy(n,k,oh,ow), w; out: dx(n,c,h,w).
  Conv2dBackwardData,
  // dw = gradient of Conv2dForward w.r.t. w. in: x, dy; out: dw(k,c,r,s).
  Conv2dBackwardFilter,
  // y(n,c,oy,ox) = max over the window rows oy*sh-ph .. +kh-1, cols ox*sw-pw .. +kw-1, clipped to the
  // image (padding never wins). A window with no valid element gives 0. in: x; out: y.
  MaxPoolForward,
  // dx = 0, then for each output, dy is added to the first position (row-major window order) whose x equals
  // the output y. in: x, y, dy; out: dx.
  MaxPoolBackward,
  // Average over the valid (non-padding) elements of each window; an empty window gives 0. in: x; out: y.
  AvgPoolForward,
  // dx = 0, then dy/count is added to each valid element of the window. in: dy; out: dx.
  AvgPoolBackward,
  // y = f(x) elementwise. in: x; out: y (may alias x). f: relu max(x, 0) (NaN passes through); sigmoid;
  // tanh; gelu x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); gelu_tanh 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  // (PyTorch's GELU(approximate="tanh")); silu x * sigmoid(x).
  ActivationForward,
  // dx = dy * f'. relu, sigmoid and tanh read the forward output y: relu y > 0 ? dy : 0; sigmoid dy*y*(1-y);
  // tanh dy*(1-y*y). gelu, gelu_tanh and silu read the forward input x (activation_backward_reads_input):
  // gelu dy * (Phi(x) + x phi(x)); gelu_tanh dy * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3*0.044715 x^2))
  // with t the tanh above; silu dy * s (1 + x (1 - s)), s = sigmoid(x).
  // in: y or x, dy; out: dx (may alias dy).
  ActivationBackward,
  // Row-wise softmax over `cols`, max-subtracted. in: x(rows, cols); out: y. With `causal` (attention scores
  // (..., T, T), cols = T): row r keeps columns j <= r % cols and gives the others probability exactly 0
  // (PyTorch's masked_fill(-inf) then softmax); x there is never read.
  SoftmaxForward,
  // dx = y * (dy - sum_j dy_j * y_j) per row. in: y, dy; out: dx. `causal` changes nothing (y is 0 where the
  // forward masked, so dx is 0 there).
  SoftmaxBackward,
  // Fused forward+backward sparse softmax cross-entropy from logits. in: logits(rows, cols), labels(rows) holding
  // class indices as floats in [0, cols). out: loss(1) = scale * sum_r -log softmax(x_r)[label_r];
  // dlogits(rows, cols) = scale * (softmax(x_r) - onehot(label_r)). An out-of-range label gives a NaN loss.
  // With LossAttrs::soft_labels the labels are t(rows, cols), one-hot or class probabilities (PyTorch's
  // CrossEntropyLoss with probability targets): loss = scale * sum_r sum_j t_rj (lse_r - x_rj);
  // dlogits = scale * (softmax(x_r) * sum_j t_rj - t_r).
  SoftmaxCrossEntropy,
  // Fused MSE. in: pred(rows, cols), target(rows, cols). out: loss(1) = scale/cols * sum (p-t)^2;
  // dpred = scale/cols * 2 (p - t).
  MeanSquaredError,
  // Fused binary cross-entropy. in: pred(rows, cols), target(rows, cols). With from_logits (z = pred):
  // loss = scale/cols * sum max(z,0) - z*t + log(1+exp(-|z|)), dz = scale/cols * (sigmoid(z) - t).
  // Otherwise p = clamp(pred, 1e-7, 1-1e-7): loss = scale/cols * sum -(t log p + (1-t) log(1-p)),
  // dp = scale/cols * (p - t) / (p (1 - p)).
  BinaryCrossEntropy,
  // y = alpha*a + beta*b. in: a, b; out: y (may alias a or b).
  Add,
  // y = a * b. in: a, b; out: y (may alias a or b).
  Mul,
  // y = alpha*x + beta*y. in: x; out: y (read-write).
  Axpby,
  // y = alpha * x. in: x; out: y (may alias x).
  Scale,
  // y = alpha. out: y.
  Fill,
  // y = x. in: x; out: y.
  Copy,
  // y(o,i) = sum_r x(o,r,i). in: x(outer, reduce, inner); out: y(outer, inner).
  ReduceSum,
  // Concatenate along an axis: inputs x_j(outer, sizes[j], inner); out: y(outer, sum sizes, inner).
  Concat,
  // The inverse of Concat: in: y(outer, sum sizes, inner); outs: x_j(outer, sizes[j], inner).
  Split,
  // keep_i = dropout_uniform(seed, counter, i) >= rate; y_i = keep_i ? x_i / (1 - rate) : 0.
  // in: x; out: y (may alias x). dropout_uniform is defined in reference.hpp (counter-based, same bits on
  // every backend).
  DropoutForward,
  // dx_i = keep_i ? dy_i / (1 - rate) : 0 with the same (seed, counter, i). in: dy; out: dx (may alias dy).
  DropoutBackward,
  // PyTorch SGD: g' = g + wd*w; v = momentum*v + g'; d = nesterov ? g' + momentum*v : v (d = g' when
  // momentum == 0, v then untouched and may be
  // any buffer, e.g. w itself); w -= lr*d. in: g; out: w, v (read-write).
  SgdUpdate,
  // PyTorch Adam (L2 weight decay): g' = g + wd*w; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
  // w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), t >= 1. With decoupled_decay (PyTorch AdamW),
  // first w *= 1 - lr * decoupled_decay (the L2 term is then usually 0). in: g; out: w, m, v (read-write).
  AdamUpdate,
  // PyTorch RMSprop: sq = rho*sq + (1-rho) g^2; with momentum > 0: buf = momentum*buf + g/(sqrt(sq)+eps),
  // w -= lr*buf; else w -= lr*g/(sqrt(sq)+eps) (buf untouched, may be any buffer). in: g; out: w, sq, buf (read-write).
  RmspropUpdate,
  // shadow = decay*shadow + (1-decay)*w. in: w; out: shadow (read-write).
  EmaUpdate,
  // Gathers rows of a table: y(r, :) = table(ids[r], :). in: ids(rows) holding integer ids in [0, vocab) as floats,
  // table(vocab, dim); out: y(rows, dim). An id out of range or not an integer gives a row of NaN.
  EmbeddingForward,
  // The table's gradient: dtable = 0, then dtable(ids[r], :) += dy(r, :) for r in order (ids out of range or not
  // integers are skipped). in: ids(rows), dy(rows, dim); out: dtable(vocab, dim).
  EmbeddingBackward,
  // Normalizes each row over `cols`: mean = sum x / cols, var = sum (x - mean)^2 / cols (biased, as PyTorch's
  // LayerNorm), rstd = 1 / sqrt(var + eps), y = (x - mean) * rstd * gamma[c] (+ beta[c] with bias).
  // in: x(rows, cols), gamma(cols)[, beta(cols)]; out: y(rows, cols), mean(rows), rstd(rows).
  LayerNormForward,
  // The gradients of LayerNormForward: with xhat = (x - mean) * rstd and g = dy * gamma,
  // dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)); dgamma[c] = sum_r dy * xhat; dbeta[c] = sum_r dy.
  // in: x, gamma, mean, rstd, dy; out: dx(rows, cols), dgamma(cols)[, dbeta(cols)].
  LayerNormBackward,
  // Sum of squares (gradient clipping by global norm): y = alpha * sum_i x_i^2 + beta * y, summed in double on the
  // reference. in: x(count); out: y(1) (read when beta != 0: a global norm accumulates over many tensors).
  SumSquares,
  // Scales x by PyTorch's clip_grad_norm_ coefficient from a sum of squares s (SumSquares over every gradient):
  // x *= min(1, alpha / (sqrt(s) + 1e-6)), alpha = the maximum norm. in: s(1); out: x(count) (read-write).
  ClipByGlobalNorm,
  // Gemm on `batch` independent matrices stored one after another: y_b = alpha * op(A_b) * op(B_b) + beta * y_b
  // with A_b at b*m*k, B_b at b*k*n, y_b at b*m*n (PyTorch's torch.bmm / a @ b on (batch, ., .) tensors). The
  // same GemmAttrs; Gemm itself requires batch == 1. in: A, B; out: y (read when beta != 0).
  BatchedGemm,
  // y = x with its axes permuted: x viewed as (dims[0], ..., dims[rank-1]), y's axis i is x's axis perm[i]
  // (numpy's transpose, PyTorch's permute followed by contiguous), y dense row-major. in: x; out: y.
  Permute,
  // Batch normalization over channels (PyTorch's BatchNorm1d/2d), x viewed as (n, c, inner): per channel over the
  // m = n * inner values, mean = sum x / m, var = sum (x - mean)^2 / m (biased), rstd = 1 / sqrt(var + eps),
  // y = (x - mean) * rstd * gamma[c] + beta[c]. Training also updates the running statistics in place:
  // running_mean = (1 - momentum) running_mean + momentum mean, running_var = (1 - momentum) running_var +
  // momentum var * m / (m - 1) (unbiased; m >= 2). Evaluation (training = false) normalizes with the running
  // statistics instead (mean = running_mean, rstd = 1 / sqrt(running_var + eps)) and leaves them unchanged.
  // in: x(n, c, inner), gamma(c), beta(c); out: y(n, c, inner), mean(c), rstd(c), running_mean(c) (read-write),
  // running_var(c) (read-write).
  BatchNormForward,
  // The gradients of BatchNormForward: with xhat = (x - mean) * rstd, g = dy * gamma and means over the m values
  // of a channel, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (training) or rstd * g (evaluation: the
  // statistics are constants); dgamma[c] = sum dy * xhat; dbeta[c] = sum dy.
  // in: x, gamma, mean, rstd, dy; out: dx(n, c, inner), dgamma(c), dbeta(c).
  BatchNormBackward,
  // y = x converted from storage type `from` to `to` (float32 <-> bf16/f16, rounded to nearest even; NaN and
  // infinities kept; float32 beyond f16's range becomes infinity). in: x(count); out: y(count). Mixed precision's
  // casts: a 16-bit layer's parameters before a matrix product, gradients back to float32.
  Cast,
  // y = alpha * x where the executor sets alpha = 1 / loss scale every step (StepScalars::loss_scale): float16's
  // dynamic loss scaling divides the parameter gradients by the scale before the optimizer. in: x; out: y (may
  // alias x). ElementwiseAttrs (beta unused).
  LossUnscale,
  Count_  // built-in ops end here; plugins' ops (op_table.hpp register_op) take the kinds after it
};

enum class Activation : uint8_t { relu, sigmoid, tanh, gelu, gelu_tanh, silu };
constexpr int kActivationCount = 6;
// gelu, gelu_tanh and silu: ActivationBackward reads the forward input x rather than the output y.
constexpr bool activation_backward_reads_input(Activation a) { return a >= Activation::gelu; }

struct GemmAttrs {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.f, beta = 0.f;
  int64_t batch = 1;  // BatchedGemm: how many (m, n) products; Gemm: 1
};
// BiasAdd, BiasGrad: tensors viewed as (outer, channels, inner).
struct BiasAttrs {
  int64_t outer = 0, channels = 0, inner = 1;
};
struct ConvAttrs {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t k = 0, r = 0, s = 0;         // filters (k, c, r, s)
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;  // top/left padding; bottom/right follows from oh, ow
  int64_t oh = 0, ow = 0;
};
struct PoolAttrs {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t kh = 0, kw = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t oh = 0, ow = 0;
};
struct ActivationAttrs {
  Activation act = Activation::relu;
  int64_t count = 0;
};
struct SoftmaxAttrs {
  int64_t rows = 0, cols = 0;
  bool causal = false;  // SoftmaxForward: row r sees columns j <= r % cols only
};
struct LossAttrs {
  int64_t rows = 0, cols = 0;
  float scale = 1.f;         // loss weight / batch size
  bool from_logits = true;   // BinaryCrossEntropy only
  bool soft_labels = false;  // SoftmaxCrossEntropy only: labels are (rows, cols) class probabilities, not indices
};
// Add, Mul, Axpby, Scale, Fill, Copy, SumSquares, ClipByGlobalNorm.
struct ElementwiseAttrs {
  int64_t count = 0;
  float alpha = 1.f, beta = 1.f;
};
struct ReduceAttrs {
  int64_t outer = 1, reduce = 0, inner = 1;
};
struct ConcatAttrs {
  int64_t outer = 1, inner = 1;
  std::vector<int64_t> sizes;  // per input (Concat) or output (Split)
};
struct DropoutAttrs {
  int64_t count = 0;
  float rate = 0.f;
  uint32_t seed = 0;
  uint32_t counter = 0;  // the executor sets it to the step number
};
struct SgdAttrs {
  int64_t count = 0;
  float lr = 0.01f, momentum = 0.f, weight_decay = 0.f;
  bool nesterov = false;
  float lr_scale = 1.f;  // a layer's learning_rate_scale: the executor sets lr to the step's rate times this
};
struct AdamAttrs {
  int64_t count = 0;
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-7f, weight_decay = 0.f;
  int64_t step = 1;             // t, set by the executor
  float decoupled_decay = 0.f;  // AdamW's weight decay: w *= 1 - lr * decoupled_decay before the Adam step
  float lr_scale = 1.f;         // a layer's learning_rate_scale: the executor sets lr to the step's rate times this
};
struct RmspropAttrs {
  int64_t count = 0;
  float lr = 1e-3f, rho = 0.9f, eps = 1e-7f, momentum = 0.f;
  float lr_scale = 1.f;  // a layer's learning_rate_scale: the executor sets lr to the step's rate times this
};
struct EmaAttrs {
  int64_t count = 0;
  float decay = 0.999f;
  // TensorFlow's ExponentialMovingAverage(decay, num_updates): with warmup, the executor sets decay to
  // min(max_decay, (1 + n) / (10 + n)) each step, n the 0-based step.
  bool warmup = false;
  float max_decay = 0.f;
};
struct EmbeddingAttrs {
  int64_t rows = 0, vocab = 0, dim = 0;
};
struct LayerNormAttrs {
  int64_t rows = 0, cols = 0;
  float eps = 1e-5f;
  bool bias = true;  // beta (and dbeta) present
};
// Permute: up to kPermuteMaxRank axes.
inline constexpr int kPermuteMaxRank = 6;
struct PermuteAttrs {
  int64_t rank = 0;
  std::array<int64_t, kPermuteMaxRank> dims{};  // x's shape; entries past rank are ignored
  std::array<int64_t, kPermuteMaxRank> perm{};  // y's axis i is x's axis perm[i], a permutation of [0, rank)
};
// BatchNormForward, BatchNormBackward: x viewed as (n, c, inner).
struct BatchNormAttrs {
  int64_t n = 0, c = 0, inner = 1;
  float eps = 1e-5f, momentum = 0.1f;
  bool training = true;  // batch statistics (and the running-statistics update) or the running statistics
  // The batch_norm layer's sync = true (PyTorch's SyncBatchNorm): under data_parallel the strategy computes this
  // node's statistics over every replica's rows instead of running the kernel; kernels ignore it.
  bool sync = false;
};
// Attributes of an op registered by a plugin (op_table.hpp): its own integers and floats, in its own order.
struct CustomAttrs {
  std::vector<int64_t> ints;
  std::vector<float> floats;
};

struct CastAttrs {
  int64_t count = 0;
  DType from = DType::f32, to = DType::f32;
};

using OpAttrs =
    std::variant<GemmAttrs, BiasAttrs, ConvAttrs, PoolAttrs, ActivationAttrs, SoftmaxAttrs, LossAttrs, ElementwiseAttrs,
                 ReduceAttrs, ConcatAttrs, DropoutAttrs, SgdAttrs, AdamAttrs, RmspropAttrs, EmaAttrs, EmbeddingAttrs,
                 LayerNormAttrs, PermuteAttrs, BatchNormAttrs, CustomAttrs, CastAttrs>;

// Stable, lower-case op names ("gemm", "conv2d_forward", ...), used in reports, repro lines and TOML
// (op_table.hpp holds every op's descriptor; these are lookups into it).
std::string_view op_name(OpKind k);
std::string_view activation_name(Activation a);

// Number of f32 elements of each input / output buffer of an op with these attrs (checked by executors and
// the conformance suite).
struct OpArity {
  std::vector<int64_t> in, out;
};
OpArity op_arity(OpKind k, const OpAttrs& a);

}  // namespace kiln
