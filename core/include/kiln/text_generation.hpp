// Text generation from a trained character (or byte) model, as nanoGPT's sample.py: `kiln sample`.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace kiln {

class Session;

// A text source's vocabulary (the JSON Stage::vocabulary writes, saved with the run as vocab.json).
struct Vocabulary {
  bool bytes = false;               // ids are byte values 0..255
  std::vector<std::string> tokens;  // chars: the UTF-8 text of each id
  int64_t size() const { return bytes ? 256 : static_cast<int64_t>(tokens.size()); }
  // Ids of `text`; a character outside the vocabulary is a ConfigError naming it, its position and `what`.
  std::vector<int64_t> encode(const std::string& text, const std::string& what) const;
  std::string decode(int64_t id) const;
};
// Throws DataError naming `where` when `json` is not such a vocabulary.
Vocabulary parse_vocabulary(const std::string& json, const std::string& where);

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
