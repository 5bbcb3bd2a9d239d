// libFuzzer harness: the IDX source (plugins/data/idx_source.cpp) on an images file and a labels file.
// Input: byte 0 = options (bit 0-1: limit 0..3), bytes 1-2 = length of the images file (little endian, clamped to
// what is there), then the images file's bytes, then the labels file's. The stage is built as the host builds it
// (the config table through the factory), drained, reset, saved and restored.
#include <optional>

#include "../../plugins/data/stages.hpp"
#include "fuzz_support.hpp"
#include "kiln/config.hpp"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const uint8_t opts = in.u8();
  const size_t images_len = std::min<size_t>(in.u16(), in.left());
  const auto& dir = fuzz::scratch_dir("idx");
  fuzz::write_file(dir / "images", in.rest(), images_len);
  fuzz::write_file(dir / "labels", in.rest() + images_len, in.left() - images_len);
  const std::string toml = "images = \"images\"\nlabels = \"labels\"\nlimit = " + std::to_string(opts & 3) + "\n";
  try {
    Config cfg = Config::load_string(toml, (dir / "idx.toml").string());
    StageContext ctx;
    ctx.base_dir = dir.string();
    auto s = data::make_idx(cfg.root(), std::move(ctx));
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
