// Device lists, batch splitting and formatting shared by the parallel strategies.
#include "common.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>

#include "kiln/allocator.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"

namespace kiln::parallel {

DeviceEntry parse_device_entry(const std::string& text) {
  DeviceEntry e;
  if (!text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      text.size() < 10)
    e.index = std::stoll(text);
  else
    e.label = text;
  return e;
}

std::vector<DeviceEntry> parse_device_list(const ConfigNode& cfg, const std::string& key) {
  std::vector<DeviceEntry> out;
  if (!cfg.has(key)) return out;
  std::vector<int64_t> ints;
  bool as_ints = true;
  try {
    ints = cfg.get_int_list(key);
  } catch (const ConfigError&) {
    as_ints = false;
  }
  if (as_ints) {
    for (auto i : ints) {
      if (i < 0)
        cfg.fail(key,
                 "entry " + std::to_string(i) + " is not a device index (indices into the opened devices start at 0)");
      DeviceEntry e;
      e.index = i;
      out.push_back(e);
    }
  } else {
    std::vector<std::string> texts;
    try {
      texts = cfg.get_string_list(key, {});
    } catch (const ConfigError&) {
      cfg.fail(key,
               "expected a list of device indices (0, 1, ...) or labels (\"cpu:0\", \"vulkan:0\"), not a mix of both");
    }
    for (const auto& t : texts) {
      if (t.empty()) cfg.fail(key, "an entry is empty; expected an index or a label such as \"cpu:1\"");
      DeviceEntry e = parse_device_entry(t);
      if (!e.label.empty() && (t.find(':') == std::string::npos || t.front() == ':' || t.back() == ':'))
        cfg.fail(key, "\"" + t + "\" is neither an index nor a device label of the form backend:index (\"cpu:1\")");
      out.push_back(e);
    }
  }
  if (out.empty()) cfg.fail(key, "the list is empty; leave the key out to use every opened device");
  std::set<std::string> seen;
  for (const auto& e : out)
    if (!seen.insert(e.label.empty() ? std::to_string(e.index) : e.label).second)
      cfg.fail(key, "device " + e.text() + " is listed twice; each device can hold one replica or placement slot");
  return out;
}

int devices_to_open(const std::vector<DeviceEntry>& entries, int visible) {
  if (entries.empty()) return visible;
  int need = 0;
  for (const auto& e : entries) {
    if (!e.label.empty()) return visible;  // labels are matched against every visible device
    need = std::max<int>(need, static_cast<int>(e.index) + 1);
  }
  return need;
}

std::string open_labels(const std::vector<DeviceContext>& open) {
  std::string s;
  for (size_t i = 0; i < open.size(); ++i)
    s += (i ? ", " : "") + std::to_string(i) + " = " + open[i].device->info().label();
  return s.empty() ? "none" : s;
}

std::vector<int> resolve_devices(const std::vector<DeviceEntry>& entries, const std::vector<DeviceContext>& open,
                                 const std::string& where) {
  std::vector<int> out;
  if (open.empty()) throw ConfigError(where + ": no device was opened");
  if (entries.empty()) {
    for (size_t i = 0; i < open.size(); ++i) out.push_back(static_cast<int>(i));
    return out;
  }
  for (const auto& e : entries) {
    int found = -1;
    if (e.label.empty()) {
      if (e.index < static_cast<int64_t>(open.size())) found = static_cast<int>(e.index);
    } else {
      for (size_t i = 0; i < open.size(); ++i)
        if (open[i].device->info().label() == e.label) found = static_cast<int>(i);
    }
    if (found < 0) {
      std::string hint =
          " (raise [device] virtual_devices for more logical CPU devices, or list them in [device] visible)";
      if (!e.label.empty()) {
        std::string backend = e.label.substr(0, e.label.find(':'));
        if (backend != open[0].device->info().backend)
          hint =
              " (this run opens devices of backend \"" + open[0].device->info().backend + "\" only: [device] backend)";
      }
      throw ConfigError(where + " lists device " + e.text() +
                        ", which is not among the opened devices: " + open_labels(open) + hint);
    }
    if (std::find(out.begin(), out.end(), found) != out.end())
      throw ConfigError(where + " names " + open[static_cast<size_t>(found)].device->info().label() +
                        " twice (as an index and as a label); each device can be listed once");
    out.push_back(found);
  }
  return out;
}

std::vector<int64_t> split_rows(int64_t n, int parts) {
  std::vector<int64_t> out(static_cast<size_t>(parts), n / parts);
  for (int64_t i = 0; i < n % parts; ++i) ++out[static_cast<size_t>(i)];
  return out;
}

namespace {

HostTensor rows_of(const HostTensor& t, int64_t batch, int64_t begin, int64_t count) {
  if (t.shape.rank() == 0 || t.shape[0] != batch)
    throw DataError("cannot split a batch of " + std::to_string(batch) + " rows: a tensor has shape " + t.shape.str());
  Shape s = t.shape;
  s[0] = count;
  HostTensor out(s);
  const int64_t per = batch > 0 ? static_cast<int64_t>(t.data.size()) / batch : 0;
  std::copy(t.data.begin() + begin * per, t.data.begin() + (begin + count) * per, out.data.begin());
  return out;
}

}  // namespace

Element slice_rows(const Element& b, int64_t begin, int64_t count) {
  Element e;
  e.batch = count;
  e.x = rows_of(b.x, b.batch, begin, count);
  e.y = rows_of(b.y, b.batch, begin, count);
  return e;
}

HostTensor concat_rows(const std::vector<HostTensor>& parts) {
  if (parts.empty()) return {};
  Shape s = parts[0].shape;
  int64_t rows = 0;
  for (const auto& p : parts) rows += p.shape.rank() ? p.shape[0] : 0;
  s[0] = rows;
  HostTensor out(s);
  size_t at = 0;
  for (const auto& p : parts) {
    std::copy(p.data.begin(), p.data.end(), out.data.begin() + static_cast<std::ptrdiff_t>(at));
    at += p.data.size();
  }
  return out;
}

std::string bytes_text(size_t bytes) { return bytes < 10240 ? std::to_string(bytes) + " B" : format_bytes(bytes); }

}  // namespace kiln::parallel
