// Data pipeline stages: pull-based, each stage owns its upstream.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/tensor.hpp"

namespace kiln {

class ConfigNode;

// One element flowing through a pipeline: a single example (batch == 0, x without batch dim) or a batch
// (x and y with a leading dim of `batch`).
struct Element {
  HostTensor x;  // features
  HostTensor y;  // labels: class index as float (shape () or (N)), or targets (shape (k) or (N, k))
  int64_t batch = 0;
};

// Saved position of a stage (and, recursively, its upstream), as opaque bytes.
using StageState = std::vector<uint8_t>;

struct StageStats {
  std::string name;
  uint64_t elements = 0;
  double busy_seconds = 0;  // time producing elements (its own work)
  double wait_seconds = 0;  // time waiting on upstream
  uint64_t bytes_read = 0;  // bytes read from files (sources), so a rank's share of the reading can be counted
};

class Stage {
 public:
  virtual ~Stage() = default;
  Stage() = default;
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  virtual std::string name() const = 0;
  // The next element, or nullopt at the end of the epoch. Throws DataError naming the file and offset.
  virtual std::optional<Element> next() = 0;
  // Starts epoch `epoch` (0-based) from its beginning; shuffles reseed from (seed, epoch).
  virtual void reset(uint64_t epoch) = 0;
  // Feature and label shapes of one example (without batch dim).
  virtual Shape example_shape() const = 0;
  virtual Shape label_shape() const = 0;
  // Number of examples per epoch if known (sources), else -1.
  virtual int64_t size_hint() const { return -1; }
  // Exact position (within the epoch) so a resumed run sees the same elements.
  virtual StageState save() const = 0;
  virtual void restore(const StageState& s) = 0;
  virtual void collect_stats(std::vector<StageStats>& out) const { (void)out; }
  // A text source's vocabulary as a JSON object (what token id i stands for), saved with the run as vocab.json so
  // `kiln sample` can decode ids; "" for every other stage. Only a pipeline's first stage (the source) is asked.
  virtual std::string vocabulary() const { return {}; }
  // Names of the label's values when a source delivers several named labels per example (the csv source's
  // `label = ["digit", "parity"]`: label_shape() (2), one value per name), so each model output can train on its own
  // (`[[model.outputs]] label = "parity"`); empty otherwise. Only a pipeline's first stage (the source) is asked.
  virtual std::vector<std::string> label_names() const { return {}; }

  // Random access within the current epoch (after reset() or restore()): element k of the epoch, without producing
  // the elements before it. Stages that can answer say so: sources with fixed-size records or a decoded copy,
  // shuffles and per-example maps over such an upstream. at() may be called from several threads at once and does
  // not move next()'s position. A batch stage that keeps only some rows of every batch (an MPI rank's share) reads
  // just those rows through it.
  virtual bool random_access() const { return false; }
  virtual Element at(uint64_t k) {
    (void)k;
    throw Error(name() + ": this stage has no random access");
  }
  // How a source reads, in a few words for `kiln plan` and the progress line (e.g. "decoded once, 47.0 MB in
  // memory" or "streaming: decoded set 1.2 GB > budget 800 MB"); "" for every other stage. Only a pipeline's first
  // stage (the source) is asked.
  virtual std::string reading() const { return {}; }
  // Examples ks[0], ks[1], ... of the epoch, as at() gives them, written straight into consecutive rows of a batch:
  // row i is x + i * example_shape().numel() and y + i * label_shape().numel(). A batch stage over a random-access
  // upstream fills its rows through it. Stages that can write examples in place (a decoded source, a shuffle, a map
  // of shape-preserving ops) override it: they skip at()'s two tensors per example, which cost more than the step of
  // a small model, and a source sees the whole list, so it can fetch the next rows' bytes while it converts one. The
  // default copies at() row by row. The same threads may call it as at().
  virtual void fill(std::span<const uint64_t> ks, float* x, float* y);
  // The trainer hands back a batch it is done with (its step has run, its copy to the device is complete), so that a
  // stage may reuse its tensors' memory for a later batch instead of allocating and zeroing new ones every step (on
  // the smallest sample that zeroing was a third of the time a batch costs the trainer's thread). The default drops
  // it. Called on the thread that calls next(); a stage wrapping another passes it on if its own elements are its
  // upstream's.
  virtual void recycle(Element&& e) { (void)e; }
};

inline void Stage::fill(std::span<const uint64_t> ks, float* x, float* y) {
  const Shape xs = example_shape(), ys = label_shape();
  const auto xn = static_cast<size_t>(xs.numel()), yn = static_cast<size_t>(ys.numel());
  for (size_t i = 0; i < ks.size(); ++i) {
    Element e = at(ks[i]);
    if (e.batch != 0 || !(e.x.shape == xs) || !(e.y.shape == ys))
      throw DataError("data stage '" + name() + "': example " + std::to_string(ks[i]) + " of the epoch has shapes x " +
                      e.x.shape.str() + ", y " + e.y.shape.str() + (e.batch ? " (a batch)" : "") +
                      ", but the stage declared x " + xs.str() + ", y " + ys.str());
    std::memcpy(x + i * xn, e.x.data.data(), xn * sizeof(float));
    std::memcpy(y + i * yn, e.y.data.data(), yn * sizeof(float));
  }
}

// Context a stage factory receives.
struct StageContext {
  std::unique_ptr<Stage> upstream;  // null for sources
  std::string base_dir;             // relative file paths resolve against it
  int64_t global_batch = 0;         // [train] batch_size
  uint64_t seed = 0;                // [run] seed
  std::string pipeline;             // "train" or "test" ([data.<which>]); "" outside a run's pipelines
  // Bytes a source may keep decoded in memory to decode only once per run ([data] decoded_budget); 0 = stream.
  uint64_t decoded_budget = 0;
  // Rows [rows_begin, rows_end) of every global batch this process uses (an MPI rank's share under data_parallel);
  // rows_end = 0 means all of them. A batch stage fills only these rows when its upstream has random access.
  int64_t rows_begin = 0, rows_end = 0;
};

using StageFactory = std::function<std::unique_ptr<Stage>(const ConfigNode& cfg, StageContext ctx)>;

}  // namespace kiln
