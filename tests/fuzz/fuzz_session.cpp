// libFuzzer harness: a run's configuration from TOML text to a validated Session (core/src/sdk/config.cpp,
// core/src/train/session.cpp, model/optimizer/strategy parsing, the backends' [device] keys, every data stage's keys
// and files), as `kiln train` and `kiln plan` build it before opening a device.
// The registry holds the built-in layers, the cpu backend and parallel strategies (loaded from this build's plugin
// directory) and the data stages (compiled into this harness, so they are instrumented). The input is the TOML text;
// the config file sits in a scratch directory that also holds small IDX, CSV and CIFAR-10 files named images,
// labels, data.csv and data.bin, so relative data paths resolve to them. Inputs with '/' or '\' are skipped: they
// could name other files (a FIFO, /dev/stdin) or, through a file cache's path, write outside the scratch directory.
#include <cstring>
#include <vector>

#include "fuzz_support.hpp"
#include "kiln/config.hpp"
#include "kiln/plugin.hpp"
#include "kiln/plugin_loader.hpp"
#include "kiln/session.hpp"

// The data plugin's entry (plugins/data/plugin.cpp, compiled into this harness).
extern "C" const kiln::PluginEntry kiln_plugin_entry_v;

namespace {

using namespace kiln;

void write_data_files(const std::filesystem::path& dir) {
  // 3 images of 2 x 2 and their labels (IDX); 2 CIFAR-10 records; a 3-row CSV with a header.
  std::vector<uint8_t> img = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2};
  for (int i = 0; i < 12; ++i) img.push_back(static_cast<uint8_t>(i * 20));
  fuzz::write_file(dir / "images", img.data(), img.size());
  const uint8_t lab[] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 0, 2};
  fuzz::write_file(dir / "labels", lab, sizeof lab);
  std::vector<uint8_t> cifar(2 * 3073, 7);
  cifar[0] = 3;
  cifar[3073] = 9;
  fuzz::write_file(dir / "data.bin", cifar.data(), cifar.size());
  const char csv[] = "a,b,label\n1,2,0\n3.5,-1,1\n0,0,2\n";
  fuzz::write_file(dir / "data.csv", csv, sizeof csv - 1);
}

Registry& registry() {
  static PluginLoader loader;
  static Registry reg = [] {
    Registry r = Registry::with_builtins();
    for (const char* p : {"libkiln_cpu.so", "libkiln_parallel.so"})
      loader.load(std::string(KILN_PLUGIN_DIR "/") + p, r);
    kiln_plugin_entry_v.register_all(r);
    return r;
  }();
  return reg;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (std::memchr(data, '/', size) || std::memchr(data, '\\', size)) return 0;
  static const std::filesystem::path dir = [] {
    auto d = fuzz::scratch_dir("session");
    write_data_files(d);
    return d;
  }();
  Registry& reg = registry();
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    Config cfg = Config::load_string(text, (dir / "run.toml").string());
    Session s(cfg, reg);  // builds each pipeline once: every stage checks its keys and opens its files
  } catch (const kiln::Error& e) {
    kiln::fuzz::refused(e);
  }
  return 0;
}
