// libFuzzer harness: the CIFAR-10 binary source (plugins/data/cifar_source.cpp) over one to three files.
// Input: byte 0 = options (bits 0-1: number of files - 1, clamped to 1..3; bits 2-3: limit 0..3), then the bytes
// that are cut into that many files of equal length (the last takes the remainder).
#include "../../plugins/data/stages.hpp"
#include "fuzz_support.hpp"
#include "kiln/config.hpp"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const uint8_t opts = in.u8();
  const size_t files = std::min<size_t>(3, 1 + (opts & 3));
  const auto& dir = fuzz::scratch_dir("cifar");
  const size_t each = in.left() / files;
  std::string list;
  for (size_t i = 0; i < files; ++i) {
    const size_t len = i + 1 == files ? in.left() - each * i : each;
    const std::string name = "batch_" + std::to_string(i) + ".bin";
    fuzz::write_file(dir / name, in.rest() + each * i, len);
    list += (i ? ", \"" : "\"") + name + "\"";
  }
  const std::string toml = "files = [" + list + "]\nlimit = " + std::to_string((opts >> 2) & 3) + "\n";
  try {
    Config cfg = Config::load_string(toml, (dir / "cifar.toml").string());
    StageContext ctx;
    ctx.base_dir = dir.string();
    auto s = data::make_cifar10(cfg.root(), std::move(ctx));
    while (s->next()) {
    }
    s->reset(1);
    s->next();
    auto state = s->save();
    s->restore(state);
    while (s->next()) {
    }
  } catch (const kiln::Error& e) {
    kiln::fuzz::refused(e);
  }
  return 0;
}
