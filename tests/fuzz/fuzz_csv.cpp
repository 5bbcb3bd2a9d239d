// libFuzzer harness: the CSV source (plugins/data/csv_source.cpp).
// Input: byte 0 = options (bit 0: header; bits 1-2: delimiter , ; tab |; bits 3-4: label unset, "label", "0",
// "1"; bits 5-6: limit 0..3), then the file's bytes (plain, or gzip when they start with 1f 8b).
#include "../../plugins/data/stages.hpp"
#include "fuzz_support.hpp"
#include "kiln/config.hpp"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const uint8_t opts = in.u8();
  const auto& dir = fuzz::scratch_dir("csv");
  fuzz::write_file(dir / "data.csv", in.rest(), in.left());
  static const char* const delims[] = {",", ";", "tab", "|"};
  static const char* const labels[] = {"", "label", "0", "1"};
  std::string toml = "path = \"data.csv\"\nheader = " + std::string(opts & 1 ? "true" : "false") + "\ndelimiter = \"" +
                     delims[(opts >> 1) & 3] + "\"\nlimit = " + std::to_string((opts >> 5) & 3) + "\n";
  if (const char* l = labels[(opts >> 3) & 3]; *l) toml += "label = \"" + std::string(l) + "\"\n";
  try {
    Config cfg = Config::load_string(toml, (dir / "csv.toml").string());
    StageContext ctx;
    ctx.base_dir = dir.string();
    auto s = data::make_csv(cfg.root(), std::move(ctx));
    s->next();
    auto state = s->save();
    while (s->next()) {
    }
    s->restore(state);
    while (s->next()) {
    }
    s->reset(1);
    while (s->next()) {
    }
  } catch (const kiln::Error& e) {
    kiln::fuzz::refused(e);
  }
  return 0;
}
