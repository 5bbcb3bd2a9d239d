// The host app's subcommands.
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "kiln/plugin.hpp"
#include "kiln/plugin_loader.hpp"
#include "kiln/text_generation.hpp"

namespace kiln::app {

struct Options {
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();  // when kiln's main began
  std::string config;
  std::vector<std::string> overrides;
  std::vector<std::string> plugin_dirs;
  bool resume = false;
  bool overwrite = false;
  std::string command_line;  // argv joined, for the run's record (run.json)
  bool sweep = false;
  std::string sweep_out;
  std::string backend;
  int device_index = 0;
  std::string op_filter, case_id, report, matrix;
  bool validation = false;
  std::string tolerance_dir;
  // evaluate / predict / export (model_io.hpp)
  std::string checkpoint, data = "test", input, output, format, weights = "auto";
  std::string dtype = "float32";  // kiln export --dtype: the safetensors' element type
  // kiln plugins --check: load each plugin file alone in a child process, killed after check_timeout seconds
  bool check_plugins = false;
  double check_timeout = 10;
  // Registers a host's own stages after the plugins load (the Python module's NumPy-array source); unset in the app.
  std::function<void(Registry&)> extra_stages;
};

// kiln launch: how to start the ranks.
struct LaunchOptions {
  int ranks = 1;
  std::string hosts;  // "h1,h2" or "h1:4,h2:4" (mpirun --host)
  std::string mpirun = "mpirun";
  std::vector<std::string> mpirun_args;  // passed through, e.g. --oversubscribe, --hostfile f
  bool dry_run = false;                  // print the mpirun command instead of running it
};

// Loads plugins from the default dirs, --plugin-dir, and (when given) the config's [plugins] table.
// A plugin the config names explicitly must load; others that fail are listed by `kiln plugins`.
void load_plugins(const Options& o, PluginLoader& loader, Registry& reg, const std::string& config_file = {});

int cmd_train(const Options& o);
// Put before every error message main() prints: "[rank R host H] " in a run across processes, else empty.
std::string& error_prefix();
// The mpirun command line of `kiln launch` (`self`: this kiln's path).
std::vector<std::string> launch_argv(const Options& o, const LaunchOptions& lo, const std::string& self);
int cmd_launch(const Options& o, const LaunchOptions& lo);  // launch_cmd.cpp: runs mpirun, returns its exit code
int cmd_plan(const Options& o);
int cmd_devices(const Options& o);
int cmd_plugins(const Options& o);
int cmd_conformance(const Options& o);
int cmd_sample(const Options& o, const SampleOptions& so);  // sample_cmd.cpp
int cmd_evaluate(const Options& o);                         // evaluate_cmd.cpp
int cmd_predict(const Options& o);                          // predict_cmd.cpp
int cmd_export(const Options& o);                           // export_cmd.cpp

}  // namespace kiln::app
