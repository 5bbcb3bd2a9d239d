// Fused losses (value + gradient in one pass): softmax cross-entropy, MSE, binary cross-entropy. Per-row or
// per-block partial sums go to the workspace in double; one block then adds them in a fixed order, so the loss
// is the same bits on every run (no atomics).
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

// softmax_cross_entropy_soft: labels are (rows, cols) class probabilities (LossAttrs::soft_labels).
enum class Loss { softmax_cross_entropy, mse, bce_logits, bce_probs, softmax_cross_entropy_soft };

constexpr int64_t kElementsPerBlock = kThreads * 8;
constexpr int64_t kMaxPartials = 1024;

int64_t elementwise_partials(int64_t n) {
  return std::clamp<int64_t>((n + kElementsPerBlock - 1) / kElementsPerBlock, 1, kMaxPartials);
}

// One block per row: row loss into partial[r], gradient written in place. soft: labels are (rows, cols) class
// probabilities (one-hot included), the row's term sum_j t_j (lse - x_j), dx = scale * (softmax * sum(t) - t).
__global__ void softmax_xent_kernel(const float* x, const float* labels, float* dx, double* partial, int64_t rows,
                                    int64_t cols, float scale_arg, const float* scale_dev, bool soft) {
  // The scale from the step's scalar slot when there is one (float16's loss scale changes between replays).
  const double scale = scale_dev ? static_cast<double>(*scale_dev) : static_cast<double>(scale_arg);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float* dr = dx + r * cols;
    double mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) mx = fmax(mx, static_cast<double>(xr[j]));
    mx = block_reduce(mx, MaxOp{});
    double sum = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += exp(static_cast<double>(xr[j]) - mx);
    sum = block_reduce(sum, SumOp{});
    const double lse = mx + log(sum);
    if (soft) {
      const float* tr = labels + r * cols;
      double tsum = 0, term = 0;
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        tsum += static_cast<double>(tr[j]);
        term += static_cast<double>(tr[j]) * (lse - static_cast<double>(xr[j]));
      }
      tsum = block_reduce(tsum, SumOp{});
      term = block_reduce(term, SumOp{});
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        dr[j] = static_cast<float>(scale * (exp(static_cast<double>(xr[j]) - lse) * tsum - static_cast<double>(tr[j])));
      if (threadIdx.x == 0) partial[r] = term;
      continue;
    }
    const float lf = labels[r];
    const bool ok = lf >= 0.0f && lf < static_cast<float>(cols);  // NaN labels fail both tests
    const int64_t label = ok ? static_cast<int64_t>(lf) : -1;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dr[j] = static_cast<float>(scale * (exp(static_cast<double>(xr[j]) - lse) - (j == label ? 1.0 : 0.0)));
    if (threadIdx.x == 0) partial[r] = ok ? lse - xr[label] : nan("");
  }
}

// kind: 0 = MSE, 1 = BCE from logits, 2 = BCE from probabilities. Block b sums its grid-stride share.
__global__ void pointwise_loss_kernel(int kind, const float* pred, const float* target, float* grad, double* partial,
                                      int64_t n, double per_arg, const float* scale_dev, double cols) {
  const double per = scale_dev ? static_cast<double>(*scale_dev) / cols : per_arg;
  double acc = 0;
  KILN_GRID_STRIDE(i, n) {
    const double p = pred[i], t = target[i];
    double g;
    if (kind == 0) {
      acc += (p - t) * (p - t);
      g = 2.0 * (p - t);
    } else if (kind == 1) {
      acc += fmax(p, 0.0) - p * t + log1p(exp(-fabs(p)));
      g = 1.0 / (1.0 + exp(-p)) - t;
    } else {
      const double pc = fmin(fmax(p, 1e-7), 1.0 - 1e-7);
      acc += -(t * log(pc) + (1.0 - t) * log(1.0 - pc));
      g = (pc - t) / (pc * (1.0 - pc));
    }
    grad[i] = static_cast<float>(per * g);
  }
  acc = block_reduce(acc, SumOp{});
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// value = factor * sum(partial[0..count)), summed by one block in a fixed order.
__global__ void finish_sum_kernel(const double* partial, int64_t count, double factor_arg, const float* scale_dev,
                                  double div, float* value) {
  const double factor = scale_dev ? static_cast<double>(*scale_dev) / div : factor_arg;
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_reduce(acc, SumOp{});
  if (threadIdx.x == 0) value[0] = static_cast<float>(factor * acc);
}

// The value is summed through `workspace`, which must hold loss_workspace_bytes(kind, rows, cols).
size_t loss_workspace_bytes(Loss kind, int64_t rows, int64_t cols) {
  const int64_t partials = kind == Loss::softmax_cross_entropy || kind == Loss::softmax_cross_entropy_soft
                               ? std::max<int64_t>(rows, 1)
                               : elementwise_partials(rows * cols);
  return static_cast<size_t>(partials) * sizeof(double);
}

void loss(cudaStream_t s, Loss kind, const float* pred, const float* target, float* value, float* grad, int64_t rows,
          int64_t cols, float scale, const float* scale_dev, void* workspace) {
  auto* partial = static_cast<double*>(workspace);
  if (kind == Loss::softmax_cross_entropy || kind == Loss::softmax_cross_entropy_soft) {
    if (rows > 0 && cols > 0) {
      softmax_xent_kernel<<<static_cast<unsigned>(std::min<int64_t>(rows, 65535)), row_threads(cols), 0, s>>>(
          pred, target, grad, partial, rows, cols, scale, scale_dev, kind == Loss::softmax_cross_entropy_soft);
      KILN_CUDA_LAUNCHED("softmax_xent_kernel");
    }
    // rows x 0 logits: every row has an out-of-range label, like the reference (NaN); no rows: loss 0.
    const int64_t count = cols > 0 ? rows : 0;
    if (rows > 0 && cols == 0) {
      fill(s, value, 1, nanf(""));
      return;
    }
    finish_sum_kernel<<<1, kThreads, 0, s>>>(partial, count, static_cast<double>(scale), scale_dev, 1.0, value);
    KILN_CUDA_LAUNCHED("finish_sum_kernel");
    return;
  }
  const int64_t n = rows * cols;
  const double per = cols > 0 ? static_cast<double>(scale) / static_cast<double>(cols) : 0.0;
  const int64_t partials = elementwise_partials(n);
  const int k = kind == Loss::mse ? 0 : kind == Loss::bce_logits ? 1 : 2;
  const double div = cols > 0 ? static_cast<double>(cols) : 1.0;
  const float* sdev = cols > 0 ? scale_dev : nullptr;
  pointwise_loss_kernel<<<static_cast<unsigned>(partials), kThreads, 0, s>>>(k, pred, target, grad, partial, n, per,
                                                                             sdev, div);
  KILN_CUDA_LAUNCHED("pointwise_loss_kernel");
  finish_sum_kernel<<<1, kThreads, 0, s>>>(partial, partials, per, sdev, div, value);
  KILN_CUDA_LAUNCHED("finish_sum_kernel");
}

Loss loss_kind(OpKind kind, const LossAttrs& a) {
  if (kind == OpKind::SoftmaxCrossEntropy)
    return a.soft_labels ? Loss::softmax_cross_entropy_soft : Loss::softmax_cross_entropy;
  if (kind == OpKind::MeanSquaredError) return Loss::mse;
  return a.from_logits ? Loss::bce_logits : Loss::bce_probs;
}

}  // namespace

KILN_CUDA_KERNELS(loss) {
  const CudaKernel fused{
      .run =
          [](const CudaOp& op) {
            const auto& a = op.attrs<LossAttrs>();
            loss(op.stream, loss_kind(op.call.kind, a), op.in(0), op.in(1), op.out(0), op.out(1), a.rows, a.cols,
                 a.scale, static_cast<const float*>(op.step_scalars), op.workspace());
          },
      .workspace =
          [](const CudaDevice&, const OpCall& c) {
            const auto& a = std::get<LossAttrs>(c.attrs);
            return loss_workspace_bytes(loss_kind(c.kind, a), a.rows, a.cols);
          },
      .workspace_required = true,
      // The scale (the loss weight times float16's loss scale) is a per-step scalar.
      .pack_step_scalars = [](const OpCall& c,
                              void* slot) { put_step_scalars(std::get<LossAttrs>(c.attrs).scale, slot); }};
  for (OpKind k : {OpKind::SoftmaxCrossEntropy, OpKind::MeanSquaredError, OpKind::BinaryCrossEntropy})
    register_cuda_kernel(k, fused);
}

}  // namespace kiln::cuda::kernels
