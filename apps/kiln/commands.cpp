// kiln train / plan / devices / plugins.
#include "commands.hpp"

#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/memory_report.hpp"
#include "kiln/session.hpp"
#include "kiln/trainer.hpp"

namespace kiln::app {

namespace fs = std::filesystem;

void load_plugins(const Options& o, PluginLoader& loader, Registry& reg, const std::string& config_file) {
  std::vector<std::string> dirs = PluginLoader::default_dirs();
  for (const auto& d : o.plugin_dirs) dirs.push_back(d);
  std::vector<std::string> files, required;
  if (!config_file.empty()) {
    Config cfg = Config::load_file(config_file, o.overrides);
    if (auto p = cfg.root().table("plugins")) {
      for (auto d : p->get_string_list("dirs", {})) {
        if (fs::path(d).is_relative()) d = (fs::path(cfg.base_dir()) / d).string();
        if (!fs::is_directory(d)) p->fail("dirs", "\"" + d + "\" is not a directory");
        dirs.push_back(d);
      }
      for (auto f : p->get_string_list("load", {})) {
        if (fs::path(f).is_relative()) f = (fs::path(cfg.base_dir()) / f).string();
        files.push_back(f);
      }
      required = p->get_string_list("require", {});
      p->finish();
    }
  }
  for (const auto& d : dirs) loader.load_dir(d, reg);
  for (const auto& f : files) loader.load(f, reg);  // named explicitly: failures are errors
  if (o.extra_stages) o.extra_stages(reg);
  for (const auto& r : required) {
    bool ok = false;
    std::string why;
    for (const auto& p : loader.plugins()) {
      if (p.error.empty() && p.descriptor.name && r == p.descriptor.name) ok = true;
      if (!p.error.empty() && fs::path(p.path).filename().string() == "libkiln_" + r + ".so") why = p.error;
    }
    if (!ok)
      throw PluginError(config_file + ": [plugins] require lists \"" + r + "\" but it is not loaded" +
                        (why.empty() ? " (no libkiln_" + r + ".so in the plugin directories)" : ": " + why));
  }
}

std::string& error_prefix() {
  static std::string p;
  return p;
}

int cmd_train(const Options& o) {
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  load_plugins(o, loader, reg, o.config);
  auto overrides = o.overrides;
  if (o.resume) overrides.push_back("train.resume=true");
  if (o.overwrite) overrides.push_back("train.overwrite=true");
  Config cfg = Config::load_file(o.config, overrides);
  Session s(cfg, reg);
  RunInfo info;
  info.command = o.command_line;
  for (const auto& p : loader.plugins())
    if (p.error.empty() && p.descriptor.name)
      info.plugins.push_back(std::string(p.descriptor.name) + " " +
                             (p.descriptor.version ? p.descriptor.version : "?") + " " + p.path);
  // Across processes rank 0 alone prints progress; every rank's errors name it.
  std::ostream* out = &std::cout;
  std::ostringstream discard;
  if (const ProcessGroup* pg = s.strategy().process_group(); pg && pg->size() > 1) {
    error_prefix() = "[rank " + std::to_string(pg->rank()) + " host " + pg->host() + "] ";
    if (pg->rank() != 0) {
      discard.setstate(std::ios::badbit);
      out = &discard;
    }
  }
  Trainer t(s, *out, std::move(info));
  auto rep = t.run();
  if (out != &std::cout) return 0;
  std::cout << "done: " << rep.steps << " steps in " << std::fixed << std::setprecision(1) << rep.seconds << " s";
  if (rep.first_step_start)
    std::cout << " (first step began " << std::setprecision(2)
              << std::chrono::duration<double>(*rep.first_step_start - o.started).count() << " s after start)";
  // The figures of the weights the run ends with: early stopping may have restored an earlier epoch's.
  const EpochMetrics* last = rep.final_metrics    ? &*rep.final_metrics
                             : rep.epochs.empty() ? nullptr
                                                  : &rep.epochs.back();
  if (last && last->test_accuracy >= 0)
    std::cout << ", final test accuracy " << std::setprecision(4) << last->test_accuracy
              << (rep.final_metrics ? " (epoch " + std::to_string(last->epoch) + ", restored)" : std::string());
  std::cout << "; metrics in " << s.train().output_dir << "/metrics.jsonl\n";
  return 0;
}

// cmd_plan: plan_cmd.cpp; cmd_devices: devices_cmd.cpp.

namespace {

// kiln plugins --check: each plugin file is loaded alone in a child process, so one that crashes, exits or hangs
// while loading is named and this process goes on to the next.
int check_plugins(const std::vector<std::string>& dirs, double timeout_s) {
  std::cout << "\nloading each plugin file alone in a child process (timeout " << timeout_s << " s):\n";
  const auto timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
  int total = 0, ok = 0;
  for (const auto& d : dirs) {
    const std::string dir_why = PluginLoader::untrusted_reason(d, true);
    for (const auto& f : PluginLoader::candidates(d)) {
      ++total;
      PluginCheck c;
      if (dir_why.empty()) {
        c = PluginLoader::check(f, timeout);
      } else {  // as load_dir does: none of this directory's code runs, not even in a child
        c.result = PluginCheck::Result::failed;
        c.detail = f + ": refused to load: " + dir_why;
      }
      static const char* const names[] = {"OK", "FAILED", "CRASHED", "EXITED", "HUNG"};
      std::cout << std::left << std::setw(9) << names[int(c.result)] << f;
      if (c.result == PluginCheck::Result::failed)
        std::cout << "\n    " << c.detail << "\n";
      else
        std::cout << " (" << c.detail << ")\n";
      ok += c.result == PluginCheck::Result::ok;
      if (c.result == PluginCheck::Result::ok || c.output.empty()) continue;
      std::cout << "    its output:\n";
      std::istringstream lines(c.output);
      for (std::string line; std::getline(lines, line);) std::cout << "      " << line << "\n";
    }
  }
  std::cout << "\n" << total << " plugin files: " << ok << " OK, " << (total - ok) << " not\n";
  return ok == total ? 0 : 1;
}

}  // namespace

int cmd_plugins(const Options& o) {
  auto dirs = PluginLoader::default_dirs();
  for (const auto& d : o.plugin_dirs) dirs.push_back(d);
  std::cout << "kiln " << KILN_VERSION_STRING << ", plugin API " << kApiVersion << ", " << KILN_BUILD_FINGERPRINT
            << "\n";
  std::cout << "plugin directories:";
  for (const auto& d : dirs) std::cout << " " << d;
  if (o.check_plugins) {
    std::cout << "\n";
    return check_plugins(dirs, o.check_timeout);
  }
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  load_plugins(o, loader, reg);
  std::cout << "\n\ncore (built in):";
  if (reg.provided().count("core"))
    for (const auto& w : reg.provided().at("core")) std::cout << "\n    " << w;
  std::cout << "\n";
  for (const auto& p : loader.plugins()) {
    if (!p.error.empty()) {
      std::cout << "\nFAILED " << p.path << "\n    " << p.error << "\n";
      continue;
    }
    std::cout << "\n"
              << p.descriptor.name << " " << p.descriptor.version << " (API " << p.descriptor.api_version << ") "
              << p.path << "\n    " << (p.descriptor.description ? p.descriptor.description : "");
    if (reg.provided().count(p.descriptor.name))
      for (const auto& w : reg.provided().at(p.descriptor.name)) std::cout << "\n    " << w;
    std::cout << "\n";
  }
  return 0;
}

}  // namespace kiln::app
