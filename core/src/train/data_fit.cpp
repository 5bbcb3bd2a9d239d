// Checks before step 1 that what the data can hold fits the model: token ids against the embedding reading them,
// class indices against a classifier's width, the epoch's last partial batch against layers that cannot train on it.
#include "kiln/data_fit.hpp"

#include <algorithm>
#include <optional>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/model.hpp"
#include "kiln/vocabulary.hpp"

namespace kiln {

namespace {

Graph forward_graph(const ModelSpec& m) {
  GraphOptions go;
  go.batch = 1;
  go.training = false;
  return build_graph(m, go);  // nothing is allocated
}

std::vector<InputEmbedding> embeddings_of(const Graph& g, const ModelSpec& m) {
  std::vector<InputEmbedding> out;
  for (const Node& n : g.nodes()) {
    if (n.kind != OpKind::EmbeddingForward || n.in.empty() || g.root(n.in[0]) != g.root(g.input)) continue;
    InputEmbedding e;
    e.layer = n.layer;
    e.vocab = std::get<EmbeddingAttrs>(n.attrs).vocab;
    for (size_t i = 0; i < m.layers.size(); ++i)
      if (m.layers[i].name == n.layer) {
        e.index = i;
        if (const auto& c = m.layers[i].config) e.where = c->has("vocab") ? c->where("vocab") : c->where();
      }
    out.push_back(std::move(e));
  }
  return out;
}

// What a pipeline's source delivers, as far as its configuration and vocabulary tell before any element is read.
struct SourceRange {
  int64_t ids = 0;      // the inputs are token ids in [0, ids); 0: not ids, or unknown
  int64_t classes = 0;  // the labels are class indices in [0, classes); 0: unknown
  std::string what;     // "65 distinct characters", "vocab_size = 50304"
};

// Whether stages[1..] pass the source's input (or label) values on unchanged: reordering, batching, caching and crops
// do; scaling, normalization, one_hot (labels) and a plugin's stages may not.
bool keeps_values(const std::vector<ConfigNode>& stages, bool labels) {
  for (size_t i = 1; i < stages.size(); ++i) {
    const std::string type = stages[i].get_string("type", "");
    if (type == "batch" || type == "shuffle" || type == "cache" || type == "prefetch") continue;
    if (type != "map") return false;
    for (const auto& op : stages[i].table_array("ops")) {
      const std::string kind = op.get_string("op", "scale");
      const bool moves = kind == "center_crop" || kind == "random_crop" || kind == "flip_horizontal";
      if (!moves && !(kind == "one_hot" && !labels)) return false;
    }
  }
  return true;
}

SourceRange source_range(const ConfigNode& source, const std::string& vocabulary, const std::string& file) {
  SourceRange r;
  const std::string type = source.get_string("type", "");
  if (type == "text" && !vocabulary.empty()) {
    const Vocabulary v = parse_vocabulary(vocabulary, file + ": [data.train] text source");
    r.ids = r.classes = v.size();
    r.what = v.bytes ? "256 byte values" : std::to_string(v.size()) + " distinct characters";
  } else if (type == "tokens" && source.has("vocab_size")) {
    r.ids = r.classes = source.get_int("vocab_size");
    r.what = "vocab_size = " + std::to_string(r.ids);
  }
  return r;
}

const LayerSpec* layer_named(const ModelSpec& m, const std::string& name, size_t& index) {
  for (size_t i = 0; i < m.layers.size(); ++i)
    if (m.layers[i].name == name) {
      index = i;
      return &m.layers[i];
    }
  return nullptr;
}

}  // namespace

std::vector<InputEmbedding> input_embeddings(const ModelSpec& m) { return embeddings_of(forward_graph(m), m); }

void check_data_fit(const Config& cfg, const std::string& which, const ModelSpec& m, const std::string& vocabulary,
                    const Shape& labels, const std::string& source) {
  auto d = cfg.root().table("data");
  auto p = d ? d->table(which) : std::nullopt;
  const std::vector<ConfigNode> stages = p ? p->table_array("stages") : std::vector<ConfigNode>{};
  if (stages.empty()) return;
  const SourceRange r = source_range(stages[0], vocabulary, cfg.file());
  if (r.ids == 0 && r.classes == 0) return;
  const Graph g = forward_graph(m);
  if (r.ids > 0 && keeps_values(stages, false))
    for (const InputEmbedding& e : embeddings_of(g, m)) {
      if (r.ids <= e.vocab) continue;
      throw ConfigError((e.where.empty() ? "[model]" : e.where) + ": " + source + " has " + r.what + " (token ids 0.." +
                        std::to_string(r.ids - 1) + "), but layer " + std::to_string(e.index) + " '" + e.layer +
                        "' (type = \"embedding\") has vocab = " + std::to_string(e.vocab) + " rows: ids " +
                        std::to_string(e.vocab) + ".." + std::to_string(r.ids - 1) +
                        " would read no row (a NaN loss at step 0); set vocab = " + std::to_string(r.ids) + " or more");
    }
  // Class indices against each classifier; named labels (the csv source's) are not what these sources deliver.
  if (r.classes == 0 || !keeps_values(stages, true) || m.outputs.empty() || !m.outputs[0].label.empty()) return;
  for (size_t i = 0; i < m.outputs.size() && i < g.outputs.size(); ++i) {
    const OutputSpec& o = m.outputs[i];
    if (o.loss != LossKind::softmax_cross_entropy) continue;
    const Shape out = g.tensor(g.outputs[i]).shape.tail();
    const int64_t classes = out.rank() ? out[out.rank() - 1] : 1;
    // One class index per position; one-hot labels (as many values as logits) are checked per batch.
    if (classes <= 0 || labels.numel() != out.numel() / classes || r.classes <= classes) continue;
    size_t index = 0;
    const LayerSpec* l = layer_named(m, o.layer, index);
    const bool units = l && l->config && l->config->has("units");
    const std::string at = l && l->config ? l->config->where(units ? "units" : "") : "[model]";
    throw ConfigError(at + ": " + source + " has " + r.what + ", so its labels are class indices 0.." +
                      std::to_string(r.classes - 1) + ", but output " + std::to_string(index) + " '" + o.layer +
                      "' (softmax_cross_entropy) has " + std::to_string(classes) + " classes: labels " +
                      std::to_string(classes) + ".." + std::to_string(r.classes - 1) +
                      " would stop the run at the first batch holding one; " +
                      (units ? "set units = " + std::to_string(r.classes) + " or more"
                             : "give the layer " + std::to_string(r.classes) + " or more outputs"));
  }
}

}  // namespace kiln
