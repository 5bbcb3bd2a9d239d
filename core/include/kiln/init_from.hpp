// [init]: a run that starts from trained weights (a safetensors file, e.g. Hugging Face's, or a Kiln checkpoint)
// instead of random ones. Names map from Kiln's to the file's (map entries with {i} placeholders, or a preset),
// strictly by default, as PyTorch's load_state_dict. docs/weights.md.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/tensor.hpp"

namespace kiln {

class ConfigNode;
struct ModelSpec;
struct OptimizerSpec;

// One name rule: the model's tensor `kiln` (may hold {i}-style placeholders, each standing for digits) comes from
// the file's tensor `file` (the same placeholders), transposed (a matrix) and/or cut to its first rows.
struct InitRule {
  std::string kiln, file;
  bool transpose = false;
  bool first_rows = false;  // the model's tensor takes the file tensor's first rows (a longer positional table)
  std::string where;        // config location, for messages
};

struct InitSpec {
  std::string from;         // the file, resolved against the config's directory
  std::string from_as_set;  // as the config wrote it, for messages
  std::string where;        // "run.toml:3: key 'init.from'"
  std::string preset;       // "" or "gpt2"
  std::vector<InitRule> map;
  std::vector<std::string> transpose;  // model names (patterns) whose file tensors are transposed
  std::vector<std::string> ignore;     // file names (patterns) that are neither loaded nor unexpected
  bool strict = true;
  bool ema = false;  // a Kiln checkpoint as source: its EMA shadows instead of the raw parameters
};

// Reads [init] (from, preset, map, transpose, ignore, strict, weights). ConfigError naming file, line and key.
InitSpec parse_init(const ConfigNode& init, const std::string& base_dir);

struct InitialWeights {
  std::map<std::string, HostTensor> tensors;  // by the model's persistent names; EMA shadows start as copies
  std::vector<std::string> missing;           // strict = false: the model's tensors the file did not have
  std::vector<std::string> unused;            // strict = false: the file's tensors nothing used
  std::string summary;                        // one line for the run's output
};

// Reads the file once (mapped; a Kiln checkpoint is read whole and its checksum checked) and returns the model's
// parameters and buffers (`m` built for training with `opt`, so EMA shadows are included). Every name, shape and
// byte is checked before a tensor's values are read: one ConfigError listing every missing, unexpected and
// misshaped name (missing and unexpected are lists only with strict = false; misshaped is always an error), a
// DataError naming the file and tensor for a damaged file or a non-finite value.
InitialWeights load_initial_weights(const InitSpec& spec, const ModelSpec& m, const OptimizerSpec& opt);

// The model tensor names a preset expects and where each comes from, for the docs and tests ("gpt2").
std::vector<InitRule> init_preset_rules(const std::string& preset);

}  // namespace kiln
