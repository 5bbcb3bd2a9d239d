// Convolutions through cuDNN's legacy API (cudnnConvolution{Forward,BackwardData,BackwardFilter}), with the
// algorithm chosen per shape by cudnnGet*Algorithm_v7 among those whose workspace fits the budget, deterministic
// ones first, FMA math unless TF32 was asked for (KILN_CUDA_TF32=1).
// Kiln's padding is top/left with the bottom/right implied by oh/ow, which may be asymmetric; cuDNN pads
// symmetrically. Such shapes run on an explicitly zero-padded copy of the input (kept in the workspace).
#pragma once
#include <cudnn.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>

#include "handles.hpp"
#include "kiln/device.hpp"

namespace kiln::cuda {

class ConvEngine {
 public:
  ConvEngine(cudnnHandle_t handle, bool tf32);
  ~ConvEngine();
  ConvEngine(const ConvEngine&) = delete;
  ConvEngine& operator=(const ConvEngine&) = delete;

  static Support supports(const ConvAttrs& a);
  // Workspace for the op with at most `budget` bytes for cuDNN itself (the padded copy comes on top).
  // Throws DeviceError when no algorithm runs the shape.
  size_t workspace_bytes(OpKind kind, const ConvAttrs& a, size_t budget);
  // Enqueues the op; call.workspace must hold workspace_bytes(kind, a, budget) for some budget.
  void run(OpKind kind, const ConvAttrs& a, const OpCall& call, cudaStream_t stream, size_t budget);
  // "conv2d_forward n=32 c=3 ...: algo 1, FMA math, 1.2 MiB" for each planned shape (reports, tests).
  std::string describe() const;

 private:
  struct Plan;
  using Key = std::array<int64_t, 16>;
  const Plan& plan(OpKind kind, const ConvAttrs& a, size_t budget);
  std::unique_ptr<Plan> build(OpKind kind, const ConvAttrs& a, size_t budget, bool padded, size_t& smallest);

  cudnnHandle_t handle_;
  bool tf32_;
  mutable std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace kiln::cuda
