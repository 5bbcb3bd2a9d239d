// What fits a device's memory limit, from a strategy and its runner context alone: each plan against its device's
// limit, the largest batch that fits, and the advice an out-of-memory error carries. No Session here: the Session
// installs oom_advice as its allocators' hint, and the memory report (memory_report.hpp), which reads a whole
// Session, builds on these.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/model.hpp"
#include "kiln/strategy.hpp"

namespace kiln {

// Each opened device's allocator limit, in the order of ctx.devices.
std::vector<size_t> device_limits(const RunnerContext& ctx);
// The opened device a plan is for: matched by label (a strategy may plan a subset of the opened devices), else by
// position.
size_t device_of(const DevicePlan& p, const RunnerContext& ctx, size_t i);
// Largest plan total over devices, and whether every plan fits its limit.
std::pair<size_t, bool> plan_need(Strategy& s, const RunnerContext& ctx, const std::vector<size_t>& limits);

// The largest global batch whose plan fits every device's limit (0 if not even 1 fits). Starts probing at `hint`.
int64_t largest_fitting_batch(Strategy& s, RunnerContext ctx, const std::vector<size_t>& limits, int64_t hint);
// The smallest batch (<= hi, at most 4096) the strategy accepts: 1, or the replicas / micro-batches it splits a
// batch into (every accepted batch is a multiple of it); 0 when none is.
int64_t batch_unit(Strategy& s, RunnerContext ctx, int64_t hi);
// "3.12 GiB (3.35 GB)": binary and decimal, since drivers and people use both.
std::string format_bytes_both(size_t bytes);

// "What would fit" on opened device `device` of `ctx`: the largest batch, optimizers with less state,
// recomputation. `m` is the model ctx.model points to: its savers change while the alternatives are planned and are
// restored before this returns. Used in OutOfMemory reports (Session installs it as every allocator's hint
// provider).
std::string oom_advice(Strategy& st, const RunnerContext& ctx, ModelSpec& m, size_t device);

}  // namespace kiln
