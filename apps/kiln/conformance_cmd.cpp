// kiln conformance: runs the core conformance suite on a backend (built-in or a third-party plugin's).
#include <iostream>

#include "commands.hpp"
#include "kiln/conformance.hpp"
#include "kiln/files.hpp"

namespace kiln::app {

int cmd_conformance(const Options& o) {
  // The report and the matrix are regenerated (replaced) on every run; a path that cannot be written, or that is a
  // file of a run, is refused before the cases run.
  if (!o.report.empty()) check_output_file(o.report, "--report", /*overwrite=*/true, {});
  if (!o.matrix.empty()) check_output_file(o.matrix, "--matrix", /*overwrite=*/true, {});
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  load_plugins(o, loader, reg);
  ConformanceOptions c;
  c.backend = o.backend;
  c.device = o.device_index;
  c.op = o.op_filter;
  c.case_id = o.case_id;
  c.report_path = o.report;
  c.matrix_path = o.matrix;
  if (o.validation) c.backend_options = BackendOptions::parse("validation = true");
  c.tolerance_dir = o.tolerance_dir;
  return run_conformance(reg, c, std::cout);
}

}  // namespace kiln::app
