// Blocks of layers written once and repeated: each repetition's tables with the placeholders replaced.
#include "repeat_blocks.hpp"

#include <algorithm>
#include <cstdint>

#include "kiln/error.hpp"

namespace kiln {

namespace {

// Where a config table starts, "run.toml:31", from its where() ("run.toml:31: key 'model.layers[2]'").
std::string file_line(const ConfigNode& c) {
  const std::string w = c.where();
  const size_t k = w.find(": key '");
  return k == std::string::npos ? w : w.substr(0, k);
}

// `v` with the block's placeholders replaced: {i} (the 0-based repetition), {i+K} and {i-K} (another repetition's
// index), {prev} (the repetition's input). Anything else in braces is an error naming the key of block table `t`.
std::string substitute(const std::string& v, int64_t i, const std::string& prev, const ConfigNode& t,
                       const std::string& key) {
  std::string out;
  for (size_t p = 0; p < v.size();) {
    if (v[p] != '{') {
      out += v[p++];
      continue;
    }
    const size_t close = v.find('}', p);
    if (close == std::string::npos)
      t.fail(key, "\"" + v + "\" has a '{' that is never closed; the placeholders are {i}, {i+K}, {i-K} and {prev}");
    const std::string ph = v.substr(p + 1, close - p - 1);
    if (ph == "i") {
      out += std::to_string(i);
    } else if (ph == "prev") {
      out += prev;
    } else if (ph.size() > 2 && ph[0] == 'i' && (ph[1] == '+' || ph[1] == '-') && ph.size() <= 8 &&
               std::all_of(ph.begin() + 2, ph.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      const int64_t k = std::stoll(ph.substr(2)), j = ph[1] == '+' ? i + k : i - k;
      if (j < 0)
        t.fail(key, "\"" + v + "\": {" + ph + "} is " + std::to_string(j) + " at i = " + std::to_string(i) +
                        ", before the first repetition; {prev} names the block's input there");
      out += std::to_string(j);
    } else {
      t.fail(key, "\"" + v + "\" has the placeholder {" + ph +
                      "}, which a repeated block does not define; the placeholders are {i} (the repetition, from 0), "
                      "{i+K} and {i-K}, and {prev} (the repetition's input: the previous repetition's last layer, the "
                      "block's input for the first)");
    }
    p = close + 1;
  }
  return out;
}

}  // namespace

void expand_block(const ConfigNode& bc, std::string& prev, const std::set<std::string>& names, const AddLayer& add) {
  if (bc.has("type"))
    bc.fail("type", "a table with repeat takes no type: its layers are the [[" +
                        bc.path().substr(0, bc.path().rfind('[')) + ".block]] tables after it");
  if (!bc.has("repeat"))
    bc.fail("block", "is a block of layers, but the table has no repeat: give repeat = N (N >= 1) beside it");
  const int64_t n = bc.get_int("repeat");
  constexpr int64_t kMaxRepeat = 65536;
  if (n < 1 || n > kMaxRepeat)
    bc.fail("repeat", "expected how many times the block repeats, 1 to " + std::to_string(kMaxRepeat) + ", found " +
                          std::to_string(n));
  const auto inputs = bc.get_string_list("inputs", {prev});
  if (inputs.size() != 1)
    bc.fail("inputs",
            "a repeated block takes one input (its first repetition's {prev}), found " + std::to_string(inputs.size()));
  if (!names.count(inputs[0]))
    bc.fail("inputs", "\"" + inputs[0] + "\" is not an earlier layer (\"input\" is the model input)");
  std::optional<bool> trainable;
  if (bc.has("trainable")) trainable = bc.get_bool("trainable", true);
  std::optional<double> scale;
  if (bc.has("learning_rate_scale")) {
    scale = bc.get_float("learning_rate_scale");
    if (!(*scale >= 0 && *scale <= 1e6))
      bc.fail("learning_rate_scale", "expected a number in [0, 1e6], found " + std::to_string(*scale));
    if (trainable == false)
      bc.fail("learning_rate_scale", "is set, but the block has trainable = false: a frozen layer has no updates");
  }
  const auto block = bc.table_array("block");
  if (block.empty())
    bc.fail("block", "a table with repeat needs its layers: [[" + bc.path().substr(0, bc.path().rfind('[')) +
                         ".block]] tables after it, written as one repetition with {i} in their names");
  for (const auto& t : block)
    for (const char* k : {"repeat", "block"})
      if (t.has(k)) t.fail(k, "a block inside a repeated block is not supported: repeat the outer block's layers");
  bc.finish();
  prev = inputs[0];
  const std::string at = file_line(bc) + " (" + bc.path() + ", repeat = " + std::to_string(n) + ")";
  for (int64_t i = 0; i < n; ++i) {
    const std::string ctx = "repetition i = " + std::to_string(i) + " of the block repeated at " + at;
    const std::string input = prev;
    for (const auto& t : block) {
      try {
        const ConfigNode c =
            t.rewritten([&](const std::string& key, const std::string& v) { return substitute(v, i, input, t, key); });
        add(c, ctx, trainable, scale);
      } catch (const ConfigError& e) {
        throw ConfigError(std::string(e.what()) + " [" + ctx + "]");
      }
    }
  }
}

}  // namespace kiln
