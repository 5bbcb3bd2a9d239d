// A run as configured: the validated TOML, opened devices with their allocators, data pipelines and the strategy.
// `kiln train` and `kiln plan` both start here.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/allocator.hpp"
#include "kiln/config.hpp"
#include "kiln/data.hpp"
#include "kiln/init_from.hpp"
#include "kiln/model.hpp"
#include "kiln/plugin.hpp"
#include "kiln/reservation.hpp"
#include "kiln/strategy.hpp"

namespace kiln {

struct DeviceSettings {
  std::string backend = "cpu";   // "auto" | "cpu" | "vulkan" | "cuda" | any registered backend
  std::vector<int64_t> visible;  // indices within the backend; empty = all
  std::string memory_limit;      // "1200MiB", "60%", "" = the whole device
  bool growth = true;
  std::string fallback = "error";  // "error" | "cpu": the highest-priority backend with a host CPU device
  std::string select = "first";    // "first" | "most_free_memory"
  int64_t count = 0;               // how many devices to open (0 = 1 for single, all visible otherwise)
  int fail_block_request = 0;      // fault injection for tests
};

// [train] early_stopping (Keras's EarlyStopping callback).
struct EarlyStopping {
  bool on = false;
  std::string metric = "test_loss";  // "test_loss" | "test_accuracy" | "train_loss"
  int64_t patience = 3;              // epochs without an improvement larger than min_delta
  double min_delta = 0;
  bool restore_best = true;  // end with the best epoch's weights (kept in output_dir/checkpoint-best.kiln)
};

struct TrainSettings {
  int64_t epochs = 1;
  int64_t batch_size = 32;
  int64_t steps_per_epoch = 0;          // 0 = the whole pipeline
  bool evaluate = true;                 // evaluate on [data.test] after every epoch
  std::string progress = "auto";        // "auto" | "bar" | "lines" | "none"
  std::string output_dir;               // metrics.jsonl and checkpoints; default runs/<name>
  int64_t checkpoint_every = 1;         // epochs; 0 = never
  int64_t checkpoint_every_steps = 0;   // also a mid-epoch checkpoint every this many steps (0 = off)
  double checkpoint_every_minutes = 0;  // also one when this many minutes passed since the last (0 = off)
  int64_t keep_checkpoints =
      1;  // the newest this many step/epoch checkpoints stay on disk (older: <stem>-step<N>.kiln)
  EarlyStopping early_stopping;
  // Stop when the mean loss of the last 10 steps exceeds this many times the mean of the first 10 (0 = never).
  double divergence_factor = 100;
  int64_t max_steps = 0;   // stop after this many global steps, mid-epoch if need be, with a checkpoint (0 = no cap)
  bool resume = false;     // continue from output_dir/checkpoint.kiln if it exists
  bool overwrite = false;  // start over in an output_dir that holds an earlier run (else refused)
  // "strict": refuse up front if the plan does not fit; "fit": turn on memory savers (recomputation) until it
  // fits, else refuse; "none": no up-front check (an allocation that does not fit fails with OutOfMemory).
  std::string memory_policy = "strict";
  // Copy the next batch into a second device input buffer while the current step runs (strategies that support it).
  bool device_prefetch = true;
  // [log] every_steps: a "step" record in metrics.jsonl every this many steps (0 = epoch records only).
  int64_t log_every_steps = 0;
  // [log] tensorboard: also write the step and epoch scalars as TensorBoard event files in output_dir.
  bool tensorboard = false;
};

// Memory settings of [memory] that are not graph savers (those live in ModelSpec::savers).
struct MemorySettings {
  std::vector<int64_t> sweep_batches;  // `kiln plan --sweep` batch sizes; empty = powers of two up to the largest fit
};

class Session {
 public:
  // Parses and validates every section, [device] keys of every loaded backend included (each backend is made
  // with the [device] table and reads its own keys). Nothing is allocated; devices are not opened.
  Session(const Config& cfg, Registry& reg);
  ~Session();

  // Opens the configured devices (with allocators) through the backend. "auto" takes the first backend by
  // Backend::priority() with a usable device. Throws DeviceError/ConfigError.
  // With `reserve`, an explicit memory_limit is recorded as a cooperative reservation (see reservation.hpp) and
  // refused when other Kiln jobs' reservations leave too little. Without `reserve` (`kiln plan`) it is a dry run:
  // nothing is recorded, and growth = false is planned but not applied (the allocators claim nothing up front);
  // check_plan compares the limit with the reservations of others instead.
  void open_devices(bool reserve = true);
  // Live reservations of other Kiln jobs on opened device i, as seen when it was opened.
  const std::vector<ReservationHolder>& reservations_of_others(size_t i) const { return others_.at(i); }
  // Whether device i's limit came from [device] memory_limit (else: the device minus others' reservations).
  bool explicit_limit() const { return !device_.memory_limit.empty(); }
  const std::vector<DeviceContext>& devices() const { return device_ctx_; }
  RunnerContext runner_context() const;
  Strategy& strategy() { return *strategy_; }

  // A data pipeline ("train" or "test"); nullptr when [data.<which>] is absent. Appends a batch stage if none.
  std::unique_ptr<Stage> make_pipeline(const std::string& which) const { return make_pipeline(which, nullptr); }
  bool has_pipeline(const std::string& which) const;

  const ModelSpec& model() const { return model_; }
  ModelSpec& model() { return model_; }
  const OptimizerSpec& optimizer() const { return optimizer_; }
  OptimizerSpec& optimizer() { return optimizer_; }
  const TrainSettings& train() const { return train_; }
  const DeviceSettings& device_settings() const { return device_; }
  const MemorySettings& memory_settings() const { return memory_; }
  // [init]: the weights a new run starts from (not applied when it resumes); nullopt without the table.
  const std::optional<InitSpec>& init() const { return init_; }
  const std::string& run_name() const { return name_; }
  uint32_t seed() const { return seed_; }
  const Config& config() const { return cfg_; }
  Registry& registry() { return reg_; }
  std::vector<std::string> warnings() const { return warnings_; }
  // The [data.train] source's vocabulary (Stage::vocabulary, JSON); "" when it has none.
  const std::string& vocabulary() const { return vocab_; }
  // How the source of [data.<which>] reads (Stage::reading), recorded when the pipeline is built; "" when it says
  // nothing or the pipeline is absent.
  std::string source_reading(const std::string& which) const {
    return which == "train" ? reading_train_ : which == "test" ? reading_test_ : std::string();
  }
  // Bytes a source may keep decoded in memory ([data] decoded_budget, fixed when the session starts); 0 = stream.
  uint64_t decoded_budget() const { return decoded_budget_; }

 private:
  struct StageShapes {
    std::string type;
    Shape x, y;  // what the stage delivers per example
  };
  std::unique_ptr<Stage> make_pipeline(const std::string& which, std::vector<StageShapes>* shapes) const;
  // Refuses (ConfigError at model.input_shape or the head's loss) a pipeline whose examples do not fit
  // [model] input_shape or whose labels do not fit a head's loss, naming the section, its files and the stage.
  void check_data_shapes(const std::string& which, const ConfigNode& model);
  // Refuses [device] fault_injection_block beyond the block requests a single-device run can make (growth = true).
  void check_fault_injection() const;

  Config cfg_;
  Registry& reg_;
  std::string name_;
  uint32_t seed_ = 42;
  DeviceSettings device_;
  TrainSettings train_;
  ModelSpec model_;
  OptimizerSpec optimizer_;
  std::unique_ptr<Strategy> strategy_;
  std::vector<std::unique_ptr<Backend>> backends_;  // every loaded backend, highest priority first
  Backend* backend_ = nullptr;                      // the one open_devices chose
  std::vector<std::unique_ptr<Device>> opened_;
  std::vector<std::unique_ptr<Allocator>> allocators_;
  std::vector<DeviceContext> device_ctx_;
  std::vector<std::vector<ReservationHolder>> others_;
  std::vector<std::unique_ptr<Reservation>> reservations_;  // released after the allocators
  MemorySettings memory_;
  std::optional<InitSpec> init_;
  std::vector<std::string> warnings_;
  mutable std::string vocab_;                     // recorded when the train pipeline is first built
  mutable std::vector<std::string> label_names_;  // the train source's named labels (likewise)
  // The sources' Stage::reading (likewise).
  mutable std::string reading_train_, reading_test_;
  uint64_t decoded_budget_ = 0;
};

// Where a pipeline's data comes from, for messages:
// "[data.test] (idx source, images = '/data/t10k-images.gz', labels = '/data/t10k-labels.gz')".
std::string describe_source(const Config& cfg, const std::string& split);

}  // namespace kiln
