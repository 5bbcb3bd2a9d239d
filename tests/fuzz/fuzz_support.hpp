// Shared by Kiln's libFuzzer harnesses: a scratch directory per process for the files a reader opens, and the rule
// every harness follows: a kiln::Error (ConfigError, DataError, ...) is the expected answer to bad input; anything
// else escaping (std::bad_alloc, std::length_error, std::out_of_range, a sanitizer report) is a finding.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "kiln/error.hpp"

namespace kiln::fuzz {

// <$TMPDIR or /tmp>/kiln-fuzz-<harness>-<pid>/, created on first use and removed when the process exits normally.
inline const std::filesystem::path& scratch_dir(const char* harness) {
  static const std::filesystem::path dir = [harness] {
    const char* t = std::getenv("TMPDIR");
    auto d = std::filesystem::path(t && *t ? t : "/tmp") /
             (std::string("kiln-fuzz-") + harness + "-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    static struct Cleanup {
      std::filesystem::path p;
      ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
      }
    } cleanup{d};
    return d;
  }();
  return dir;
}

inline std::string write_file(const std::filesystem::path& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  return path.string();
}

// Called with each kiln::Error a harness catches (the expected answer to bad input). With KILN_FUZZ_VERBOSE set
// it prints the message, to see what a seed or a found input is refused for: KILN_FUZZ_VERBOSE=1 kiln_fuzz_csv FILE.
inline void refused(const std::exception& e) {
  static const bool verbose = std::getenv("KILN_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
}

// Reads the fuzzer's bytes front to back; past the end everything reads as 0 / empty.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t u8() { return n_ ? (--n_, *p_++) : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | u8() << 8); }
  const uint8_t* rest() const { return p_; }
  size_t left() const { return n_; }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace kiln::fuzz
