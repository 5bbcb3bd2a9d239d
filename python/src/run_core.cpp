// kiln.Run's work, done as the app's subcommands do it (apps/kiln): the same plugins, config, checks and messages.
#include "run_core.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "commands.hpp"
#include "kiln/config.hpp"
#include "kiln/data_fit.hpp"
#include "kiln/error.hpp"
#include "kiln/memory_fit.hpp"
#include "kiln/session.hpp"
#include "model_io.hpp"

namespace kiln::python {

RunCore::RunCore(std::string config, std::vector<std::string> overrides, std::vector<std::string> plugin_dirs,
                 std::map<std::string, ArrayData> arrays, std::function<void(Registry&)> more_stages)
    : config_(std::move(config)),
      overrides_(std::move(overrides)),
      plugin_dirs_(std::move(plugin_dirs)),
      arrays_(std::make_shared<const std::map<std::string, ArrayData>>(std::move(arrays))),
      more_stages_(std::move(more_stages)) {
  // As `kiln train` starts: a bad key, value or data file is refused here, before anything runs.
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  const app::Options o = options();
  app::load_plugins(o, loader, reg, config_);
  Config cfg = Config::load_file(config_, overrides_);
  Session s(cfg, reg);
  output_dir_ = s.train().output_dir;
}

LoadedModel::LoadedModel() = default;

LoadedModel::~LoadedModel() {
  runner.reset();  // its buffers belong to the session's allocators
  model.reset();
}

RunCore::~RunCore() { close(); }

app::Options RunCore::options() const {
  app::Options o;
  o.config = config_;
  o.overrides = overrides_;
  o.plugin_dirs = plugin_dirs_;
  o.command_line = "python: kiln.Run(\"";
  o.command_line.append(config_).append("\")");
  auto arrays = arrays_;
  o.extra_stages = [arrays, more = more_stages_](Registry& reg) {
    reg.add_stage("arrays", arrays_stage_factory(arrays));
    if (more) more(reg);
  };
  return o;
}

void RunCore::close() {
  loaded_.reset();  // freed here unless a view of its weights still holds it
  columns_.clear();
}

PlanResult RunCore::plan() {
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  const app::Options o = options();
  app::load_plugins(o, loader, reg, config_);
  Config cfg = Config::load_file(config_, overrides_);
  Session s(cfg, reg);
  if (auto train = s.make_pipeline("train")) s.model().label_shape = train->label_shape();
  s.open_devices(/*reserve=*/false);
  PlanResult r;
  r.check = check_plan(s);
  r.batch_size = s.train().batch_size;
  auto ctx = s.runner_context();
  std::vector<size_t> limits;
  for (auto& d : ctx.devices) limits.push_back(d.allocator->limit());
  r.largest_batch = largest_fitting_batch(s.strategy(), ctx, limits, s.train().batch_size);
  return r;
}

TrainReport RunCore::fit(std::ostream& out, const std::function<void(const std::string&)>& on_record, bool resume,
                         bool overwrite, const std::vector<std::string>& extra_overrides) {
  close();  // the trained weights replace the loaded ones; the devices are the run's now
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  app::Options o = options();
  app::load_plugins(o, loader, reg, config_);
  auto overrides = overrides_;
  overrides.insert(overrides.end(), extra_overrides.begin(), extra_overrides.end());
  if (resume) overrides.push_back("train.resume=true");
  if (overwrite) overrides.push_back("train.overwrite=true");
  Config cfg = Config::load_file(config_, overrides);
  Session s(cfg, reg);
  RunInfo info;
  info.command = o.command_line + (resume ? ".resume()" : ".fit()");
  for (const auto& p : loader.plugins())
    if (p.error.empty() && p.descriptor.name)
      info.plugins.push_back(std::string(p.descriptor.name) + " " +
                             (p.descriptor.version ? p.descriptor.version : "?") + " " + p.path);
  info.on_record = on_record;
  Trainer t(s, out, std::move(info));
  return t.run();
}

void RunCore::load_model() {
  if (loaded_) return;
  app::Options o = options();
  auto l = std::make_shared<LoadedModel>();
  l->model = app::load_trained_model(o);
  Session& s = *l->model->session;
  // The label shape the trainer built its graphs with (the train pipeline's), else the test pipeline's.
  std::unique_ptr<Stage> train = s.make_pipeline("train");
  std::unique_ptr<Stage> test = train ? nullptr : s.make_pipeline("test");
  label_ = train ? train->label_shape() : test ? test->label_shape() : Shape{};
  l->runner = app::make_inference_runner(*l->model, label_);
  loaded_ = std::move(l);
}

ModelInfo RunCore::model_info() {
  load_model();
  const app::TrainedModel& m = model();
  return {m.checkpoint_path, m.checkpoint.epoch, m.checkpoint.step, m.ema};
}

Evaluation RunCore::evaluate(const std::string& data, std::string& where) {
  load_model();
  Session& s = *model().session;
  std::unique_ptr<Stage> d = s.make_pipeline(data);
  if (!d) throw ConfigError(config_ + ": has no [data." + data + "] pipeline to evaluate on (data=)");
  where = describe_source(s.config(), data);
  return kiln::evaluate(runner(), *d, s.model(), /*use_ema=*/false);  // the EMA values are loaded as the weights
}

namespace {

std::string dims_text(const std::vector<int64_t>& d) {
  std::string t;
  for (auto v : d) t += (t.empty() ? "" : ", ") + std::to_string(v);
  return t;
}

// The inputs `kiln predict --input` takes: (N, input_shape...) or one example; finite values, and token ids in
// range where the input feeds an embedding (the app's messages, with "x" for the array).
HostTensor model_inputs(HostTensor x, const ModelSpec& model) {
  const Shape& in = model.input_shape;
  const std::vector<int64_t>& d = x.shape.dims();
  const bool many = d.size() == in.rank() + 1 && std::equal(in.dims().begin(), in.dims().end(), d.begin() + 1);
  if (d == in.dims())
    x.shape = in.with_batch(1);
  else if (!many || d[0] < 1)
    throw DataError("predict: x has shape " + x.shape.str() + ", but the model ([model] input_shape = [" +
                    dims_text(in.dims()) + "]) takes (N, " + dims_text(in.dims()) +
                    "), N >= 1 examples, or one example of shape " + in.str() +
                    (many ? ": the array holds no examples" : ""));
  const std::vector<InputEmbedding> emb = input_embeddings(model);
  const InputEmbedding* ids = nullptr;
  for (const auto& e : emb)
    if (!ids || e.vocab < ids->vocab) ids = &e;
  for (size_t i = 0; i < x.data.size(); ++i) {
    const float v = x.data[i];
    if (!std::isfinite(v))
      throw DataError("predict: x holds a non-finite value (" + std::to_string(v) + ") at flat index " +
                      std::to_string(i) + "; the model's inputs must be finite numbers");
    if (ids && (v < 0 || v >= static_cast<float>(ids->vocab) || v != std::floor(v))) {
      char num[32];
      std::snprintf(num, sizeof num, "%.9g", static_cast<double>(v));
      throw DataError("predict: x holds " + std::string(num) + " at flat index " + std::to_string(i) +
                      ", but the model's input feeds layer " + std::to_string(ids->index) + " '" + ids->layer +
                      "' (type = \"embedding\", vocab = " + std::to_string(ids->vocab) +
                      ") and must hold token ids, integers in [0, " + std::to_string(ids->vocab) + ")");
    }
  }
  return x;
}

}  // namespace

HostTensor RunCore::predict(HostTensor xin) {
  load_model();
  const ModelSpec& model = this->model().session->model();
  HostTensor x = model_inputs(std::move(xin), model);
  const int64_t n = x.shape[0], per = model.input_shape.numel();
  const int64_t batch = std::max<int64_t>(1, this->model().session->train().batch_size);
  std::vector<float> rows;
  std::vector<std::string> names;
  for (int64_t pos = 0; pos < n; pos += batch) {
    const int64_t b = std::min(batch, n - pos);
    Element e;
    e.batch = b;
    e.x = HostTensor(model.input_shape.with_batch(b));
    std::copy(x.data.begin() + pos * per, x.data.begin() + (pos + b) * per, e.x.data.begin());
    e.y = HostTensor(label_.with_batch(b));  // placeholder labels the graph needs and nothing reads
    EvalResult r = runner().eval_batch(e, false);
    std::vector<std::vector<float>> cols(static_cast<size_t>(b));
    // Each head's outputs as `kiln predict` writes them.
    for (size_t h = 0; h < model.outputs.size(); ++h)
      app::append_prediction_columns(model, h, r.outputs[h], b, cols, pos == 0 ? &names : nullptr);
    for (auto& row : cols) rows.insert(rows.end(), row.begin(), row.end());
  }
  columns_ = names;
  HostTensor y;
  y.shape = Shape{n, static_cast<int64_t>(names.size())};
  y.data = std::move(rows);
  return y;
}

std::vector<std::string> RunCore::predict_columns() { return columns_; }

const Shape& RunCore::param_shape(const std::string& name) {
  for (const auto& [n, shape] : model().params)
    if (n == name) return shape;
  std::string known;
  for (const auto& [n, s] : model().params) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("run.weights['" + name + "']: the model has no such weight (it has " + known + ")");
}

Weight RunCore::read_weight(const std::string& name, const Shape& shape) {
  Weight w;
  w.name = name;
  w.shape = shape;
  // The runner's buffer holds what the checkpoint loaded (the EMA values under the parameter's name when the run
  // evaluates with EMA) and what set_weight wrote since. A buffer of another size is not these float32 values.
  std::span<float> v = runner().host_view(name);
  if (!v.empty() && static_cast<int64_t>(v.size()) == shape.numel()) {
    w.view = v;
    w.owner = loaded_;
  } else {
    w.copy = model().weights.at(name);
  }
  return w;
}

std::vector<Weight> RunCore::weights() {
  load_model();
  std::vector<Weight> w;
  for (const auto& [name, shape] : model().params) w.push_back(read_weight(name, shape));
  return w;
}

Weight RunCore::weight(const std::string& name) {
  load_model();
  return read_weight(name, param_shape(name));
}

void RunCore::set_weight(const std::string& name, HostTensor value) {
  load_model();
  const Shape& shape = param_shape(name);
  if (value.shape != shape)
    throw ConfigError("run.weights['" + name + "']: the model's weight has shape " + shape.str() +
                      ", the array given has shape " + value.shape.str());
  // Into the runner's buffer in place (views of it stay valid and see the new values), and into the loaded values
  // the copies are made from.
  std::map<std::string, HostTensor> one;
  one.emplace(name, value);
  runner().load_state(one);
  model().weights.at(name) = std::move(value);
}

void RunCore::export_to(const std::string& path, const std::string& format, const std::string& dtype, bool overwrite,
                        const std::string& checkpoint, std::ostream& out) {
  app::Options o = options();
  o.output = path;
  o.format = format;
  o.dtype = dtype;
  o.overwrite = overwrite;
  o.checkpoint = checkpoint;
  auto* old = std::cout.rdbuf(out.rdbuf());  // the app's line goes where the run's progress goes
  try {
    app::cmd_export(o);
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  std::cout.rdbuf(old);
}

}  // namespace kiln::python
