// kiln: train, plan, sample, devices, plugins, conformance. Exit codes: 0 ok, 1 runtime failure, 2 usage/config error.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "commands.hpp"
#include "kiln/error.hpp"
#include "kiln/plugin.hpp"
#include "kiln/trainer.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Kiln: a deep-learning training framework built from plugins, configured from TOML"};
  app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION_STRING + " (plugin API " +
                                        std::to_string(kiln::kApiVersion) + ", " + KILN_BUILD_FINGERPRINT + ")");
  app.require_subcommand(1);
  kiln::app::Options o;
  app.add_option("--plugin-dir", o.plugin_dirs, "Extra directory to load plugins from (repeatable)")
      ->check(CLI::ExistingDirectory);

  auto* train = app.add_subcommand("train", "Train the model described by a TOML config");
  train->add_option("config", o.config, "The run's TOML file")->required();
  train->add_option("--set", o.overrides, "Override a config value: --set train.epochs=1 (repeatable)");
  train->add_flag("--resume", o.resume, "Continue from the run's last checkpoint");
  train->add_flag("--overwrite", o.overwrite, "Start over in an output directory that holds an earlier run (else refused)");

  auto* plan = app.add_subcommand("plan", "Show the per-layer table and the step's memory before anything is allocated");
  plan->add_option("config", o.config, "The run's TOML file")->required();
  plan->add_option("--set", o.overrides, "Override a config value (repeatable)");
  plan->add_flag("--sweep", o.sweep, "Write memory against batch size (CSV and SVG), predicted and measured");
  plan->add_option("--sweep-out", o.sweep_out, "Directory for the sweep's files (default: the run's output_dir)");

  auto* devices = app.add_subcommand("devices", "List backends, their devices and memory");
  devices->add_option("--backend", o.backend, "Only this backend");

  kiln::SampleOptions so;
  auto* sample = app.add_subcommand("sample", "Generate text from a trained character model (nanoGPT's sample.py)");
  sample->add_option("config", o.config, "The run's TOML file")->required();
  sample->add_option("--set", o.overrides, "Override a config value (repeatable)");
  sample->add_option("--checkpoint", so.checkpoint, "Checkpoint to load (default: the run's output_dir/checkpoint.kiln)");
  sample->add_option("--prompt", so.prompt, "Text to start from (default: a newline)");
  sample->add_option("--tokens", so.tokens, "How many tokens to generate (default 500)");
  sample->add_option("--temperature", so.temperature, "Divide the logits by this before sampling (default 0.8)");
  sample->add_option("--top-k", so.top_k, "Sample among the k most likely tokens only; 0 = all (default 200)");
  sample->add_option("--seed", so.seed, "Seed of the sampling (default 1337)");

  app.add_subcommand("plugins", "List plugins: what loaded, versions, what each provides, and why any failed");

  auto* conf = app.add_subcommand("conformance", "Check a backend's ops against the reference implementation");
  conf->add_option("--backend", o.backend, "Backend to check (e.g. cpu, vulkan, cuda, or a third-party plugin's)")->required();
  conf->add_option("--device", o.device_index, "Device index within the backend");
  conf->add_option("--op", o.op_filter, "Only cases of this op (e.g. gemm)");
  conf->add_option("--case", o.case_id, "Only this case id (from a failure's repro line)");
  conf->add_option("--report", o.report, "Write the JSON report here");
  conf->add_option("--matrix", o.matrix, "Write the op-support matrix (Markdown) here");
  conf->add_option("--tolerances", o.tolerance_dir, "Directory of <backend>.toml tolerance files (default: the installed ones)");
  conf->add_flag("--validation", o.validation, "Vulkan: run with the Khronos validation layer and fail on any message");

  for (int i = 0; i < argc; ++i) o.command_line += (i ? " " : "") + std::string(argv[i]);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (train->parsed()) return kiln::app::cmd_train(o);
    if (plan->parsed()) return kiln::app::cmd_plan(o);
    if (devices->parsed()) return kiln::app::cmd_devices(o);
    if (conf->parsed()) return kiln::app::cmd_conformance(o);
    if (sample->parsed()) return kiln::app::cmd_sample(o, so);
    return kiln::app::cmd_plugins(o);
  } catch (const kiln::Interrupted& e) {  // SIGINT / SIGTERM: the step finished and a checkpoint was written
    std::cerr << "kiln: " << e.what() << "\n";
    return e.exit_code();
  } catch (const kiln::ConfigError& e) {
    std::cerr << "kiln: config error: " << e.what() << "\n";
    return 2;
  } catch (const kiln::PluginError& e) {
    std::cerr << "kiln: plugin error: " << e.what() << "\n";
    return 2;
  } catch (const kiln::DataError& e) {  // bad input data is the user's to fix, like a bad config
    std::cerr << "kiln: data error: " << e.what() << "\n";
    return 2;
  } catch (const kiln::OutOfMemory& e) {
    std::cerr << "kiln: " << e.what() << "\n";
    return 1;
  } catch (const kiln::Error& e) {
    std::cerr << "kiln: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "kiln: internal error: " << e.what() << "\n";
    return 1;
  }
}
