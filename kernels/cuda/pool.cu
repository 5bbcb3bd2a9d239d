// Max and average pooling. Windows are clipped to the image (padding never wins, an empty window gives 0).
// The backward passes gather per input element instead of scattering per output, so overlapping windows need
// no atomics: each dx element adds its contributions in output row-major order, like the reference.
#include <string>

#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

struct PoolShape {
  int64_t n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow;
};

// The valid input rows/cols [y0, y1) x [x0, x1) of output (oy, ox).
struct Window {
  int64_t y0, y1, x0, x1;
};
__device__ __forceinline__ Window window_of(const PoolShape& p, int64_t oy, int64_t ox) {
  const int64_t ty = oy * p.sh - p.ph, tx = ox * p.sw - p.pw;
  return {max(ty, int64_t{0}), min(ty + p.kh, p.h), max(tx, int64_t{0}), min(tx + p.kw, p.w)};
}

// Outputs whose windows contain input coordinate i along one axis: [lo, hi], possibly empty.
__device__ __forceinline__ void outputs_covering(int64_t i, int64_t k, int64_t stride, int64_t pad, int64_t outs,
                                                 int64_t& lo, int64_t& hi) {
  const int64_t first = i + pad - k + 1;  // smallest o*stride that still reaches i
  lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  hi = min((i + pad) / stride, outs - 1);
}

__global__ void max_pool_forward_kernel(PoolShape p, const float* x, float* y, int64_t total) {
  KILN_GRID_STRIDE(o, total) {
    const int64_t ox = o % p.ow, oy = (o / p.ow) % p.oh, plane = o / (p.ow * p.oh);
    const float* xp = x + plane * p.h * p.w;
    const Window w = window_of(p, oy, ox);
    float best = 0.f;
    bool found = false;
    for (int64_t iy = w.y0; iy < w.y1; ++iy)
      for (int64_t ix = w.x0; ix < w.x1; ++ix) {
        const float v = xp[iy * p.w + ix];
        if (!found || v > best) best = v;
        found = true;
      }
    y[o] = best;
  }
}

__global__ void avg_pool_forward_kernel(PoolShape p, const float* x, float* y, int64_t total) {
  KILN_GRID_STRIDE(o, total) {
    const int64_t ox = o % p.ow, oy = (o / p.ow) % p.oh, plane = o / (p.ow * p.oh);
    const float* xp = x + plane * p.h * p.w;
    const Window w = window_of(p, oy, ox);
    double acc = 0;
    for (int64_t iy = w.y0; iy < w.y1; ++iy)
      for (int64_t ix = w.x0; ix < w.x1; ++ix) acc += xp[iy * p.w + ix];
    const int64_t count = max(w.y1 - w.y0, int64_t{0}) * max(w.x1 - w.x0, int64_t{0});
    y[o] = count > 0 ? static_cast<float>(acc / static_cast<double>(count)) : 0.f;
  }
}

// dx(i) = sum over outputs o whose window's first element equal to y(o) is i, of dy(o).
__global__ void max_pool_backward_kernel(PoolShape p, const float* x, const float* y, const float* dy, float* dx,
                                         int64_t total) {
  KILN_GRID_STRIDE(i, total) {
    const int64_t ix = i % p.w, iy = (i / p.w) % p.h, plane = i / (p.w * p.h);
    const float* xp = x + plane * p.h * p.w;
    const int64_t obase = plane * p.oh * p.ow;
    int64_t oy0, oy1, ox0, ox1;
    outputs_covering(iy, p.kh, p.sh, p.ph, p.oh, oy0, oy1);
    outputs_covering(ix, p.kw, p.sw, p.pw, p.ow, ox0, ox1);
    float acc = 0.f;
    for (int64_t oy = oy0; oy <= oy1; ++oy)
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        const int64_t o = obase + oy * p.ow + ox;
        const float target = y[o];
        const Window w = window_of(p, oy, ox);
        // Find the window's first element equal to y(o); it earns the gradient only if it is this one.
        int64_t hit = -1;
        for (int64_t wy = w.y0; wy < w.y1 && hit < 0; ++wy)
          for (int64_t wx = w.x0; wx < w.x1; ++wx)
            if (xp[wy * p.w + wx] == target) {
              hit = wy * p.w + wx;
              break;
            }
        if (hit == iy * p.w + ix) acc += dy[o];
      }
    dx[i] = acc;
  }
}

__global__ void avg_pool_backward_kernel(PoolShape p, const float* dy, float* dx, int64_t total) {
  KILN_GRID_STRIDE(i, total) {
    const int64_t ix = i % p.w, iy = (i / p.w) % p.h, plane = i / (p.w * p.h);
    const int64_t obase = plane * p.oh * p.ow;
    int64_t oy0, oy1, ox0, ox1;
    outputs_covering(iy, p.kh, p.sh, p.ph, p.oh, oy0, oy1);
    outputs_covering(ix, p.kw, p.sw, p.pw, p.ow, ox0, ox1);
    float acc = 0.f;
    for (int64_t oy = oy0; oy <= oy1; ++oy)
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        const Window w = window_of(p, oy, ox);
        const int64_t count = (w.y1 - w.y0) * (w.x1 - w.x0);  // > 0: the window holds (iy, ix)
        acc += static_cast<float>(static_cast<double>(dy[obase + oy * p.ow + ox]) / static_cast<double>(count));
      }
    dx[i] = acc;
  }
}

void max_pool_forward(cudaStream_t s, const PoolShape& p, const float* x, float* y) {
  const int64_t total = p.n * p.c * p.oh * p.ow;
  if (total == 0) return;
  max_pool_forward_kernel<<<grid_for(total), kThreads, 0, s>>>(p, x, y, total);
  KILN_CUDA_LAUNCHED("max_pool_forward_kernel");
}

void avg_pool_forward(cudaStream_t s, const PoolShape& p, const float* x, float* y) {
  const int64_t total = p.n * p.c * p.oh * p.ow;
  if (total == 0) return;
  avg_pool_forward_kernel<<<grid_for(total), kThreads, 0, s>>>(p, x, y, total);
  KILN_CUDA_LAUNCHED("avg_pool_forward_kernel");
}

void max_pool_backward(cudaStream_t s, const PoolShape& p, const float* x, const float* y, const float* dy, float* dx) {
  const int64_t total = p.n * p.c * p.h * p.w;
  if (total == 0) return;
  max_pool_backward_kernel<<<grid_for(total), kThreads, 0, s>>>(p, x, y, dy, dx, total);
  KILN_CUDA_LAUNCHED("max_pool_backward_kernel");
}

void avg_pool_backward(cudaStream_t s, const PoolShape& p, const float* dy, float* dx) {
  const int64_t total = p.n * p.c * p.h * p.w;
  if (total == 0) return;
  avg_pool_backward_kernel<<<grid_for(total), kThreads, 0, s>>>(p, dy, dx, total);
  KILN_CUDA_LAUNCHED("avg_pool_backward_kernel");
}

PoolShape pool_shape(const PoolAttrs& a) {
  return {a.n, a.c, a.h, a.w, a.kh, a.kw, a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.oh, a.ow};
}

Support pool_support(OpKind, const OpAttrs& attrs) {
  const auto& p = std::get<PoolAttrs>(attrs);
  if (p.stride_h < 1 || p.stride_w < 1)
    return {false,
            "pooling strides must be >= 1, found " + std::to_string(p.stride_h) + "x" + std::to_string(p.stride_w)};
  if (p.pad_h < 0 || p.pad_w < 0 || p.kh < 0 || p.kw < 0) return {false, "pooling window and padding must be >= 0"};
  return {};
}

}  // namespace

KILN_CUDA_KERNELS(pool) {
  register_cuda_kernel(OpKind::MaxPoolForward, {.run =
                                                    [](const CudaOp& op) {
                                                      max_pool_forward(op.stream, pool_shape(op.attrs<PoolAttrs>()),
                                                                       op.in(0), op.out(0));
                                                    },
                                                .support = pool_support});
  register_cuda_kernel(OpKind::MaxPoolBackward, {.run =
                                                     [](const CudaOp& op) {
                                                       max_pool_backward(op.stream, pool_shape(op.attrs<PoolAttrs>()),
                                                                         op.in(0), op.in(1), op.in(2), op.out(0));
                                                     },
                                                 .support = pool_support});
  register_cuda_kernel(OpKind::AvgPoolForward, {.run =
                                                    [](const CudaOp& op) {
                                                      avg_pool_forward(op.stream, pool_shape(op.attrs<PoolAttrs>()),
                                                                       op.in(0), op.out(0));
                                                    },
                                                .support = pool_support});
  register_cuda_kernel(OpKind::AvgPoolBackward, {.run =
                                                     [](const CudaOp& op) {
                                                       avg_pool_backward(op.stream, pool_shape(op.attrs<PoolAttrs>()),
                                                                         op.in(0), op.out(0));
                                                     },
                                                 .support = pool_support});
}

}  // namespace kiln::cuda::kernels
