// Bounds on TOML text before it reaches toml++: its parser and its tables recurse once per part of a dotted key or
// table header, so a header of 50,000 parts overflows the stack (a crash, not an error). A real config uses a few
// levels; these bounds are far above that and far below what overflows.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

constexpr size_t kMaxTomlKeyParts = 64;          // parts of one dotted key or table header ("a.b.c" has 3)
constexpr size_t kMaxTomlNesting = 64;           // arrays and inline tables open at once
constexpr uint64_t kMaxConfigBytes = 16u << 20;  // a config file, or a config given as text

// What the scan found beyond a bound: the line (1-based) where it starts and what it is, e.g.
// "a dotted key of 50000 parts ('a.a.a.a...'); at most 64 parts are accepted".
struct TomlExcess {
  size_t line = 0;
  std::string what;
};

// Scans `text` as TOML (strings, comments, keys, headers, arrays and inline tables; nothing else is checked: the
// parser reports syntax errors) and returns the first bound it exceeds, if any.
std::optional<TomlExcess> find_toml_excess(std::string_view text);

// `s` on one line for an error message: line breaks shown as \n, at most `max` characters, then "...".
std::string one_line(std::string_view s, size_t max = 60);

}  // namespace kiln
