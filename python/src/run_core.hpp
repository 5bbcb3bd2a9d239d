// One run of the Python module (kiln.Run): the config file and overrides, and what `kiln plan`, `train`, `evaluate`,
// `predict` and `export` do with them, without Python types (module.cpp binds it and manages the GIL).
#pragma once
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "array_source.hpp"
#include "kiln/evaluation.hpp"
#include "kiln/memory_report.hpp"
#include "kiln/trainer.hpp"

namespace kiln::app {
struct Options;
struct TrainedModel;
}  // namespace kiln::app

namespace kiln::python {

struct PlanResult {
  PlanCheck check;
  int64_t largest_batch = 0;  // the largest batch size whose step fits every device's limit
  int64_t batch_size = 0;     // [train] batch_size
};

// Which checkpoint and weights evaluate/predict/weights use (the run's checkpoint.kiln by default).
struct ModelInfo {
  std::string checkpoint;
  int64_t epoch = 0, step = 0;
  bool ema = false;
};

// The loaded model (config, checkpoint, session and its devices) and the runner holding its weights on them. Shared:
// the NumPy views of run.weights keep it, so a view stays valid memory after close() or fit() drop it from the run.
struct LoadedModel {
  std::unique_ptr<app::TrainedModel> model;
  std::unique_ptr<Runner> runner;  // on model's devices: freed before model
  LoadedModel();
  ~LoadedModel();
  LoadedModel(const LoadedModel&) = delete;
  LoadedModel& operator=(const LoadedModel&) = delete;
};

// One weight as run.weights reads it: the runner's live buffer where it is host memory (`view`, float32, the
// weight's shape, row-major), else a copy of the loaded values (`copy`).
struct Weight {
  std::string name;
  Shape shape;
  std::span<float> view;
  std::shared_ptr<LoadedModel> owner;  // with a view: what keeps its memory
  HostTensor copy;
};

class RunCore {
 public:
  // Loads the plugins and validates the config as `kiln train` would before opening devices (ConfigError etc.).
  RunCore(std::string config, std::vector<std::string> overrides, std::vector<std::string> plugin_dirs,
          std::map<std::string, ArrayData> arrays, std::function<void(Registry&)> more_stages = {});
  ~RunCore();
  RunCore(const RunCore&) = delete;
  RunCore& operator=(const RunCore&) = delete;

  const std::string& config() const { return config_; }
  const std::string& output_dir() const { return output_dir_; }  // [train] output_dir as the run was built

  PlanResult plan();
  // `kiln train` (with --resume / --overwrite); progress goes to `out`, each metrics.jsonl record to on_record.
  TrainReport fit(std::ostream& out, const std::function<void(const std::string&)>& on_record, bool resume,
                  bool overwrite, const std::vector<std::string>& extra_overrides);
  // `kiln evaluate --data NAME` with the weights this run holds; `where` receives describe_source's text.
  Evaluation evaluate(const std::string& data, std::string& where);
  // `kiln predict --input`: x (N, input_shape...) or one example (input_shape...); returns (N, columns).
  HostTensor predict(HostTensor x);
  std::vector<std::string> predict_columns();
  // The model's parameters and buffers in model order, as the checkpoint holds them (EMA when the run keeps it):
  // views of the runner's buffers on a host-addressable device with the single strategy, copies otherwise.
  std::vector<Weight> weights();
  Weight weight(const std::string& name);  // ConfigError naming the model's weights for an unknown name
  // Replaces one weight of this run's loaded model (what evaluate and predict then use), in place: a view of it
  // sees the new values. Shapes must match.
  void set_weight(const std::string& name, HostTensor value);
  // `kiln export --format F --output PATH` of the run's checkpoint.
  void export_to(const std::string& path, const std::string& format, const std::string& dtype, bool overwrite,
                 const std::string& checkpoint, std::ostream& out);
  ModelInfo model_info();
  // Frees the loaded model, its devices and their memory reservations.
  void close();

 private:
  app::Options options() const;
  void load_model();
  app::TrainedModel& model() { return *loaded_->model; }
  Runner& runner() { return *loaded_->runner; }
  const Shape& param_shape(const std::string& name);  // ConfigError for a name the model does not have
  Weight read_weight(const std::string& name, const Shape& shape);

  std::string config_;
  std::vector<std::string> overrides_, plugin_dirs_;
  std::shared_ptr<const std::map<std::string, ArrayData>> arrays_;
  std::function<void(Registry&)> more_stages_;  // the module's Python-backed stages (kiln.data.generator)
  std::shared_ptr<LoadedModel> loaded_;         // loaded on first use by evaluate / predict / weights
  Shape label_;
  std::vector<std::string> columns_;
  std::string output_dir_;
};

}  // namespace kiln::python
