// A run whose epochs end in a batch the model cannot train on (one example through batch norm) is refused before
// step 1, with the sizes and the fixes.
#include "last_batch.hpp"

#include <optional>
#include <string>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/model.hpp"
#include "kiln/session.hpp"

namespace kiln {

namespace {

// Why a training step over `batch` examples cannot be built ("" when it can).
std::string cannot_train_on(const Session& s, int64_t batch) {
  GraphOptions go;
  go.batch = batch;
  go.training = true;
  go.optimizer = &s.optimizer();
  try {
    build_graph(s.model(), go);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return {};
}

}  // namespace

void check_last_batch(const Session& s, int64_t examples) {
  const TrainSettings& t = s.train();
  const int64_t b = t.batch_size;
  if (examples <= 0 || b <= 0 || examples % b == 0) return;
  const int64_t rest = examples % b, batches = (examples + b - 1) / b;
  // An epoch cut short by steps_per_epoch (or a run by max_steps) never reaches its last batch.
  if ((t.steps_per_epoch > 0 && t.steps_per_epoch < batches) || (t.max_steps > 0 && t.max_steps < batches)) return;
  const std::string why = cannot_train_on(s, rest);
  if (why.empty()) return;
  const Config& cfg = s.config();
  auto train = cfg.root().table("train");
  const std::string at =
      train && train->has("batch_size") ? train->where("batch_size") : cfg.file() + ": [train] batch_size";
  // Fixes: the batch stage's drop_remainder, or the nearest batch size whose last batch trains.
  std::string drop;
  auto d = cfg.root().table("data");
  auto p = d ? d->table("train") : std::nullopt;
  const std::vector<ConfigNode> stages = p ? p->table_array("stages") : std::vector<ConfigNode>{};
  for (size_t i = 0; i < stages.size(); ++i)
    if (stages[i].get_string("type", "") == "batch")
      drop = "set drop_remainder = true in [data.train] stages[" + std::to_string(i) + "] (type = \"batch\", " +
             stages[i].where() + ")";
  if (drop.empty())
    drop =
        "end [data.train] stages with {type = \"batch\", drop_remainder = true} (the batch stage Kiln adds keeps "
        "the remainder)";
  std::string other;
  for (int64_t k = 1; k <= 64 && other.empty(); ++k)
    for (int64_t c : {b + k, b - k}) {
      if (c < 1 || !other.empty()) continue;
      const int64_t last = examples % c;
      if (last == 0 || cannot_train_on(s, last).empty())
        other = "set [train] batch_size = " + std::to_string(c) + " (its epochs end " +
                (last == 0 ? std::string("with a full batch") : "with a batch of " + std::to_string(last)) + ")";
    }
  throw ConfigError(at + ": [train] batch_size is " + std::to_string(b) + " and " + describe_source(cfg, "train") +
                    " delivers " + std::to_string(examples) + " examples per epoch, so every epoch ends with a batch " +
                    "of " + std::to_string(rest) + (rest == 1 ? " example" : " examples") +
                    ", which the model cannot train on: " + why + ". The run would stop there, after " +
                    std::to_string(batches - 1) + " steps of epoch 1; " + drop +
                    (other.empty() ? "" : ", or " + other));
}

}  // namespace kiln
