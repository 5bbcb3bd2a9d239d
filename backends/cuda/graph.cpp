#include "graph.hpp"

#include <cstring>
#include <type_traits>
#include <variant>

#include "check.hpp"
#include "cuda_kernel.hpp"
#include "kiln/error.hpp"
#include "kiln/op_table.hpp"

namespace kiln::cuda {
namespace {

constexpr size_t kMaxSequences = 16;
constexpr int kMaxMismatches = 3;
constexpr size_t kSlot = kStepScalarSlotBytes;

template <class T>
void put(std::string& k, const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  k.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void put_view(std::string& k, const BufferView& v) {
  put(k, v.block ? v.block->id : uint64_t{0});
  put(k, v.offset);
  put(k, v.bytes);
  // The same bytes read as another storage type take other kernels (or conversions around them).
  put(k, v.dtype);
}

}  // namespace

std::string call_key(const OpCall& call) {
  std::string k;
  k.reserve(64 + 24 * (call.in.size() + call.out.size()));
  put(k, call.in.size());
  for (const auto& v : call.in) put_view(k, v);
  put(k, call.out.size());
  for (const auto& v : call.out) put_view(k, v);
  put_view(k, call.workspace);
  append_op_key(call.kind, call.attrs, k);  // the op table's key: static attributes, not the step scalars
  return k;
}

GraphRecorder::GraphRecorder(cudaStream_t stream, Execute execute) : stream_(stream), execute_(std::move(execute)) {}

GraphRecorder::~GraphRecorder() { clear(); }

void GraphRecorder::clear() {
  if (capturing_) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    GraphHandle discard(g);
    cudaGetLastError();
    capturing_ = false;
  }
  mode_ = Mode::idle;
  seq_ = nullptr;
  pending_.clear();
  pending_keys_.clear();
  sequences_.clear();
}

void* GraphRecorder::host_slot(size_t i) const { return static_cast<char*>(seq_->host_slots.get()) + i * kSlot; }

const void* GraphRecorder::device_slot(size_t i) const {
  return static_cast<const char*>(seq_->device_slots.get()) + i * kSlot;
}

void GraphRecorder::begin(uint64_t step_id) {
  if (mode_ != Mode::idle) {
    // The previous step did not reach end_sequence() (an exception unwound it): drop what it left.
    if (capturing_) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(stream_, &g);
      GraphHandle discard(g);
      cudaGetLastError();
      capturing_ = false;
    }
    if (seq_ && mode_ == Mode::capture) seq_->state = State::eager_only;
    mode_ = Mode::idle;
  }
  if (sequences_.size() >= kMaxSequences && !sequences_.count(step_id)) sequences_.clear();
  auto [it, fresh] = sequences_.try_emplace(step_id);
  seq_ = &it->second;
  pending_.clear();
  pending_keys_.clear();
  next_slot_ = segment_first_slot_ = replay_segment_ = 0;
  capture_broken_ = false;
  capture_problem_.clear();
  if (fresh || (seq_->state == State::observed && !seq_->counted)) {
    seq_->scalar_calls = 0;
    mode_ = Mode::observe;
    return;
  }
  if (seq_->state == State::eager_only) {
    mode_ = Mode::eager;
    return;
  }
  if (seq_->upload_pending) {  // host_slots is about to be rewritten
    KILN_CUDA_CHECK(cudaEventSynchronize(seq_->uploaded.get()));
    seq_->upload_pending = false;
  }
  if (seq_->state == State::captured) {
    mode_ = Mode::replay;
    return;
  }
  // Second run of this step: capture it. The scalar buffers are sized from the observed run.
  seq_->segments.clear();
  try {
    if (seq_->scalar_calls > seq_->slot_capacity) {
      seq_->device_slots.reset();
      seq_->host_slots.reset();
      void* d = nullptr;
      void* h = nullptr;
      KILN_CUDA_CHECK(cudaMalloc(&d, seq_->scalar_calls * kSlot));
      seq_->device_slots.reset(d);
      KILN_CUDA_CHECK(cudaHostAlloc(&h, seq_->scalar_calls * kSlot, cudaHostAllocDefault));
      seq_->host_slots.reset(h);
      seq_->slot_capacity = seq_->scalar_calls;
    }
    if (!seq_->uploaded) {
      cudaEvent_t e = nullptr;
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      seq_->uploaded.reset(e);
    }
  } catch (const DeviceError& e) {  // graphs are an optimization: without room for the scalars, stay eager
    seq_->state = State::eager_only;
    stats_.capture_failures++;
    stats_.last_problem = std::string("no memory for the step's scalar buffer: ") + e.what();
    mode_ = Mode::eager;
    return;
  }
  mode_ = Mode::capture;
}

void GraphRecorder::run(const OpCall& call) {
  alignas(16) unsigned char scratch[kSlot];
  switch (mode_) {
    case Mode::idle:
    case Mode::eager:
      execute_(call, nullptr);
      return;
    case Mode::observe:
      if (pack_step_scalars(call, scratch)) ++seq_->scalar_calls;
      execute_(call, nullptr);
      return;
    case Mode::capture: {
      if (!capturing_ && !capture_broken_) begin_capture_segment();
      const void* scalars = nullptr;
      if (pack_step_scalars(call, scratch)) {
        if (next_slot_ < seq_->scalar_calls) {
          std::memcpy(host_slot(next_slot_), scratch, kSlot);
          scalars = device_slot(next_slot_);
        } else if (!capture_broken_) {
          capture_broken_ = true;
          capture_problem_ = "the step has more ops with per-step scalars than on its first run";
        }
        ++next_slot_;
      }
      pending_.push_back(call);
      pending_keys_.push_back(call_key(call));
      if (capture_broken_) return;
      try {
        execute_(call, scalars);
      } catch (const std::exception& e) {  // rerun eagerly at the boundary, where a real error surfaces again
        capture_broken_ = true;
        capture_problem_ = std::string(op_name(call.kind)) + ": " + e.what();
      }
      return;
    }
    case Mode::replay: {
      const auto& segs = seq_->segments;
      const size_t i = pending_.size();
      if (replay_segment_ >= segs.size() || i >= segs[replay_segment_].keys.size() ||
          call_key(call) != segs[replay_segment_].keys[i]) {
        fall_back("op " + std::string(op_name(call.kind)) + " (call " + std::to_string(i) + " of segment " +
                      std::to_string(replay_segment_) + ") differs from the recorded step",
                  &call);
        return;
      }
      if (pack_step_scalars(call, scratch)) {
        if (next_slot_ >= seq_->scalar_calls) {
          fall_back("more ops with per-step scalars than recorded", &call);
          return;
        }
        std::memcpy(host_slot(next_slot_++), scratch, kSlot);
      }
      pending_.push_back(call);
      return;
    }
  }
}

void GraphRecorder::begin_capture_segment() {
  segment_first_slot_ = next_slot_;
  const cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    cudaGetLastError();
    capture_broken_ = true;
    capture_problem_ = "cudaStreamBeginCapture: " + cuda_error_text(e);
    return;
  }
  capturing_ = true;
}

void GraphRecorder::finish_capture_segment() {
  GraphHandle graph;
  if (capturing_) {
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream_, &g);
    graph.reset(g);
    capturing_ = false;
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (!capture_broken_) capture_problem_ = "cudaStreamEndCapture: " + cuda_error_text(e);
      capture_broken_ = true;
    }
  }
  if (pending_.empty()) return;
  if (!capture_broken_) {
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph.get(), 0);
    if (e == cudaSuccess) {
      Segment seg;
      seg.keys = std::move(pending_keys_);
      seg.exec.reset(exec);
      seg.first_slot = segment_first_slot_;
      seg.slots = std::min(next_slot_, seq_->scalar_calls) - segment_first_slot_;
      seq_->segments.push_back(std::move(seg));
      pending_.clear();
      pending_keys_.clear();
      launch_segment(*seq_, seq_->segments.back());
      return;
    }
    cudaGetLastError();
    capture_broken_ = true;
    capture_problem_ = "cudaGraphInstantiate: " + cuda_error_text(e);
  }
  // Nothing of this segment has run: run it eagerly, and the rest of the step too. A capture that failed once
  // fails again, so this step id stays eager.
  stats_.capture_failures++;
  stats_.last_problem = "CUDA graph capture failed (" + capture_problem_ + "); the step runs eagerly";
  seq_->state = State::eager_only;
  seq_->segments.clear();
  mode_ = Mode::eager;
  std::vector<OpCall> calls = std::move(pending_);
  pending_.clear();
  pending_keys_.clear();
  for (const auto& c : calls) execute_(c, nullptr);
}

void GraphRecorder::launch_segment(Sequence& seq, const Segment& seg) {
  if (seg.slots > 0) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(const_cast<void*>(device_slot(seg.first_slot)), host_slot(seg.first_slot),
                                    seg.slots * kSlot, cudaMemcpyHostToDevice, stream_));
    KILN_CUDA_CHECK(cudaEventRecord(seq.uploaded.get(), stream_));
    seq.upload_pending = true;
  }
  KILN_CUDA_CHECK(cudaGraphLaunch(seg.exec.get(), stream_));
}

void GraphRecorder::replay_flush() {
  if (pending_.empty()) return;
  const auto& segs = seq_->segments;
  if (replay_segment_ >= segs.size() || pending_.size() != segs[replay_segment_].keys.size()) {
    fall_back("segment " + std::to_string(replay_segment_) + " has " + std::to_string(pending_.size()) +
                  " ops before a copy or synchronize, the recorded step had " +
                  (replay_segment_ < segs.size() ? std::to_string(segs[replay_segment_].keys.size()) : "none"),
              nullptr);
    return;
  }
  launch_segment(*seq_, segs[replay_segment_]);
  ++replay_segment_;
  pending_.clear();
}

void GraphRecorder::fall_back(const std::string& why, const OpCall* current) {
  stats_.mismatches++;
  stats_.last_problem = "CUDA graph replay abandoned: " + why;
  // Launched graphs may still be running; destroying their execs is safe (freed when they complete).
  seq_->segments.clear();
  seq_->state = ++seq_->mismatches >= kMaxMismatches ? State::eager_only : State::observed;
  seq_->counted = false;  // recount the per-step scalars on the next run before capturing again
  mode_ = Mode::eager;
  std::vector<OpCall> calls = std::move(pending_);
  pending_.clear();
  for (const auto& c : calls) execute_(c, nullptr);
  if (current) execute_(*current, nullptr);
}

void GraphRecorder::boundary() {
  if (mode_ == Mode::capture) {
    if (capturing_ || !pending_.empty()) finish_capture_segment();
  } else if (mode_ == Mode::replay) {
    replay_flush();
  }
}

void GraphRecorder::end() {
  switch (mode_) {
    case Mode::idle:
      return;  // end without begin: nothing to close
    case Mode::eager:
      stats_.eager_steps++;
      break;
    case Mode::observe:
      seq_->counted = true;
      stats_.eager_steps++;
      break;
    case Mode::capture:
      finish_capture_segment();
      if (mode_ == Mode::capture) {
        seq_->state = State::captured;
        stats_.captures++;
      }
      break;
    case Mode::replay:
      replay_flush();
      if (mode_ == Mode::replay) {
        if (replay_segment_ == seq_->segments.size()) {
          stats_.replays++;
        } else {  // this step ended before the recorded one did: record it again next time
          fall_back("the step ended after " + std::to_string(replay_segment_) + " of " +
                        std::to_string(seq_->segments.size()) + " recorded segments",
                    nullptr);
        }
      }
      break;
  }
  mode_ = Mode::idle;
  seq_ = nullptr;
}

}  // namespace kiln::cuda
