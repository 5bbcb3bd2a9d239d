// Text generation from a trained character (or byte) model, as nanoGPT's sample.py: `kiln sample`.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "kiln/vocabulary.hpp"

namespace kiln {

class Session;

struct SampleOptions {
  std::string checkpoint;     // "" = <output_dir>/checkpoint.kiln
  std::string prompt = "\n";  // nanoGPT's default start
  int64_t tokens = 500;       // new tokens to generate
  double temperature = 0.8;   // > 0
  int64_t top_k = 200;        // 0 = every token
  uint64_t seed = 1337;
};

// Loads the run's model and checkpoint, then generates autoregressively with a forward-only graph of batch 1 and
// T = the model's input length: the context is cropped to its last T tokens, a shorter one is padded after its end
// (the model must be causal, as attention and per-position layers are) and the logits are read at its last real
// position; they are divided by the temperature, cut to the top k, and one token is drawn from their softmax with
// a generator seeded by `seed`. Writes the prompt, then each token as it is drawn, to `out`.
void sample_text(Session& s, const SampleOptions& o, std::ostream& out);

}  // namespace kiln
