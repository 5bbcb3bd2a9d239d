// Embedding lookup and its gradient. The gradient gives each table element one thread that walks the rows in
// order, summing in double: deterministic, no atomics (O(vocab * dim * rows); fine for character and small
// word vocabularies; a sorted segmented sum is the faster path for large ones).
#include <cmath>

#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

__device__ int64_t row_of(float id, int64_t vocab) {
  if (!(id >= 0.f) || id != floorf(id) || id >= static_cast<float>(vocab)) return -1;
  return static_cast<int64_t>(id);
}

__global__ void embedding_forward_kernel(const float* ids, const float* table, float* y, int64_t rows, int64_t vocab,
                                         int64_t dim) {
  KILN_GRID_STRIDE(idx, rows * dim) {
    const int64_t r = idx / dim, j = idx % dim;
    const int64_t v = row_of(ids[r], vocab);
    y[idx] = v < 0 ? nanf("") : table[v * dim + j];
  }
}

__global__ void embedding_backward_kernel(const float* ids, const float* dy, float* dtable, int64_t rows, int64_t vocab,
                                          int64_t dim) {
  KILN_GRID_STRIDE(idx, vocab * dim) {
    const int64_t v = idx / dim, j = idx % dim;
    double acc = 0;
    for (int64_t r = 0; r < rows; ++r)
      if (row_of(ids[r], vocab) == v) acc += dy[r * dim + j];
    dtable[idx] = static_cast<float>(acc);
  }
}

void embedding_forward(cudaStream_t s, const float* ids, const float* table, float* y, int64_t rows, int64_t vocab,
                       int64_t dim) {
  if (rows * dim == 0) return;
  embedding_forward_kernel<<<grid_for(rows * dim), kThreads, 0, s>>>(ids, table, y, rows, vocab, dim);
  KILN_CUDA_LAUNCHED("embedding_forward_kernel");
}

void embedding_backward(cudaStream_t s, const float* ids, const float* dy, float* dtable, int64_t rows, int64_t vocab,
                        int64_t dim) {
  if (vocab * dim == 0) return;
  embedding_backward_kernel<<<grid_for(vocab * dim), kThreads, 0, s>>>(ids, dy, dtable, rows, vocab, dim);
  KILN_CUDA_LAUNCHED("embedding_backward_kernel");
}

}  // namespace

KILN_CUDA_KERNELS(embedding) {
  register_cuda_kernel(OpKind::EmbeddingForward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<EmbeddingAttrs>();
                         embedding_forward(op.stream, op.in(0), op.in(1), op.out(0), a.rows, a.vocab, a.dim);
                       }});
  register_cuda_kernel(OpKind::EmbeddingBackward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<EmbeddingAttrs>();
                         embedding_backward(op.stream, op.in(0), op.in(1), op.out(0), a.rows, a.vocab, a.dim);
                       }});
}

}  // namespace kiln::cuda::kernels
