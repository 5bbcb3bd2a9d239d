// Helpers both parallel strategies use: the [strategy] devices list, batch splitting, and plan formatting.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/data.hpp"
#include "kiln/strategy.hpp"

namespace kiln {
class ConfigNode;
}

namespace kiln::parallel {

// One entry of `devices = [...]`: an index into the opened device list ([device] visible order), or a label
// such as "cpu:1" (backend:index, as `kiln devices` prints).
struct DeviceEntry {
  int64_t index = -1;
  std::string label;
  std::string text() const { return label.empty() ? std::to_string(index) : "\"" + label + "\""; }
};

// Reads `key` (integers or strings); a device listed twice is a ConfigError naming the key.
std::vector<DeviceEntry> parse_device_list(const ConfigNode& cfg, const std::string& key);
// A single entry from text ("2" or "cpu:2").
DeviceEntry parse_device_entry(const std::string& text);
// How many of the visible devices the host must open so every entry can be found (all when labels are used).
int devices_to_open(const std::vector<DeviceEntry>& entries, int visible);
// Indices into `open` for the entries (all of `open` when `entries` is empty). ConfigError, naming `where`, when an
// entry is not among the opened devices or two entries name the same device.
std::vector<int> resolve_devices(const std::vector<DeviceEntry>& entries, const std::vector<DeviceContext>& open,
                                 const std::string& where);
std::string open_labels(const std::vector<DeviceContext>& open);

// Rows per part when `n` rows are split over `parts` as evenly as possible (the first n % parts get one more).
std::vector<int64_t> split_rows(int64_t n, int parts);
// Rows [begin, begin + count) of a batch.
Element slice_rows(const Element& b, int64_t begin, int64_t count);
// Concatenates tensors along their first (batch) dim.
HostTensor concat_rows(const std::vector<HostTensor>& parts);

// "1.50 MiB"-style bytes with the exact count for small numbers.
std::string bytes_text(size_t bytes);

}  // namespace kiln::parallel
