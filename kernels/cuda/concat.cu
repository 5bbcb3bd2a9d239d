// Copies without a kernel of their own: Copy, and Concat / Split as 2-D strided copies on the op stream.
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

// Part j is a (outer x sizes[j]*inner) block of rows inside the whole's (outer x total*inner) rows.
void concat_or_split(const CudaOp& op) {
  const auto& a = op.attrs<ConcatAttrs>();
  const bool concat = op.call.kind == OpKind::Concat;
  int64_t total = 0;
  for (int64_t v : a.sizes) total += v;
  const size_t whole_pitch = static_cast<size_t>(total * a.inner) * sizeof(float);
  size_t start = 0;  // byte offset of part j inside a row of the whole
  for (size_t j = 0; j < a.sizes.size(); ++j) {
    const size_t width = static_cast<size_t>(a.sizes[j] * a.inner) * sizeof(float);
    if (width > 0 && a.outer > 0) {
      char* whole =
          concat ? reinterpret_cast<char*>(op.out(0)) : const_cast<char*>(reinterpret_cast<const char*>(op.in(0)));
      char* part =
          concat ? const_cast<char*>(reinterpret_cast<const char*>(op.in(j))) : reinterpret_cast<char*>(op.out(j));
      if (concat)
        KILN_CUDA_CHECK(cudaMemcpy2DAsync(whole + start, whole_pitch, part, width, width, static_cast<size_t>(a.outer),
                                          cudaMemcpyDeviceToDevice, op.stream));
      else
        KILN_CUDA_CHECK(cudaMemcpy2DAsync(part, width, whole + start, whole_pitch, width, static_cast<size_t>(a.outer),
                                          cudaMemcpyDeviceToDevice, op.stream));
    }
    start += width;
  }
}

}  // namespace

KILN_CUDA_KERNELS(concat) {
  register_cuda_kernel(
      OpKind::Copy, {.run = [](const CudaOp& op) {
        const auto n = static_cast<size_t>(op.attrs<ElementwiseAttrs>().count) * sizeof(float);
        if (n > 0) KILN_CUDA_CHECK(cudaMemcpyAsync(op.out(0), op.in(0), n, cudaMemcpyDeviceToDevice, op.stream));
      }});
  register_cuda_kernel(OpKind::Concat, {.run = concat_or_split});
  register_cuda_kernel(OpKind::Split, {.run = concat_or_split});
}

}  // namespace kiln::cuda::kernels
