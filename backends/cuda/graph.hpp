// CUDA graph capture and replay of training steps (Device::begin_sequence / end_sequence).
//
// A step id is first run eagerly (warming up cuBLAS/cuDNN and counting the ops with per-step scalars), captured
// on its second run and replayed from then on. Work that is not an op (host copies, synchronize, collectives,
// allocation) splits a step into segments: one graph per segment, launched at the boundary. Per-step scalars
// (learning rate, Adam's t, dropout counter) live in a small device buffer the captured kernels read; it is
// rewritten from pinned memory before every launch, so the graphs stay valid as those values change.
// While replaying, every call is checked against the recorded one (kind, buffers, static attributes); on the
// first difference the segment's calls run eagerly instead, the recording is dropped and the step is captured
// again later (after three mismatches it is left eager for good).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "handles.hpp"
#include "kiln/device.hpp"

namespace kiln::cuda {

// Writes the call's per-step scalars into `slot` (kStepScalarSlotBytes) through its kernel's pack_step_scalars
// (dispatch.cpp); false for ops that have none.
bool pack_step_scalars(const OpCall& call, void* slot);
// A byte string equal for two calls exactly when a recorded graph of one may stand in for the other: kind,
// buffers (with their storage types), workspace and every attribute that is not a per-step scalar.
std::string call_key(const OpCall& call);

class GraphRecorder {
 public:
  // Enqueues one op on the stream; `scalars` is the device address of its per-step scalars or null (eager).
  using Execute = std::function<void(const OpCall& call, const void* scalars)>;
  struct Stats {
    uint64_t eager_steps = 0, captures = 0, replays = 0, mismatches = 0, capture_failures = 0;
    std::string last_problem;  // why the last capture or replay fell back to eager execution
  };

  GraphRecorder(cudaStream_t stream, Execute execute);
  ~GraphRecorder();
  GraphRecorder(const GraphRecorder&) = delete;
  GraphRecorder& operator=(const GraphRecorder&) = delete;

  void begin(uint64_t step_id);  // throws DeviceError when a sequence is already open
  void end();
  void run(const OpCall& call);
  // Must precede any other work on the stream while a sequence is open: launches or finishes what is pending.
  void boundary();
  bool in_sequence() const { return mode_ != Mode::idle; }
  const Stats& stats() const { return stats_; }
  // Drops every recording (buffers were freed, the device is closing).
  void clear();

 private:
  enum class Mode { idle, eager, observe, capture, replay };
  enum class State { observed, captured, eager_only };
  struct Segment {
    std::vector<std::string> keys;
    GraphExecHandle exec;
    size_t first_slot = 0, slots = 0;
  };
  struct Sequence {
    State state = State::observed;
    bool counted = false;     // scalar_calls holds the count of a complete observed run
    size_t scalar_calls = 0;  // ops with per-step scalars, counted on the observed run
    size_t slot_capacity = 0;
    int mismatches = 0;
    std::vector<Segment> segments;
    DeviceMemory device_slots;
    PinnedMemory host_slots;
    EventHandle uploaded;  // recorded after the last upload from host_slots
    bool upload_pending = false;
  };

  void begin_capture_segment();
  void finish_capture_segment();
  void launch_segment(Sequence& seq, const Segment& seg);
  void replay_flush();
  void fall_back(const std::string& why, const OpCall* current);
  void* host_slot(size_t i) const;
  const void* device_slot(size_t i) const;

  cudaStream_t stream_;
  Execute execute_;
  Mode mode_ = Mode::idle;
  Sequence* seq_ = nullptr;
  std::unordered_map<uint64_t, Sequence> sequences_;
  // The segment being captured or replayed.
  std::vector<OpCall> pending_;
  std::vector<std::string> pending_keys_;
  size_t next_slot_ = 0, segment_first_slot_ = 0, replay_segment_ = 0;
  bool capturing_ = false, capture_broken_ = false;
  std::string capture_problem_;
  Stats stats_;
};

}  // namespace kiln::cuda
