// kiln sample CONFIG: generated text from a trained character model (nanoGPT's sample.py).
#include <iostream>

#include "commands.hpp"
#include "kiln/config.hpp"
#include "kiln/session.hpp"
#include "kiln/text_generation.hpp"

namespace kiln::app {

int cmd_sample(const Options& o, const SampleOptions& so) {
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  load_plugins(o, loader, reg, o.config);
  Config cfg = Config::load_file(o.config, o.overrides);
  Session s(cfg, reg);
  sample_text(s, so, std::cout);
  return 0;
}

}  // namespace kiln::app
