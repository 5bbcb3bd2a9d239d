// What the data can hold against what the model takes, checked before step 1 rather than found as a NaN loss or a
// failed step later: token ids against the embedding that reads them, class indices against a classifier's width,
// and the epoch's last partial batch against layers that cannot train on it (batch norm over one row).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/tensor.hpp"

namespace kiln {

class Config;
struct ModelSpec;

// An embedding layer that reads the model input itself: the input's values are its row indices, integers in
// [0, vocab).
struct InputEmbedding {
  std::string layer;  // its name
  size_t index = 0;   // its place in [model] layers
  int64_t vocab = 0;
  std::string where;  // "run.toml:9: key 'model.layers[0].vocab'"; "" for a layer made in code
};
// Every such layer, from a forward graph of one example (nothing is allocated).
std::vector<InputEmbedding> input_embeddings(const ModelSpec& m);

// Refuses (ConfigError naming the data source and the layer's key) a [data.<which>] pipeline whose values cannot fit
// the model: token ids of a text or tokens source beyond an embedding's rows, or its class indices (the next tokens)
// beyond a softmax_cross_entropy head's classes. `vocabulary` is the [data.train] source's
// (Stage::vocabulary); `labels` the pipeline's label shape per example; `source` what the messages call the pipeline
// (describe_source). Pipelines whose stages change the values
// (scale, normalize, a plugin's stage) are not checked here (each batch's labels still are, by the trainer).
void check_data_fit(const Config& cfg, const std::string& which, const ModelSpec& m, const std::string& vocabulary,
                    const Shape& labels, const std::string& source);

}  // namespace kiln
