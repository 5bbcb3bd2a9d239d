// Validates a run's configuration and opens its devices.
#include "kiln/session.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>

#include "kiln/data_fit.hpp"
#include "kiln/error.hpp"
#include "kiln/memory_fit.hpp"
#include "run_ranks.hpp"

namespace kiln {

namespace {

std::string quoted_list(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += (s.empty() ? "\"" : ", \"") + e + "\"";
  return s;
}

// [memory]: the savers go to the model (build_graph applies them), the rest to `mem`.
void parse_memory(const ConfigNode& m, ModelSpec& model, MemorySettings& mem) {
  MemorySavers& s = model.savers;
  s.inplace = m.get_bool("inplace", false);
  auto mode = m.get_choice("recompute", {"none", "auto", "layers"}, m.has("recompute_layers") ? "layers" : "none");
  s.recompute = mode == "auto" ? RecomputeMode::auto_ : mode == "layers" ? RecomputeMode::layers : RecomputeMode::none;
  s.recompute_layers = m.get_string_list("recompute_layers", {});
  if (s.recompute == RecomputeMode::layers && s.recompute_layers.empty())
    m.fail(
        "recompute_layers",
        "recompute = \"layers\" needs the layers to recompute, e.g. recompute_layers = [\"conv2d_2\", \"conv2d_3\"]");
  if (s.recompute != RecomputeMode::layers && !s.recompute_layers.empty())
    m.fail("recompute_layers", "only used with recompute = \"layers\" (found recompute = \"" + mode + "\")");
  std::vector<std::string> names;
  for (const auto& l : model.layers) names.push_back(l.name);
  std::set<std::string> seen;
  for (const auto& l : s.recompute_layers) {
    if (std::find(names.begin(), names.end(), l) == names.end())
      m.fail("recompute_layers", "\"" + l + "\" is not a layer of the model; layers: " + quoted_list(names));
    if (!seen.insert(l).second) m.fail("recompute_layers", "\"" + l + "\" is listed twice");
  }
  s.checkpoint_every = m.get_int("checkpoint_every", 0);
  if (s.checkpoint_every < 0 || s.checkpoint_every == 1)
    m.fail("checkpoint_every",
           "expected 0 (about sqrt(layers)) or a layer count >= 2, found " + std::to_string(s.checkpoint_every));
  if (s.checkpoint_every > 0 && s.recompute != RecomputeMode::auto_)
    m.fail("checkpoint_every", "only used with recompute = \"auto\"");
  mem.sweep_batches = m.get_int_list("sweep_batches", {});
  for (auto b : mem.sweep_batches)
    if (b < 1) m.fail("sweep_batches", "batch sizes must be positive, found " + std::to_string(b));
  m.finish();
}

// [run]: the run's name and seed.
void parse_run(const ConfigNode& run, std::string& name, uint32_t& seed) {
  name = run.get_string("name", "");
  int64_t s = run.get_int("seed", 42);
  if (s < 0 || s > 0xffffffffLL) run.fail("seed", "expected an integer in [0, 4294967295]");
  seed = static_cast<uint32_t>(s);
  run.finish();
}

// A run without [run] name is named after its config file: runs/mnist for mnist.toml.
std::string default_run_name(const std::string& file) {
  auto stem = file;
  auto slash = stem.find_last_of('/');
  if (slash != std::string::npos) stem = stem.substr(slash + 1);
  if (auto dot = stem.rfind(".toml"); dot != std::string::npos) stem = stem.substr(0, dot);
  return stem.empty() ? "run" : stem;
}

// [device]: the session's keys; each backend reads its own from the same table (add_backends).
void parse_device(const ConfigNode& d, const Registry& reg, DeviceSettings& dev) {
  dev.backend = d.get_string("backend", "cpu");
  if (dev.backend != "auto" && !reg.has_backend(dev.backend)) {
    std::string known;
    for (auto& b : reg.backend_names()) known += (known.empty() ? "" : ", ") + b;
    d.fail("backend", "no backend \"" + dev.backend + "\" is loaded; available: auto" +
                          (known.empty() ? "" : ", " + known) +
                          " (see `kiln plugins` for plugins that failed to load)");
  }
  if (d.has("visible") && d.get_int_list("visible", {}).empty())
    d.fail("visible", "expected at least one device index; omit the key to use every device");
  dev.visible = d.get_int_list("visible", {});
  std::set<int64_t> seen;
  for (auto v : dev.visible) {
    if (v < 0)
      d.fail("visible", "entry " + std::to_string(v) +
                            " is not a device index (indices start at 0; Kiln does not treat -1 as 'none')");
    if (!seen.insert(v).second) d.fail("visible", "device " + std::to_string(v) + " is listed twice");
  }
  dev.memory_limit = d.get_size_text("memory_limit", "");
  if (d.has("memory_limit") && dev.memory_limit.empty())
    d.fail("memory_limit",
           "is empty; give bytes like \"1200MiB\" or a share like \"60%\", or leave the key out for the whole device");
  if (!dev.memory_limit.empty()) {
    try {
      parse_memory_size(dev.memory_limit, 1ull << 40);  // syntax only; the device's total is checked at open
    } catch (const ConfigError& e) {
      d.fail("memory_limit", e.what());
    }
  }
  dev.growth = d.get_bool("growth", true);
  dev.fallback = d.get_choice("fallback", {"error", "cpu"}, "error");
  dev.select = d.get_choice("select", {"first", "most_free_memory"}, "first");
  int64_t fault = d.get_int("fault_injection_block", 0);
  if (fault < 0 || fault > 1000000)
    d.fail("fault_injection_block", "expected 0 (off) or the 1-based block request to fail");
  // growth = false reserves the whole limit in one block request when the device opens; none follows.
  if (fault > 1 && !dev.growth)
    d.fail("fault_injection_block", "is " + std::to_string(fault) +
                                        ", but with growth = false the allocator makes 1 block request per "
                                        "device (the whole memory_limit, reserved at start), so request #" +
                                        std::to_string(fault) +
                                        " never happens; use 1 to fail that reservation, or set growth = true");
  dev.fail_block_request = static_cast<int>(fault);
}

// Every loaded backend is made now and reads its keys (auto and the fallback may pick any of them), so a key that no
// backend reads is an unknown key. Making a backend touches no driver; enumerate() does.
void add_backends(const ConfigNode& d, const Registry& reg, const std::string& backend,
                  std::vector<std::unique_ptr<Backend>>& backends) {
  for (const auto& name : reg.backend_names()) backends.push_back(reg.backend(name)(BackendOptions(d)));
  std::stable_sort(backends.begin(), backends.end(),
                   [](const auto& a, const auto& b) { return a->priority() > b->priority(); });
  // The backends this run may use check their configuration (e.g. CUDA_VISIBLE_DEVICES) before any device opens.
  for (const auto& b : backends)
    if (backend == "auto" || b->name() == backend) b->check_config();
}

// [train] early_stopping.
void parse_early_stopping(const ConfigNode& es, EarlyStopping& e) {
  e.on = true;
  e.metric = es.get_choice("metric", {"test_loss", "test_accuracy", "train_loss"}, "test_loss");
  e.patience = es.get_int("patience", 3);
  if (e.patience < 1) es.fail("patience", "expected a positive number of epochs, got " + std::to_string(e.patience));
  e.min_delta = es.get_float("min_delta", 0.0);
  if (!(e.min_delta >= 0) || !std::isfinite(e.min_delta)) es.fail("min_delta", "expected a finite value >= 0");
  e.restore_best = es.get_bool("restore_best", true);
  es.finish();
}

void parse_train(const ConfigNode& t, TrainSettings& train) {
  train.epochs = t.get_int("epochs", 1);
  if (train.epochs < 1) t.fail("epochs", "expected a positive integer");
  train.batch_size = t.get_int("batch_size", 32);
  if (train.batch_size < 1) t.fail("batch_size", "expected a positive integer");
  train.steps_per_epoch = t.get_int("steps_per_epoch", 0);
  if (train.steps_per_epoch < 0) t.fail("steps_per_epoch", "expected 0 (whole epoch) or a positive integer");
  train.evaluate = t.get_bool("evaluate", true);
  train.progress = t.get_choice("progress", {"auto", "bar", "lines", "none"}, "auto");
  train.output_dir = t.get_string("output_dir", "");
  train.checkpoint_every = t.get_int("checkpoint_every", 1);
  if (train.checkpoint_every < 0) t.fail("checkpoint_every", "expected 0 (never) or a number of epochs");
  train.checkpoint_every_steps = t.get_int("checkpoint_every_steps", 0);
  if (train.checkpoint_every_steps < 0)
    t.fail("checkpoint_every_steps",
           "expected 0 (off) or a positive number of steps, got " + std::to_string(train.checkpoint_every_steps));
  train.checkpoint_every_minutes = t.get_float("checkpoint_every_minutes", 0.0);
  if (!(train.checkpoint_every_minutes >= 0) || train.checkpoint_every_minutes > 1e7)
    t.fail("checkpoint_every_minutes", "expected 0 (off) or a positive number of minutes");
  train.keep_checkpoints = t.get_int("keep_checkpoints", 1);
  if (train.keep_checkpoints < 1)
    t.fail("keep_checkpoints", "expected a positive number of checkpoints to keep (1 = the newest only), got " +
                                   std::to_string(train.keep_checkpoints));
  if (auto es = t.table("early_stopping")) parse_early_stopping(*es, train.early_stopping);
  train.divergence_factor = t.get_float("divergence_factor", 100.0);
  if (!(train.divergence_factor == 0 || train.divergence_factor > 1) || !std::isfinite(train.divergence_factor))
    t.fail("divergence_factor",
           "expected 0 (no divergence check) or a factor above 1: the run stops when the mean loss of the last 10 "
           "steps exceeds this many times that of its first 10 (default 100)");
  train.max_steps = t.get_int("max_steps", 0);
  if (train.max_steps < 0) t.fail("max_steps", "expected 0 (no cap) or a positive number of steps");
  train.resume = t.get_bool("resume", false);
  train.overwrite = t.get_bool("overwrite", false);
  if (train.resume && train.overwrite)
    t.fail("overwrite",
           "is true and so is resume (--overwrite and --resume): continue the run in the output directory, or "
           "start it over, not both");
  train.memory_policy = t.get_choice("memory_policy", {"strict", "fit", "none"}, "strict");
  train.device_prefetch = t.get_bool("device_prefetch", true);
  t.finish();
}

void parse_log(const ConfigNode& l, TrainSettings& train) {
  train.log_every_steps = l.get_int("every_steps", 0);
  if (train.log_every_steps < 0)
    l.fail("every_steps", "expected 0 (epoch records only) or a positive number of steps, got " +
                              std::to_string(train.log_every_steps));
  train.tensorboard = l.get_bool("tensorboard", false);
  l.finish();
}

// [strategy] type (its registered name; "single" without the table) and the strategy it makes.
std::unique_ptr<Strategy> make_strategy(const ConfigNode& root, const Registry& reg, const std::string& file,
                                        std::string& type) {
  auto s = root.table("strategy");
  if (!s) {
    auto empty = Config::load_string("", file);
    return reg.strategy("single")(empty.root());
  }
  type = s->get_string("type", "single");
  if (!reg.has_strategy(type)) {
    std::string known;
    for (auto& n : reg.strategy_names()) known += (known.empty() ? "" : ", ") + n;
    s->fail("type", "unknown strategy \"" + type + "\"; registered: " + known + " (is the parallel plugin loaded?)");
  }
  return reg.strategy(type)(*s);
}

// [data.train] and [data.test]: a pipeline has stages, each of a registered type (the stages check their own keys
// when the pipeline is built).
// [data] decoded_budget: "auto" (the default) = a quarter of the host's available memory (MemAvailable) when the
// session starts, "off" (or 0) = every source streams, else a size ("512MiB", "2GB", bytes, or "10%" of MemAvailable).
// Each source (train and test) may keep up to this much decoded in memory.
uint64_t host_available_memory() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    std::fclose(f);
    if (found) return static_cast<uint64_t>(kb) * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

uint64_t parse_decoded_budget(const ConfigNode& d) {
  const std::string text = d.get_size_text("decoded_budget", "auto");
  if (text == "auto") return host_available_memory() / 4;
  if (text == "off") return 0;
  try {
    return parse_memory_size(text, static_cast<size_t>(host_available_memory()));
  } catch (const ConfigError&) {
    d.fail("decoded_budget", "is \"" + text +
                                 "\": expected \"auto\" (a quarter of the host's available memory), \"off\" (every "
                                 "source streams), a size such as \"512MiB\" or \"2GB\", or a share of the available "
                                 "memory such as \"10%\"");
  }
}

void check_data_stages(const ConfigNode& d, const Registry& reg) {
  for (const char* which : {"train", "test"}) {
    auto p = d.table(which);
    if (!p) continue;
    auto stages = p->table_array("stages");
    if (stages.empty()) p->fail("stages", "a pipeline needs at least a source stage");
    for (auto& s : stages) {
      auto type = s.get_string("type");
      if (!reg.has_stage(type)) {
        std::string known;
        for (auto& n : reg.stage_names()) known += (known.empty() ? "" : ", ") + n;
        s.fail("type", "unknown data stage \"" + type +
                           "\"; registered: " + (known.empty() ? "none (is the data plugin loaded?)" : known));
      }
    }
    p->finish();
  }
  d.finish();
}

}  // namespace

Session::Session(const Config& cfg, Registry& reg) : cfg_(cfg), reg_(reg) {
  ConfigNode root = cfg_.root();
  root.ignore("plugins");  // handled by the host before the session (plugins must load first)
  if (auto run = root.table("run")) parse_run(*run, name_, seed_);
  if (name_.empty()) name_ = default_run_name(cfg_.file());
  {
    const std::optional<ConfigNode> d = root.has("device") ? root.table("device") : BackendOptions().device;
    parse_device(*d, reg_, device_);
    add_backends(*d, reg_, device_.backend, backends_);
    d->finish();
  }
  if (auto t = root.table("train")) parse_train(*t, train_);
  if (train_.output_dir.empty()) train_.output_dir = "runs/" + name_;
  if (auto l = root.table("log")) parse_log(*l, train_);

  auto m = root.table("model");
  if (!m) root.fail("model", "missing [model] table (input_shape and layers)");
  model_ = parse_model(*m, reg_);
  model_.seed = seed_;
  if (auto mem = root.table("memory")) parse_memory(*mem, model_, memory_);
  if (auto pr = root.table("precision")) model_.precision = parse_precision(*pr);
  if (auto o = root.table("optimizer")) optimizer_ = parse_optimizer(*o);
  if (auto i = root.table("init")) init_ = parse_init(*i, cfg_.base_dir());
  if (optimizer_.schedule.kind == ScheduleKind::cosine && optimizer_.schedule.total_steps == 0)
    optimizer_.schedule.total_steps = 0;  // filled by the trainer once the epoch length is known

  std::string stype = "single";
  strategy_ = make_strategy(root, reg_, cfg_.file(), stype);
  if (device_.fail_block_request > 1 && device_.growth && stype == "single") check_fault_injection();
  if (model_.precision.loss_scaling && stype != "single")
    root.table("precision")
        ->fail("compute",
               "float16 with dynamic loss scaling runs with the single strategy only for now (strategy \"" + stype +
                   "\" would have to agree on skipped steps across replicas); use compute = \"bfloat16\", which "
                   "needs no loss scaling, or loss_scale = \"none\"");
  if (auto d = root.table("data")) {
    decoded_budget_ = parse_decoded_budget(*d);
    check_data_stages(*d, reg_);
  } else {
    decoded_budget_ = host_available_memory() / 4;
  }
  root.finish();
  // Build each pipeline once so every stage validates its keys and files before anything else happens, then check
  // the shapes it delivers against the model: a mismatch is a config error here, not a failure at step 1.
  for (const char* which : {"train", "test"})
    if (has_pipeline(which)) check_data_shapes(which, *m);
}

void Session::check_fault_injection() const {
  // With growth, a block request happens only when an allocation finds no free range: first the planned reservation
  // (memory_policy strict/fit, and each batch size of a sweep; a second request retries its exact size), then at most
  // 4 per allocation (a block and its exact-size retry, once more after free blocks are given back). A single-device
  // run allocates its persistent tensors once and at most 4 regions (gradients, arena, input, workspace) per step
  // graph: training and evaluation at the full and the last batch size, NaN tracing, and each batch size of a `kiln
  // plan --sweep`.
  GraphOptions go;
  go.batch = 1;
  go.training = false;
  Graph g = build_graph(model_, go);
  size_t params = 0;
  for (const auto& t : g.tensors()) params += t.role == TensorRole::parameter && t.alias_of == kNoTensor;
  const size_t persistent = params * (1 + optimizer_.state_tensors_per_param() + (optimizer_.ema_decay > 0 ? 1 : 0));
  const size_t graphs = 5 + std::max<size_t>(memory_.sweep_batches.size(), 25);
  const size_t most = 2 * graphs + 4 * (persistent + 4 * graphs);
  if (static_cast<size_t>(device_.fail_block_request) <= most) return;
  cfg_.root().table("device")->fail(
      "fault_injection_block",
      "is " + std::to_string(device_.fail_block_request) + ", but this run makes at most " + std::to_string(most) +
          " block requests per device (growth = true: 2 per planned reservation, then at most 4 for each allocation "
          "that "
          "finds no room: its " +
          std::to_string(persistent) + " persistent tensors and at most 4 regions for each of " +
          std::to_string(graphs) + " step graphs), so request #" + std::to_string(device_.fail_block_request) +
          " never happens; use a number from 1 to " + std::to_string(most));
}

void Session::check_data_shapes(const std::string& which, const ConfigNode& model) {
  std::vector<StageShapes> shapes;
  make_pipeline(which, &shapes);
  if (shapes.empty()) return;
  if (which == "train") model_.label_names = label_names_;
  {
    auto outs = model.table_array("outputs");
    std::string known;
    for (const auto& n : model_.label_names) known += (known.empty() ? "\"" : ", \"") + n + "\"";
    for (size_t i = 0; i < model_.outputs.size() && i < outs.size(); ++i) {
      const std::string& l = model_.outputs[i].label;
      if (l.empty() || std::find(model_.label_names.begin(), model_.label_names.end(), l) != model_.label_names.end())
        continue;
      outs[i].fail("label",
                   "is \"" + l + "\", but " + describe_source(cfg_, "train") +
                       (known.empty() ? " names no labels (the csv source names several with label = [\"a\", \"b\"])"
                                      : " names its labels " + known));
    }
  }
  // The stage that last changed the example (or label) shape is where a mismatch comes from.
  auto shaped_by = [&](bool labels) {
    size_t k = 0;
    for (size_t i = 1; i < shapes.size(); ++i)
      if ((labels ? shapes[i].y : shapes[i].x) != (labels ? shapes[i - 1].y : shapes[i - 1].x)) k = i;
    return "stages[" + std::to_string(k) + "] (type = \"" + shapes[k].type + "\")";
  };
  const std::string source = describe_source(cfg_, which);
  const Shape x = shapes.back().x, y = shapes.back().y;
  auto toml_list = [](const Shape& s) {
    std::string t;
    for (auto d : s.dims()) t += (t.empty() ? "" : ", ") + std::to_string(d);
    return "[" + t + "]";
  };
  auto values = [](const Shape& s) { return std::to_string(s.numel()) + (s.numel() == 1 ? " value" : " values"); };
  if (!x.dims().empty() && x.numel() != model_.input_shape.numel())
    model.fail("input_shape", "is " + model_.input_shape.str() + " (" + values(model_.input_shape) +
                                  " per example), but " + source + " delivers examples of shape " + x.str() + " (" +
                                  values(x) + "), shaped by " + shaped_by(false) +
                                  "; set input_shape = " + toml_list(x) + " or make the data match the model");
  check_data_fit(cfg_, which, model_, vocab_, y,
                 describe_source(cfg_, which));  // token ids and class indices the source can deliver
  // Labels against each head's loss. The heads' widths come from a forward graph of one example (nothing allocated).
  GraphOptions go;
  go.batch = 1;
  go.training = false;
  Graph g = build_graph(model_, go);  // model_.label_shape is still unset here: the labels are checked below
  auto outs = model.table_array("outputs");
  if (!model_.label_names.empty() && !model_.outputs.empty() && !model_.outputs[0].label.empty()) {
    // Named labels: one value per name; each output's own label was checked when the graph was built.
    const int64_t names = static_cast<int64_t>(model_.label_names.size());
    if (y.numel() != names)
      model.fail("outputs",
                 "the outputs name their labels, but " + source + " delivers labels of shape " + y.str() + " (" +
                     values(y) + "), shaped by " + shaped_by(true) + ", for its " + std::to_string(names) +
                     " named labels: stages that change the labels (e.g. one_hot) cannot be used with named labels");
    return;
  }
  for (size_t i = 0; i < model_.outputs.size() && i < g.outputs.size(); ++i) {
    const OutputSpec& o = model_.outputs[i];
    const Shape out = g.tensor(g.outputs[i]).shape.tail();
    const int64_t width = out.numel(), labels = y.numel();
    std::string expected;
    if (o.loss == LossKind::softmax_cross_entropy) {
      // A class index per position (one for (classes) logits, T for a sequence's (T, classes)), or one-hot labels.
      const int64_t classes = out.rank() ? out[out.rank() - 1] : 1, positions = width / std::max<int64_t>(classes, 1);
      if (labels == positions || labels == width) continue;
      const Shape idx(std::vector<int64_t>(out.dims().begin(), out.dims().end() - (out.rank() ? 1 : 0)));
      expected = (positions > 1 ? "a class index per position (shape " : "a class index (shape ") + idx.str() +
                 ") or one-hot labels of shape " + out.str();
    } else {
      if (labels == width) continue;
      expected = "targets shaped like the output, " + out.str();
    }
    const char* loss = o.loss == LossKind::softmax_cross_entropy ? "softmax_cross_entropy"
                       : o.loss == LossKind::mse                 ? "mse"
                                                                 : "binary_cross_entropy";
    const std::string msg = "output '" + o.layer + "' (" + out.str() + " per example, loss " + loss + ") needs " +
                            expected + ", but " + source + " delivers labels of shape " + y.str() + " (" + values(y) +
                            "), shaped by " + shaped_by(true);
    if (i < outs.size()) outs[i].fail("loss", msg);
    model.fail("loss", msg);
  }
}

Session::~Session() {
  allocators_.clear();
  opened_.clear();
}

bool Session::has_pipeline(const std::string& which) const {
  auto d = cfg_.root().table("data");
  return d && d->has(which);
}

std::unique_ptr<Stage> Session::make_pipeline(const std::string& which, std::vector<StageShapes>* shapes) const {
  auto d = cfg_.root().table("data");
  if (!d || !d->has(which)) return nullptr;
  auto p = d->table(which);
  std::unique_ptr<Stage> cur;
  bool batched = false;
  // An MPI rank's train pipeline reads only the rows of each batch its replicas train on (when the stages can);
  // evaluation keeps every row: the accuracy compares the gathered outputs with every row's labels.
  const RowShare rows = which == "train" ? train_rows(cfg_, *strategy_, train_.batch_size) : RowShare{};
  for (auto& s : p->table_array("stages")) {
    auto type = s.get_string("type");
    StageContext ctx;
    ctx.upstream = std::move(cur);
    ctx.base_dir = cfg_.base_dir();
    ctx.global_batch = train_.batch_size;
    ctx.seed = seed_;
    ctx.pipeline = which;
    ctx.decoded_budget = decoded_budget_;
    ctx.rows_begin = rows.begin;
    ctx.rows_end = rows.end;
    const bool source = !ctx.upstream;
    cur = reg_.stage(type)(s, std::move(ctx));
    if (source) (which == "train" ? reading_train_ : reading_test_) = cur->reading();
    if (source && which == "train") {
      vocab_ = cur->vocabulary();  // saved with the run (vocab.json)
      label_names_ = cur->label_names();
    }
    // Named labels must mean the same in both pipelines (outputs find their label by name in [data.train]'s order).
    if (source && which == "test" && cur->label_names() != label_names_ &&
        (!label_names_.empty() || !cur->label_names().empty())) {
      auto list = [](const std::vector<std::string>& v) {
        std::string t;
        for (const auto& n : v) t += (t.empty() ? "\"" : ", \"") + n + "\"";
        return v.empty() ? std::string("none") : "[" + t + "]";
      };
      s.fail("label", "this source's named labels are " + list(cur->label_names()) + ", but [data.train]'s are " +
                          list(label_names_) + ": both pipelines must deliver the same labels in the same order");
    }
    // Ids must mean the same tokens in both pipelines (a vocabulary is built from its own file).
    if (source && which == "test" && !vocab_.empty() && !cur->vocabulary().empty() && cur->vocabulary() != vocab_)
      s.fail("path",
             "this text source's vocabulary differs from [data.train]'s, so the same id would stand for "
             "different characters; read the same file (split = \"val\" holds out its last val_fraction) or "
             "files with the same set of characters");
    if (type == "batch") batched = true;
    if (shapes) shapes->push_back({type, cur->example_shape(), cur->label_shape()});
  }
  if (!batched) {
    auto empty = Config::load_string("", cfg_.file());
    StageContext ctx;
    ctx.upstream = std::move(cur);
    ctx.base_dir = cfg_.base_dir();
    ctx.global_batch = train_.batch_size;
    ctx.seed = seed_;
    ctx.pipeline = which;
    ctx.rows_begin = rows.begin;
    ctx.rows_end = rows.end;
    cur = reg_.stage("batch")(empty.root(), std::move(ctx));
  }
  return cur;
}

namespace {

// The backend open_devices opens devices of, and the devices it offers.
struct BackendChoice {
  Backend* backend = nullptr;
  std::string name;
  std::vector<DeviceInfo> infos;
};

// The first backend by priority with a device that `keep` accepts; infos = those devices. `none_why` collects why
// each backend tried had none.
template <class Keep>
bool first_backend_with(const std::vector<std::unique_ptr<Backend>>& backends, Keep keep, BackendChoice& c,
                        std::string& none_why) {
  for (const auto& b : backends) {
    if (b->priority() < 0) continue;
    auto list = b->enumerate();
    const std::string why = b->unavailable_reason();
    list.erase(std::remove_if(list.begin(), list.end(), [&](const DeviceInfo& i) { return !keep(i); }), list.end());
    if (!list.empty()) {
      c.backend = b.get();
      c.infos = std::move(list);
      c.name = b->name();
      return true;
    }
    none_why += "\n  " + b->name() + ": " + (why.empty() ? "no usable device" : why);
  }
  return false;
}

// [device] backend, "auto", or the CPU when the configured backend has no device and [device] fallback = "cpu" (a
// warning in `warnings` and on stderr).
BackendChoice choose_backend(const std::vector<std::unique_ptr<Backend>>& backends, const DeviceSettings& dev,
                             const std::string& file, std::vector<std::string>& warnings) {
  BackendChoice c;
  c.name = dev.backend;
  std::string none_why;
  // A device of type cpu behind a backend that cannot share host memory is a GPU API emulated on the CPU
  // (lavapipe): slower than the CPU backend on the same cores, so auto skips it. The fallback wants the host CPU.
  auto for_auto = [](const DeviceInfo& i) { return i.type != DeviceType::cpu || i.host_addressable; };
  auto host_cpu = [](const DeviceInfo& i) { return i.type == DeviceType::cpu && i.host_addressable; };
  if (c.name == "auto") {
    if (!first_backend_with(backends, for_auto, c, none_why))
      throw DeviceError("[device] backend = \"auto\": no backend has a usable device:" + none_why);
    return c;
  }
  Backend* b = nullptr;
  for (const auto& candidate : backends)
    if (candidate->name() == c.name) b = candidate.get();
  if (!b) throw DeviceError("[device] backend = \"" + c.name + "\" is not loaded");
  c.infos = b->enumerate();
  if (!c.infos.empty()) {
    c.backend = b;
    return c;
  }
  const std::string why = b->unavailable_reason();
  if (dev.fallback != "cpu")
    throw DeviceError(file + ": [device] backend = \"" + c.name + "\" has no usable device" +
                      (why.empty() ? "" : ": " + why) +
                      ". Set [device] fallback = \"cpu\" to train on the CPU instead.");
  warnings.push_back("WARNING: backend \"" + c.name + "\" has no usable device (" + why +
                     "); FALLING BACK TO THE CPU because [device] fallback = \"cpu\"");
  std::cerr << "\n*** " << warnings.back() << " ***\n\n";
  if (!first_backend_with(backends, host_cpu, c, none_why))
    throw DeviceError("CPU fallback requested but no loaded backend has a host CPU device:" + none_why);
  return c;
}

// The candidate devices (indexes into c.infos): [device] visible, or every device. visible indexes the configured
// backend's devices ("auto": the one it chose); a CPU fallback ignores it.
std::vector<int64_t> candidate_devices(const BackendChoice& c, const DeviceSettings& dev, const std::string& file) {
  const bool use_visible = c.name == dev.backend || dev.backend == "auto";
  std::vector<int64_t> order = use_visible ? dev.visible : std::vector<int64_t>{};
  if (order.empty())
    for (size_t i = 0; i < c.infos.size(); ++i) order.push_back(static_cast<int64_t>(i));
  if (use_visible)
    for (auto v : dev.visible)
      if (v >= static_cast<int64_t>(c.infos.size()))
        throw ConfigError(file + ": [device] visible lists device " + std::to_string(v) + ", but backend \"" + c.name +
                          "\" has " + std::to_string(c.infos.size()) + " device(s) (0.." +
                          std::to_string(c.infos.size() - 1) + ")");
  return order;
}

// Orders the candidates by [device] select (free memory counts what other jobs promised, `holders`, as used) and
// keeps as many as the strategy wants.
void select_devices(std::vector<int64_t>& order, const BackendChoice& c,
                    const std::vector<std::vector<ReservationHolder>>& holders, const std::string& select,
                    const Strategy& strategy, const std::string& file) {
  auto effective_free = [&](int64_t i) {
    const auto& d = c.infos[static_cast<size_t>(i)];
    size_t promised = total_bytes(holders[static_cast<size_t>(i)]);
    return std::min(d.free_memory, d.total_memory > promised ? d.total_memory - promised : 0);
  };
  if (select == "most_free_memory")
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return effective_free(a) > effective_free(b); });
  size_t want = static_cast<size_t>(std::max(1, strategy.device_count(static_cast<int>(order.size()))));
  if (want > order.size())
    throw ConfigError(file + ": strategy \"" + strategy.name() + "\" needs " + std::to_string(want) +
                      " devices but only " + std::to_string(order.size()) + " are visible on backend \"" + c.name +
                      "\"");
  order.resize(want);
}

// A device being opened: the device, its memory limit and the other Kiln jobs' reservations on it.
struct Opening {
  std::unique_ptr<Device> dev;
  size_t limit = 0;
  const std::vector<ReservationHolder>* others = nullptr;
};

// Opens every chosen device and works out its limit, so the limits of devices that share one physical memory are
// checked together before anything is reserved or allocated.
std::vector<Opening> open_each(Backend& backend, const std::vector<int64_t>& order,
                               const std::vector<DeviceInfo>& infos,
                               const std::vector<std::vector<ReservationHolder>>& holders,
                               const std::string& memory_limit, const std::string& file) {
  std::vector<Opening> opening;
  for (auto idx : order) {
    Opening o;
    o.dev = backend.open(infos[static_cast<size_t>(idx)].index);  // the backend's own index ("auto" filters its list)
    const DeviceInfo& info = o.dev->info();
    o.others = &holders[static_cast<size_t>(idx)];
    const size_t total = info.total_memory, promised = total_bytes(*o.others);
    if (!memory_limit.empty()) {
      o.limit = parse_memory_size(memory_limit, total);
      if (o.limit > total)
        throw ConfigError(file + ": [device] memory_limit = \"" + memory_limit + "\" (" + format_bytes(o.limit) +
                          ") exceeds the " + format_bytes(total) + " of " + info.label() + " (" + info.name + ")");
    } else {
      // No promise made: bounded by what other jobs have not reserved.
      if (promised >= total)
        throw DeviceError(info.label() + " (" + info.name + "): other Kiln jobs have reserved all of its " +
                          format_bytes(total) + ":\n" + format_holders(*o.others) +
                          "Choose another device or wait for a holder to finish.");
      o.limit = total - promised;
    }
    opening.push_back(std::move(o));
  }
  return opening;
}

// Devices sharing one physical memory (the host CPU backend's logical devices): without memory_limit they split it
// equally; an explicit memory_limit (bytes or a share, per device) must fit it summed over them.
void share_host_memory(std::vector<Opening>& opening, const Config& cfg, const std::string& memory_limit) {
  size_t sharing = 0;
  for (const auto& o : opening) sharing += shares_host_memory(o.dev->info());
  if (sharing > 1 && memory_limit.empty())
    for (auto& o : opening)
      if (shares_host_memory(o.dev->info())) o.limit /= sharing;
  std::vector<std::pair<const DeviceInfo*, size_t>> limits;
  for (const auto& o : opening) limits.emplace_back(&o.dev->info(), o.limit);
  const std::string over = shared_memory_overcommit(limits);
  if (over.empty()) return;
  const std::string msg = "\"" + memory_limit + "\" " + over;
  if (auto d = cfg.root().table("device"); d && d->has("memory_limit")) d->fail("memory_limit", msg);
  throw ConfigError(cfg.file() + ": [device] memory_limit " + msg);
}

}  // namespace

void Session::open_devices(bool reserve) {
  if (!device_ctx_.empty()) return;
  const BackendChoice c = choose_backend(backends_, device_, cfg_.file(), warnings_);
  backend_ = c.backend;
  std::vector<int64_t> order = candidate_devices(c, device_, cfg_.file());
  // What other Kiln jobs have promised on each candidate; select counts it as used.
  std::vector<std::vector<ReservationHolder>> holders(c.infos.size());
  for (auto idx : order)
    holders[static_cast<size_t>(idx)] = live_reservations(c.infos[static_cast<size_t>(idx)].hardware_id);
  select_devices(order, c, holders, device_.select, *strategy_, cfg_.file());
  std::vector<Opening> opening = open_each(*backend_, order, c.infos, holders, device_.memory_limit, cfg_.file());
  share_host_memory(opening, cfg_, device_.memory_limit);
  for (auto& o : opening) {
    const DeviceInfo& info = o.dev->info();
    const size_t total = info.total_memory;
    AllocatorOptions ao;
    ao.limit = o.limit;
    if (!device_.memory_limit.empty() && reserve)  // throws naming the holders
      reservations_.push_back(Reservation::acquire(info, ao.limit, total, reservation_root(), name_));
    const size_t free_now = o.dev->query_free_memory();
    if (!device_.memory_limit.empty() && ao.limit > free_now && reserve) {
      warnings_.push_back(
          "WARNING: the memory limit " + format_bytes(ao.limit) + " on " + info.label() + " is more than the " +
          format_bytes(free_now) +
          " the device reports free now (other processes use memory); the run may "
          "fail when it allocates. Lower [device] memory_limit or set growth = false to claim it at start.");
      std::cerr << "*** " << warnings_.back() << " ***\n";
    }
    // growth = false claims the whole limit from the device at start; a dry run (`kiln plan`) plans it but claims
    // nothing, so planning never takes memory another job is using or about to use.
    ao.growth = device_.growth || !reserve;
    ao.fail_block_request = device_.fail_block_request;
    allocators_.push_back(std::make_unique<Allocator>(*o.dev, ao));
    const size_t i = device_ctx_.size();
    allocators_.back()->set_oom_hint_provider(
        [this, i] { return oom_advice(strategy(), runner_context(), model(), i); });
    device_ctx_.push_back(DeviceContext{o.dev.get(), allocators_.back().get()});
    others_.push_back(*o.others);
    opened_.push_back(std::move(o.dev));
  }
}

RunnerContext Session::runner_context() const {
  RunnerContext c;
  c.model = &model_;
  c.optimizer = &optimizer_;
  c.devices = device_ctx_;
  c.global_batch = train_.batch_size;
  c.seed = seed_;
  c.input_slots = train_.device_prefetch ? 2 : 1;
  return c;
}

}  // namespace kiln
