// loss_unscale (float16's dynamic loss scaling): y = alpha * x, alpha = 1 / loss scale, read from the step's scalar
// slot when the call has one so a replayed CUDA graph uses the current scale.
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

__global__ void unscale_kernel(const float* x, float* y, int64_t n, float alpha_arg, const float* alpha_dev) {
  const float alpha = alpha_dev ? *alpha_dev : alpha_arg;
  KILN_GRID_STRIDE(i, n) y[i] = alpha * x[i];
}

}  // namespace

KILN_CUDA_KERNELS(loss_scale) {
  register_cuda_kernel(
      OpKind::LossUnscale,
      {.run =
           [](const CudaOp& op) {
             const auto& a = op.attrs<ElementwiseAttrs>();
             if (a.count == 0) return;
             unscale_kernel<<<grid_for(a.count), kThreads, 0, op.stream>>>(op.in(0), op.out(0), a.count, a.alpha,
                                                                           static_cast<const float*>(op.step_scalars));
             KILN_CUDA_LAUNCHED("unscale_kernel");
           },
       .pack_step_scalars = [](const OpCall& c,
                               void* slot) { put_step_scalars(std::get<ElementwiseAttrs>(c.attrs).alpha, slot); }});
}

}  // namespace kiln::cuda::kernels
