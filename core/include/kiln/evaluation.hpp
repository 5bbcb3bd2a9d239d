// Evaluation of a model over a whole data pipeline (`kiln evaluate`, and the trainer after each epoch). Separate
// from trainer.hpp so that evaluating does not depend on the training loop.
#pragma once
#include <cstdint>
#include <vector>

#include "kiln/data.hpp"
#include "kiln/model.hpp"
#include "kiln/strategy.hpp"

namespace kiln {

// Evaluation over a whole pipeline: mean loss per output and, for classification heads, accuracy.
// Sequence heads (logits (N, T, classes), labels (N, T)) count every position: accuracy is per token.
struct Evaluation {
  double loss = 0;
  double accuracy = -1;  // the first classification head's
  int64_t examples = 0;
  std::vector<double> losses;      // per output
  std::vector<double> accuracies;  // per output; -1 for an mse head
};
Evaluation evaluate(Runner& r, Stage& pipeline, const ModelSpec& m, bool use_ema);

}  // namespace kiln
