// Elementwise kernels: add/mul/axpby/scale/fill and the registration of their ops. Built with --fmad=false: no
// contraction, so a*x + b*y rounds like the CPU reference does.
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n, float alpha, float beta) {
  KILN_GRID_STRIDE(i, n) y[i] = alpha * a[i] + beta * b[i];
}

__global__ void mul_kernel(const float* a, const float* b, float* y, int64_t n) {
  KILN_GRID_STRIDE(i, n) y[i] = a[i] * b[i];
}

__global__ void axpby_kernel(const float* x, float* y, int64_t n, float alpha, float beta) {
  KILN_GRID_STRIDE(i, n) y[i] = alpha * x[i] + beta * y[i];
}

__global__ void scale_kernel(const float* x, float* y, int64_t n, float alpha) {
  KILN_GRID_STRIDE(i, n) y[i] = alpha * x[i];
}

__global__ void fill_kernel(float* y, int64_t n, float value) { KILN_GRID_STRIDE(i, n) y[i] = value; }

void add(cudaStream_t s, const float* a, const float* b, float* y, int64_t n, float alpha, float beta) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, s>>>(a, b, y, n, alpha, beta);
  KILN_CUDA_LAUNCHED("add_kernel");
}

void mul(cudaStream_t s, const float* a, const float* b, float* y, int64_t n) {
  if (n == 0) return;
  mul_kernel<<<grid_for(n), kThreads, 0, s>>>(a, b, y, n);
  KILN_CUDA_LAUNCHED("mul_kernel");
}

void axpby(cudaStream_t s, const float* x, float* y, int64_t n, float alpha, float beta) {
  if (n == 0) return;
  axpby_kernel<<<grid_for(n), kThreads, 0, s>>>(x, y, n, alpha, beta);
  KILN_CUDA_LAUNCHED("axpby_kernel");
}

}  // namespace

void scale(cudaStream_t s, const float* x, float* y, int64_t n, float alpha) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, s>>>(x, y, n, alpha);
  KILN_CUDA_LAUNCHED("scale_kernel");
}

void fill(cudaStream_t s, float* y, int64_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, s>>>(y, n, value);
  KILN_CUDA_LAUNCHED("fill_kernel");
}

KILN_CUDA_KERNELS(elementwise) {
  register_cuda_kernel(OpKind::Add, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ElementwiseAttrs>();
                         add(op.stream, op.in(0), op.in(1), op.out(0), a.count, a.alpha, a.beta);
                       }});
  register_cuda_kernel(OpKind::Mul, {.run = [](const CudaOp& op) {
                         mul(op.stream, op.in(0), op.in(1), op.out(0), op.attrs<ElementwiseAttrs>().count);
                       }});
  register_cuda_kernel(OpKind::Axpby, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ElementwiseAttrs>();
                         axpby(op.stream, op.in(0), op.out(0), a.count, a.alpha, a.beta);
                       }});
  register_cuda_kernel(OpKind::Scale, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ElementwiseAttrs>();
                         scale(op.stream, op.in(0), op.out(0), a.count, a.alpha);
                       }});
  register_cuda_kernel(OpKind::Fill, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ElementwiseAttrs>();
                         fill(op.stream, op.out(0), a.count, a.alpha);
                       }});
}

}  // namespace kiln::cuda::kernels
