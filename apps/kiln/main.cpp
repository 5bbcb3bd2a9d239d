// kiln: train, plan, sample, devices, plugins, conformance, evaluate, predict, export. Exit codes: 0 ok, 1 runtime
// failure, 2 usage/config error.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "commands.hpp"
#include "kiln/checkpoint.hpp"
#include "kiln/error.hpp"
#include "kiln/plugin.hpp"
#include "kiln/trainer.hpp"

namespace {

using kiln::app::LaunchOptions;
using kiln::app::Options;

// The subcommands that run something of their own (`plugins` is what runs when none of these was given).
struct Commands {
  CLI::App *train = nullptr, *launch = nullptr, *plan = nullptr, *devices = nullptr, *sample = nullptr, *conf = nullptr,
           *evaluate = nullptr, *predict = nullptr, *exp = nullptr;
};

void add_train_commands(CLI::App& app, Options& o, LaunchOptions& lo, Commands& c) {
  auto* train = c.train = app.add_subcommand("train", "Train the model described by a TOML config");
  train->add_option("config", o.config, "The run's TOML file")->required();
  train->add_option("--set", o.overrides, "Override a config value: --set train.epochs=1 (repeatable)");
  train->add_flag("--resume", o.resume, "Continue from the run's last checkpoint");
  train->add_flag("--overwrite", o.overwrite,
                  "Start over in an output directory that holds an earlier run (else refused)");

  auto* launch = c.launch =
      app.add_subcommand("launch", "Train across N processes: runs mpirun -np N kiln train (needs the mpi plugin)");
  launch->add_option("-n,--ranks", lo.ranks, "How many ranks (processes)")->required();
  launch
      ->add_option("config", o.config,
                   "The run's TOML file ([strategy] communicator = \"mpi\", or process_group = \"mpi\")")
      ->required();
  launch->add_option("--hosts", lo.hosts, "Hosts for mpirun --host: h1,h2 or h1:4,h2:4 (slots per host)");
  launch->add_option("--set", o.overrides, "Override a config value (repeatable; passed to every rank)");
  launch->add_flag("--resume", o.resume, "Continue from the run's last checkpoint");
  launch->add_flag("--overwrite", o.overwrite, "Start over in an output directory that holds an earlier run");
  launch->add_option("--mpirun", lo.mpirun, "The mpirun to run (default: mpirun from PATH)");
  launch
      ->add_option("--mpirun-arg", lo.mpirun_args,
                   "An argument for mpirun, e.g. --mpirun-arg=--oversubscribe (repeatable)")
      ->allow_extra_args(false);
  launch->add_flag("--dry-run", lo.dry_run, "Print the mpirun command instead of running it");
}

void add_plan_and_devices(CLI::App& app, Options& o, Commands& c) {
  auto* plan = c.plan =
      app.add_subcommand("plan", "Show the per-layer table and the step's memory before anything is allocated");
  plan->add_option("config", o.config, "The run's TOML file")->required();
  plan->add_option("--set", o.overrides, "Override a config value (repeatable)");
  plan->add_flag("--sweep", o.sweep, "Write memory against batch size (CSV and SVG), predicted and measured");
  plan->add_option("--sweep-out", o.sweep_out, "Directory for the sweep's files (default: the run's output_dir)");

  auto* devices = c.devices = app.add_subcommand("devices", "List backends, their devices and memory");
  devices->add_option("--backend", o.backend, "Only this backend");
}

void add_sample(CLI::App& app, Options& o, kiln::SampleOptions& so, Commands& c) {
  auto* sample = c.sample =
      app.add_subcommand("sample", "Generate text from a trained character model (nanoGPT's sample.py)");
  sample->add_option("config", o.config, "The run's TOML file")->required();
  sample->add_option("--set", o.overrides, "Override a config value (repeatable)");
  sample->add_option("--checkpoint", so.checkpoint,
                     "Checkpoint to load (default: the run's output_dir/checkpoint.kiln)");
  sample->add_option("--prompt", so.prompt, "Text to start from (default: a newline)");
  sample->add_option("--tokens", so.tokens, "How many tokens to generate (default 500)");
  sample->add_option("--temperature", so.temperature, "Divide the logits by this before sampling (default 0.8)");
  sample->add_option("--top-k", so.top_k, "Sample among the k most likely tokens only; 0 = all (default 200)");
  sample->add_option("--seed", so.seed, "Seed of the sampling (default 1337)");
}

void add_conformance(CLI::App& app, Options& o, Commands& c) {
  auto* conf = c.conf = app.add_subcommand("conformance", "Check a backend's ops against the reference implementation");
  conf->add_option("--backend", o.backend, "Backend to check (e.g. cpu, vulkan, cuda, or a third-party plugin's)")
      ->required();
  conf->add_option("--device", o.device_index, "Device index within the backend");
  conf->add_option("--op", o.op_filter, "Only cases of this op (e.g. gemm)");
  conf->add_option("--case", o.case_id, "Only this case id (from a failure's repro line)");
  conf->add_option("--report", o.report, "Write the JSON report here");
  conf->add_option("--matrix", o.matrix, "Write the op-support matrix (Markdown) here");
  conf->add_option("--tolerances", o.tolerance_dir,
                   "Directory of <backend>.toml tolerance files (default: the installed ones)");
  conf->add_flag("--validation", o.validation, "Vulkan: run with the Khronos validation layer and fail on any message");
}

// Using a trained model (docs/user_guide.md, "Using a trained model").
void add_model_commands(CLI::App& app, Options& o, Commands& c) {
  auto model_cmd = [&](const char* name, const char* what) {
    auto* m = app.add_subcommand(name, what);
    m->add_option("config", o.config, "The run's TOML file")->required();
    m->add_option("--set", o.overrides, "Override a config value (repeatable)");
    m->add_option("--checkpoint", o.checkpoint, "Checkpoint file (default: <output_dir>/checkpoint.kiln)");
    m->add_option("--weights", o.weights, "auto (EMA when [optimizer] ema is set), ema or raw")
        ->check(CLI::IsMember({"auto", "ema", "raw"}));
    return m;
  };
  auto* evaluate = c.evaluate = model_cmd("evaluate", "Loss and accuracy of a checkpoint on a data pipeline");
  evaluate->add_option("--data", o.data, "Which [data.NAME] pipeline (default test)");
  auto* predict = c.predict =
      model_cmd("predict", "Per-example outputs (class probabilities) of a checkpoint, as CSV or .npy");
  predict->add_option("--data", o.data, "Which [data.NAME] pipeline to predict on (default test)");
  predict->add_option("--input", o.input, ".npy of model inputs (N, input_shape...) instead of a pipeline");
  predict->add_option("--output", o.output, "preds.csv or preds.npy")->required();
  predict->add_flag("--overwrite", o.overwrite, "Replace --output if it exists (else refused)");
  auto* exp = c.exp =
      model_cmd("export", "Write a checkpoint's weights as safetensors, or the inference graph as ONNX");
  exp->add_option("--format", o.format, "safetensors or onnx")
      ->required()
      ->check(CLI::IsMember({"safetensors", "onnx"}));
  exp->add_option("--output", o.output, "The file to write")->required();
  exp->add_option("--dtype", o.dtype,
                  "safetensors element type: float32 (default; the checkpoint's values), bfloat16 "
                  "or float16 (rounded to nearest even)")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  exp->add_flag("--overwrite", o.overwrite, "Replace --output if it exists (else refused)");
}

int run_command(const Commands& c, const Options& o, const LaunchOptions& lo, const kiln::SampleOptions& so) {
  if (c.train->parsed()) return kiln::app::cmd_train(o);
  if (c.launch->parsed()) return kiln::app::cmd_launch(o, lo);
  if (c.plan->parsed()) return kiln::app::cmd_plan(o);
  if (c.devices->parsed()) return kiln::app::cmd_devices(o);
  if (c.conf->parsed()) return kiln::app::cmd_conformance(o);
  if (c.sample->parsed()) return kiln::app::cmd_sample(o, so);
  if (c.evaluate->parsed()) return kiln::app::cmd_evaluate(o);
  if (c.predict->parsed()) return kiln::app::cmd_predict(o);
  if (c.exp->parsed()) return kiln::app::cmd_export(o);
  return kiln::app::cmd_plugins(o);
}

// Runs the command; an error is one line on stderr and the exit code: 2 for what the user fixes in the config or
// data, 1 for a runtime failure, 128 + the signal for a stop by SIGINT / SIGTERM.
int run_reporting_errors(const Commands& c, const Options& o, const LaunchOptions& lo, const kiln::SampleOptions& so) {
  try {
    return run_command(c, o, lo, so);
  } catch (const kiln::Interrupted& e) {  // SIGINT / SIGTERM: the step finished and a checkpoint was written
    // Across processes rank 0 says where the checkpoint is; the other ranks stopped with it and say nothing.
    if (kiln::app::error_prefix().rfind("[rank 0 ", 0) == 0 || kiln::app::error_prefix().empty())
      std::cerr << (kiln::app::error_prefix() + "kiln: " + e.what() + "\n");
    return e.exit_code();
  } catch (const kiln::ConfigError& e) {
    std::cerr << (kiln::app::error_prefix() + "kiln: config error: " + e.what() + "\n");
    return 2;
  } catch (const kiln::PluginError& e) {
    std::cerr << (kiln::app::error_prefix() + "kiln: plugin error: " + e.what() + "\n");
    return 2;
  } catch (const kiln::DataError& e) {  // bad input data is the user's to fix, like a bad config
    std::cerr << (kiln::app::error_prefix() + "kiln: data error: " + e.what() + "\n");
    return 2;
  } catch (const kiln::OutOfMemory& e) {
    std::cerr << (kiln::app::error_prefix() + "kiln: " + e.what() + "\n");
    return 1;
  } catch (const kiln::Error& e) {
    std::cerr << (kiln::app::error_prefix() + "kiln: error: " + e.what() + "\n");
    return 1;
  } catch (const std::exception& e) {
    std::cerr << (kiln::app::error_prefix() + "kiln: internal error: " + e.what() + "\n");
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Kiln: a deep-learning training framework built from plugins, configured from TOML"};
  app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION_STRING + " (plugin API " +
                                        std::to_string(kiln::kApiVersion) + ", " + KILN_BUILD_FINGERPRINT + ")");
  app.require_subcommand(1);
  Options o;
  app.add_option("--plugin-dir", o.plugin_dirs, "Extra directory to load plugins from (repeatable)")
      ->check(CLI::ExistingDirectory);
  LaunchOptions lo;
  kiln::SampleOptions so;
  Commands c;
  add_train_commands(app, o, lo, c);
  add_plan_and_devices(app, o, c);
  add_sample(app, o, so, c);
  auto* plugins =
      app.add_subcommand("plugins", "List plugins: what loaded, versions, what each provides, and why any failed");
  plugins->add_flag("--check", o.check_plugins,
                    "Load each plugin file alone in a child process and report OK, FAILED, CRASHED, EXITED or HUNG");
  plugins->add_option("--check-timeout", o.check_timeout, "Seconds a --check child may take (default 10)")
      ->check(CLI::PositiveNumber);
  add_conformance(app, o, c);
  add_model_commands(app, o, c);

  for (int i = 0; i < argc; ++i) o.command_line += (i ? " " : "") + std::string(argv[i]);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return run_reporting_errors(c, o, lo, so);
}
