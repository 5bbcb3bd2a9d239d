// libFuzzer harness: the checkpoint reader (core/src/train/checkpoint.cpp, load_checkpoint), which a resumed run
// feeds whatever file sits at <output_dir>/checkpoint.kiln.
// Input: byte 0 = options (bit 0: rewrite the trailing 8-byte checksum to match, so mutations reach the parser
// instead of failing the checksum), then the file's bytes.
#include <cstring>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fuzz_support.hpp"
#include "kiln/checkpoint.hpp"
#include "kiln/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::Bytes in(data, size);
  const uint8_t opts = in.u8();
  std::vector<uint8_t> file(in.rest(), in.rest() + in.left());
  if ((opts & 1) && file.size() >= 8) {
    uint64_t h = 1469598103934665603ull;  // version 1 (KILNCKP1): FNV-1a 64, as checkpoint.cpp computes it
    for (size_t i = 0; i < file.size() - 8; ++i) h = (h ^ file[i]) * 1099511628211ull;
    if (file.size() >= 16 && std::memcmp(file.data(), "KILNCKP2", 8) == 0)
      h = XXH3_64bits(file.data(), file.size() - 8);
    std::memcpy(file.data() + file.size() - 8, &h, 8);
  }
  const auto& dir = kiln::fuzz::scratch_dir("checkpoint");
  const std::string path = kiln::fuzz::write_file(dir / "checkpoint.kiln", file.data(), file.size());
  try {
    kiln::Checkpoint c = kiln::load_checkpoint(path);
    (void)c;
  } catch (const kiln::Error& e) {
    kiln::fuzz::refused(e);
  }
  return 0;
}
