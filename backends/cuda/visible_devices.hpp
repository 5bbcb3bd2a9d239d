// CUDA_VISIBLE_DEVICES, checked the way CUDA should: the plugin (plugin.cpp) refuses a malformed value before any
// device opens, and the runtime part (cuda_backend.cpp) refuses entries CUDA dropped. Header-only: both
// libraries of the plugin use it.
#pragma once
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kiln/error.hpp"

namespace kiln::cuda {

// The variable's value, if set.
inline std::optional<std::string> visible_devices_env() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? std::optional<std::string>(v) : std::nullopt;
}

// "-1" alone is the common "no GPU, run on the CPU" idiom (TensorFlow's docs): CUDA then lists no device, and
// Kiln treats the backend as having none ([device] backend = "auto" goes on to the next backend).
inline bool hides_every_device(const std::string& value) { return value == "-1"; }

// Every comma-separated entry must be a device index (0, 1, ...) or a UUID ("GPU-...", "MIG-..."), with no
// duplicates and no empty entries. CUDA silently drops everything after an invalid entry such as "-1" in
// "0,-1,1"; Kiln refuses with a ConfigError naming the entry. Returns the entries ({} for "-1").
inline std::vector<std::string> parse_visible_devices(const std::string& value) {
  auto bad = [&](const std::string& entry, const std::string& why) -> std::vector<std::string> {
    throw ConfigError(
        "CUDA_VISIBLE_DEVICES=\"" + value + "\": entry \"" + entry + "\" " + why +
        ". Expected comma-separated device indices or UUIDs, e.g. CUDA_VISIBLE_DEVICES=0,2 (CUDA would silently "
        "ignore this entry and every one after it; Kiln refuses instead)");
  };
  std::vector<std::string> out;
  std::set<std::string> seen;
  if (hides_every_device(value)) return out;
  if (value.empty()) return bad("", "is empty, which hides every GPU (unset the variable to see all of them)");
  size_t pos = 0;
  while (true) {
    size_t comma = value.find(',', pos);
    std::string e = value.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (e.empty()) bad(e, "is empty (two commas in a row, or a trailing comma)");
    bool digits = std::all_of(e.begin(), e.end(), [](char c) { return c >= '0' && c <= '9'; });
    std::string id = e;  // GPU-<uuid>, MIG-<uuid> or MIG-GPU-<uuid>/<gi>/<ci>
    bool prefixed = false;
    for (const char* p : {"MIG-", "GPU-"})
      if (id.rfind(p, 0) == 0) id = id.substr(4), prefixed = true;
    bool uuid = prefixed && !id.empty() && std::all_of(id.begin(), id.end(), [](char c) {
                  return std::isxdigit(static_cast<unsigned char>(c)) || c == '-' || c == '/';
                });
    if (e == "-1")
      bad(e,
          "is not a device (CUDA treats it as the end of the list and hides every later device; "
          "CUDA_VISIBLE_DEVICES=-1 alone hides every GPU)");
    if (!digits && !uuid) bad(e, "is neither a device index nor a GPU-/MIG- UUID");
    std::string key = e;
    if (digits)
      key = std::to_string(std::stoll(e.size() > 18 ? e.substr(e.size() - 18) : e));  // "01" and "1" are one device
    if (!seen.insert(key).second) bad(e, "is listed twice");
    out.push_back(e);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace kiln::cuda
