// What `kiln evaluate`, `kiln predict` and `kiln export` share: a run's config and checkpoint, the weights checked
// against the model, a runner holding them, and small file writers (JSON, .npy).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kiln/checkpoint.hpp"
#include "kiln/session.hpp"

namespace kiln::app {

// A trained model as the config describes it, with the checkpoint's weights.
struct TrainedModel {
  PluginLoader loader;
  Registry reg;
  std::unique_ptr<Config> cfg;
  std::unique_ptr<Session> session;
  std::string checkpoint_path;
  Checkpoint checkpoint;
  bool ema = false;  // the weights are the EMA shadows ("<param>/ema")
  // The model's parameters and buffers (batch norm's running statistics) in model order (name, shape), and their
  // values from the checkpoint (EMA or raw; buffers are always raw).
  std::vector<std::pair<std::string, Shape>> params;
  std::map<std::string, HostTensor> weights;
};

// Loads plugins and the config, reads the checkpoint (--checkpoint, default <output_dir>/checkpoint.kiln) and checks
// it against the model: every parameter present with the model's shape, nothing of another model. Throws DataError
// naming the tensor and both shapes. `weights`: "auto" (EMA when [optimizer] ema is set, as the trainer evaluates),
// "ema" or "raw".
std::unique_ptr<TrainedModel> load_trained_model(const Options& o);

// One head's outputs for `batch` examples as `kiln predict` writes them, appended to cols[i] (example i's row):
// softmax probabilities for softmax_cross_entropy (a sequence head (N, T, classes): one distribution per position,
// over the last axis, max-subtracted as the op computes it), sigmoid probabilities for binary cross-entropy from
// logits, the raw outputs otherwise. With `names`, the columns' names are appended too (class_j, out_j, p<t>.class_j,
// prefixed by the head's layer when the model has several heads).
void append_prediction_columns(const ModelSpec& model, size_t head, const HostTensor& out, int64_t batch,
                               std::vector<std::vector<float>>& cols, std::vector<std::string>* names);

// The model's label shape from the pipeline it will be fed (build_graph needs it), then devices and a runner holding
// the weights (the parameters only: evaluation needs no optimizer state).
std::unique_ptr<Runner> make_inference_runner(TrainedModel& m, const Shape& label_shape);

// Refuses (ConfigError, exit 2) o.output when it is one of the command's inputs (the config, --checkpoint, --input),
// a file of a run directory, in a directory that does not exist, or an existing file without --overwrite: a user's
// file is never replaced silently (kiln/files.hpp, check_output_file).
void check_new_output(const Options& o, const std::string& option);

std::string json_str(const std::string& s);
std::string json_double(double v);

// NumPy .npy format version 1.0: float32 little-endian, C order.
void write_npy(const std::string& path, const std::vector<float>& data, const std::vector<int64_t>& shape);
// Reads a .npy array of float32, float64 or uint8 (C order, little-endian) as floats; DataError when it is not one.
HostTensor read_npy(const std::string& path);

// The inference graph as an ONNX model (opset 13; onnx_export.cpp): input "input" (N, input_shape...), one output per
// head named after its layer, holding what `kiln predict` writes. ConfigError naming a layer ONNX export lacks.
std::string onnx_model(const TrainedModel& m);

// Writes `text` to `path` through a temporary file and a rename.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace kiln::app
