// kiln plan CONFIG [--sweep]: the memory plan before anything is allocated; with --sweep, memory against batch
// size, predicted and measured, as CSV and SVG.
#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/files.hpp"
#include "kiln/memory_report.hpp"
#include "kiln/model.hpp"
#include "kiln/session.hpp"

namespace kiln::app {

namespace fs = std::filesystem;

namespace {
// trainable = false: what the frozen layers' parameters do not get (the plan above already leaves it out).
void print_frozen_saving(Session& s) {
  GraphOptions go;
  go.batch = 1;
  go.training = false;
  const FrozenSaving f = frozen_saving(s.model(), build_graph(s.model(), go), s.optimizer(), PlanOptions{}.alignment);
  if (f.layers == 0) return;
  std::cout << "frozen: " << f.layers << (f.layers == 1 ? " layer" : " layers") << " (" << f.values << " parameters), "
            << format_bytes(f.bytes()) << " of gradients" << (f.ema_bytes ? ", EMA" : "")
            << " and optimizer state not allocated (" << format_bytes(f.gradient_bytes) << " + "
            << format_bytes(f.optimizer_state_bytes + f.ema_bytes) << ")\n";
}
}  // namespace

int cmd_plan(const Options& o) {
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  load_plugins(o, loader, reg, o.config);
  Config cfg = Config::load_file(o.config, o.overrides);
  Session s(cfg, reg);
  if (auto train = s.make_pipeline("train")) s.model().label_shape = train->label_shape();
  s.open_devices(/*reserve=*/false);
  PlanCheck c = check_plan(s);
  std::cout << c.report;
  print_frozen_saving(s);
  // How each source reads its files (decoded once into memory, or streamed) and why: host memory the plan above does
  // not count.
  for (const char* which : {"train", "test"})
    if (std::string r = s.source_reading(which); !r.empty()) std::cout << "data." << which << " source: " << r << "\n";
  if (!o.sweep) return c.fits ? 0 : 1;

  auto ctx = s.runner_context();
  std::vector<size_t> limits;
  for (auto& d : ctx.devices) limits.push_back(d.allocator->limit());
  std::vector<int64_t> batches = s.memory_settings().sweep_batches;
  if (batches.empty())
    batches = default_sweep_batches(largest_fitting_batch(s.strategy(), ctx, limits, s.train().batch_size),
                                    batch_unit(s.strategy(), ctx, s.train().batch_size));
  fs::path dir = o.sweep_out.empty() ? fs::path(s.train().output_dir) : fs::path(o.sweep_out);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(std::string(o.sweep_out.empty() ? "[train] output_dir" : "--sweep-out") +
                ": cannot create the sweep's directory '" + dir.string() + "': " + ec.message());
  std::cout << "\nsweep: one real training step per batch size that fits (allocator peak in use):\n";
  auto points = memory_sweep(s, batches, /*measure=*/true, &std::cout);
  write_file_atomically((dir / "memory_sweep.csv").string(), sweep_csv(points));
  write_file_atomically((dir / "memory_sweep.svg").string(),
                        sweep_svg(points, s.run_name() + ": peak memory against batch size"));
  std::cout << "wrote " << (dir / "memory_sweep.csv").string() << " and " << (dir / "memory_sweep.svg").string()
            << "\n";
  return 0;
}

}  // namespace kiln::app
