// Best-fit, coalescing arena over a device's raw blocks, with a hard limit and statistics by tag.
#include "kiln/allocator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>

namespace kiln {

const char* memory_tag_name(MemoryTag t) {
  switch (t) {
    case MemoryTag::parameters:
      return "parameters";
    case MemoryTag::gradients:
      return "gradients";
    case MemoryTag::optimizer_state:
      return "optimizer state";
    case MemoryTag::activations:
      return "activations";
    case MemoryTag::workspace:
      return "workspace";
    case MemoryTag::input_data:
      return "input data";
    default:
      return "other";
  }
}

std::string format_bytes(size_t b) {
  char buf[64];
  double v = static_cast<double>(b);
  if (b >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", v / (1ull << 30));
  else if (b >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", v / (1ull << 20));
  else if (b >= (1ull << 10))
    std::snprintf(buf, sizeof buf, "%.1f KiB", v / (1ull << 10));
  else
    std::snprintf(buf, sizeof buf, "%zu B", b);
  return buf;
}

bool shares_host_memory(const DeviceInfo& d) { return d.type == DeviceType::cpu && d.host_addressable; }

std::string shared_memory_overcommit(const std::vector<std::pair<const DeviceInfo*, size_t>>& limits) {
  std::vector<std::pair<const DeviceInfo*, size_t>> host;
  for (const auto& l : limits)
    if (l.first && shares_host_memory(*l.first)) host.push_back(l);
  if (host.size() < 2) return {};
  size_t physical = 0;
  for (const auto& h : host) physical = std::max(physical, h.first->total_memory);
  unsigned __int128 sum = 0;
  bool equal = true;
  for (const auto& h : host) sum += h.second, equal = equal && h.second == host[0].second;
  if (sum <= physical) return {};
  const size_t n = host.size();
  std::ostringstream os;
  os << "gives the " << n << " devices that share the host's " << format_bytes(physical) << " of physical memory "
     << (equal ? format_bytes(host[0].second) + " each" : std::string("these limits")) << ": ";
  for (size_t i = 0; i < n; ++i)
    os << (i ? " + " : "") << host[i].first->label() << " " << format_bytes(host[i].second);
  const double pct = physical ? 100.0 * static_cast<double>(sum) / static_cast<double>(physical) : 0.0;
  char pbuf[32];
  std::snprintf(pbuf, sizeof pbuf, "%.0f%%", pct);
  os << " = " << (sum > SIZE_MAX ? std::string("more than 2^64 bytes") : format_bytes(static_cast<size_t>(sum))) << " ("
     << pbuf
     << " of it), more than they share. Limits of devices that share one memory must fit in it together (a percentage "
        "is "
        "each device's share of it): at most "
     << format_bytes(physical / n) << " (\"" << 100 / n << "%\") per device for " << n << " devices, or fewer devices";
  return os.str();
}

size_t parse_memory_size(const std::string& text, size_t device_total) {
  std::string s;
  for (char c : text)
    if (c != ' ' && c != '_') s += c;
  auto bad = [&](const std::string& why) -> size_t {
    throw ConfigError(
        "memory size \"" + text + "\": " + why +
        " (expected bytes like \"1200MiB\", \"1.5GB\", \"800000\" or a share of the device like \"60%\")");
  };
  if (s.empty()) return bad("empty");
  size_t pos = 0;
  double num = 0;
  try {
    num = std::stod(s, &pos);
  } catch (...) {
    return bad("no number");
  }
  if (!(num >= 0) || !std::isfinite(num)) return bad("not a non-negative number");
  std::string unit = s.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::tolower(c));
  if (unit == "%") {
    if (num <= 0 || num > 100) return bad("a percentage must be in (0, 100]");
    return static_cast<size_t>(static_cast<double>(device_total) * num / 100.0);
  }
  double mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kb")
    mult = 1e3;
  else if (unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mb")
    mult = 1e6;
  else if (unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb")
    mult = 1e9;
  else if (unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb")
    mult = 1e12;
  else if (unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return bad("unknown unit '" + unit + "'");
  if (num * mult < 1) return bad("must be at least one byte");
  // 2^64 and above does not convert to size_t (it came out as 0, i.e. "the whole device"): refuse it.
  if (num * mult >= 18446744073709551616.0) return bad("is more than 16 EiB, beyond any 64-bit size");
  return static_cast<size_t>(num * mult);
}

double MemoryStats::fragmentation() const {
  size_t free_total = reserved - in_use;
  if (free_total == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free) / static_cast<double>(free_total);
}

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    view_ = o.view_;
    padded_ = o.padded_;
    tag_ = o.tag_;
    o.owner_ = nullptr;
  }
  return *this;
}

void Allocation::reset() noexcept {
  if (owner_) owner_->free_range(view_, padded_, tag_);
  owner_ = nullptr;
}

Allocator::Allocator(Device& device, AllocatorOptions opts) : device_(device), opts_(opts) {
  if (opts_.limit == 0) opts_.limit = device_.info().total_memory;
  if (opts_.alignment == 0) opts_.alignment = 256;
  if (!opts_.growth) {
    // Reserve the whole limit up front (in as few blocks as the device allows).
    size_t want = opts_.limit;
    while (want > 0) {
      size_t chunk = opts_.max_block ? std::min(want, opts_.max_block) : want;
      if (!grow(chunk)) {
        // Leave the device as we found it before reporting.
        for (auto* b : blocks_) device_.free_block(b);
        blocks_.clear();
        throw OutOfMemory("cannot reserve the memory limit " + format_bytes(opts_.limit) + " on " +
                              device_.info().label() + " (" + device_.info().name + "): " + grow_failure_ + " after " +
                              format_bytes(stats_.reserved) +
                              " (device free: " + format_bytes(device_.query_free_memory()) +
                              "). Lower [device] memory_limit or set growth = true.",
                          chunk, stats_);
      }
      want -= chunk;
    }
  }
}

Allocator::~Allocator() {
  for (auto* b : blocks_) device_.free_block(b);
}

bool Allocator::grow(size_t at_least) {
  fault_fired_ = false;
  const size_t room = opts_.limit > stats_.reserved ? opts_.limit - stats_.reserved : 0;
  const size_t free_inside = stats_.reserved - stats_.in_use;
  if (at_least > room) {
    if (stats_.in_use + at_least > opts_.limit)
      grow_failure_ = "the request exceeds the memory limit (" + format_bytes(stats_.in_use) + " in use + " +
                      format_bytes(at_least) + " requested > " + format_bytes(opts_.limit) + ")";
    else
      grow_failure_ = "fragmentation: " + format_bytes(free_inside + room) +
                      " is free under the limit but the largest free range is " + format_bytes(stats_.largest_free) +
                      " and only " + format_bytes(room) + " is left to reserve";
    return false;
  }
  if (opts_.max_blocks && blocks_.size() >= opts_.max_blocks) {
    grow_failure_ = "the device's limit of " + std::to_string(opts_.max_blocks) + " allocations is reached";
    return false;
  }
  size_t want = opts_.growth ? std::min(std::max(at_least, opts_.min_block), room) : at_least;
  if (opts_.max_block) want = std::min(want, opts_.max_block);
  if (want < at_least) {
    grow_failure_ =
        "the request is larger than the device's largest single allocation (" + format_bytes(opts_.max_block) + ")";
    return false;
  }
  ++stats_.block_requests;
  if (opts_.fail_block_request > 0 && stats_.block_requests == static_cast<size_t>(opts_.fail_block_request)) {
    grow_failure_ = "fault injection failed block request #" + std::to_string(opts_.fail_block_request) +
                    " ([device] fault_injection_block)";
    fault_fired_ = true;  // an injected failure is final: no retry after giving free blocks back
    return false;
  }
  Block* b = device_.allocate_block(want);
  if (!b && want > at_least) {
    ++stats_.block_requests;
    b = device_.allocate_block(at_least);
    want = at_least;
  }
  if (!b) {
    grow_failure_ = "the device refused a new block of " + format_bytes(want) +
                    " (its memory is used by other processes or fragmented)";
    return false;
  }
  blocks_.push_back(b);
  block_by_id_[b->id] = b;
  ranges_[{b->id, 0}] = Range{b, 0, b->bytes, true};
  free_by_size_.insert({b->bytes, b->id, 0});
  stats_.reserved += b->bytes;
  stats_.blocks = blocks_.size();
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  update_largest_free();
  return true;
}

bool Allocator::reserve(size_t bytes) {
  if (!opts_.growth || bytes == 0) return true;
  bytes = (bytes + opts_.alignment - 1) / opts_.alignment * opts_.alignment;
  if (stats_.largest_free >= bytes) return true;
  release_free_blocks();
  if (opts_.max_block && bytes > opts_.max_block) return false;
  return grow(bytes);
}

void Allocator::reset_peak() {
  stats_.peak_in_use = stats_.in_use;
  stats_.peak_reserved = stats_.reserved;
  stats_.peak_by_tag = stats_.in_use_by_tag;
}

void Allocator::update_largest_free() {
  stats_.largest_free = free_by_size_.empty() ? 0 : std::get<0>(*free_by_size_.rbegin());
}

Allocation Allocator::allocate(size_t bytes, const AllocationSite& site) {
  if (bytes > opts_.limit) throw_oom(bytes, site, "the request alone exceeds the memory limit");
  size_t padded = std::max<size_t>(opts_.alignment, (bytes + opts_.alignment - 1) / opts_.alignment * opts_.alignment);
  auto it = free_by_size_.lower_bound({padded, 0, 0});
  if (it == free_by_size_.end()) {
    bool grown = grow(padded);
    // Whole free blocks may be in the way of one larger block: give them back and try once more.
    if (!grown && !fault_fired_ && opts_.growth && stats_.reserved - stats_.in_use >= opts_.min_block) {
      release_free_blocks();
      grown = grow(padded);
    }
    if (!grown) throw_oom(bytes, site, grow_failure_);
    it = free_by_size_.lower_bound({padded, 0, 0});
    if (it == free_by_size_.end()) throw_oom(bytes, site, "no free range after growing");
  }
  auto [fsize, bid, off] = *it;
  free_by_size_.erase(it);
  auto& r = ranges_.at({bid, off});
  r.free = false;
  if (fsize > padded) {  // split: the tail stays free
    r.bytes = padded;
    ranges_[{bid, off + padded}] = Range{r.block, off + padded, fsize - padded, true};
    free_by_size_.insert({fsize - padded, bid, off + padded});
  }
  Allocation a;
  a.owner_ = this;
  a.view_ = BufferView{r.block, off, bytes};
  a.padded_ = padded;
  a.tag_ = site.tag;
  stats_.in_use += padded;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  auto t = static_cast<size_t>(site.tag);
  stats_.in_use_by_tag[t] += padded;
  stats_.peak_by_tag[t] = std::max(stats_.peak_by_tag[t], stats_.in_use_by_tag[t]);
  update_largest_free();
  return a;
}

void Allocator::free_range(const BufferView& v, size_t padded, MemoryTag tag) noexcept {
  uint64_t bid = v.block->id;
  auto it = ranges_.find({bid, v.offset});
  if (it == ranges_.end() || it->second.free) return;
  stats_.in_use -= padded;
  stats_.in_use_by_tag[static_cast<size_t>(tag)] -= padded;
  it->second.free = true;
  // Coalesce with the next and previous free neighbours in the same block.
  auto next = std::next(it);
  if (next != ranges_.end() && next->first.first == bid && next->second.free) {
    free_by_size_.erase({next->second.bytes, bid, next->second.offset});
    it->second.bytes += next->second.bytes;
    ranges_.erase(next);
  }
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->first.first == bid && prev->second.free) {
      free_by_size_.erase({prev->second.bytes, bid, prev->second.offset});
      prev->second.bytes += it->second.bytes;
      ranges_.erase(it);
      it = prev;
    }
  }
  free_by_size_.insert({it->second.bytes, bid, it->second.offset});
  update_largest_free();
}

void Allocator::release_free_blocks() {
  if (!opts_.growth) return;
  for (auto bit = blocks_.begin(); bit != blocks_.end();) {
    Block* b = *bit;
    auto r = ranges_.find({b->id, 0});
    if (r != ranges_.end() && r->second.free && r->second.bytes == b->bytes) {
      free_by_size_.erase({b->bytes, b->id, 0});
      ranges_.erase(r);
      block_by_id_.erase(b->id);
      stats_.reserved -= b->bytes;
      device_.free_block(b);
      bit = blocks_.erase(bit);
    } else {
      ++bit;
    }
  }
  stats_.blocks = blocks_.size();
  update_largest_free();
}

std::string Allocator::report() const {
  std::ostringstream os;
  const auto& s = stats_;
  os << "  limit " << format_bytes(opts_.limit) << (opts_.growth ? " (growth on demand)" : " (reserved up front)")
     << "; reserved " << format_bytes(s.reserved) << " in " << s.blocks << " block(s); in use "
     << format_bytes(s.in_use) << "; peak in use " << format_bytes(s.peak_in_use) << "; largest free range "
     << format_bytes(s.largest_free) << "; fragmentation " << static_cast<int>(s.fragmentation() * 100) << "%\n";
  os << "  in use by tag:";
  if (s.peak_in_use == 0) os << " none";
  for (size_t t = 0; t < kMemoryTagCount; ++t)
    if (s.in_use_by_tag[t] || s.peak_by_tag[t])
      os << " " << memory_tag_name(static_cast<MemoryTag>(t)) << " " << format_bytes(s.in_use_by_tag[t]) << " (peak "
         << format_bytes(s.peak_by_tag[t]) << ");";
  os << "\n";
  return os.str();
}

void Allocator::throw_oom(size_t bytes, const AllocationSite& site, const std::string& why) {
  std::ostringstream os;
  const auto& info = device_.info();
  const size_t dev_free = device_.query_free_memory();
  os << "out of memory on " << info.label() << " (" << info.name << "): " << why << "\n"
     << "  allocating " << format_bytes(bytes) << " for " << memory_tag_name(site.tag)
     << (site.what.empty() ? "" : " (" + site.what + ")") << "\n"
     << report() << "  device: " << format_bytes(dev_free) << " free of " << format_bytes(info.total_memory);
  if (info.total_memory >= dev_free + stats_.reserved)
    os << " (other processes use about " << format_bytes(info.total_memory - dev_free - stats_.reserved) << ")";
  os << "\n";
  if (!oom_hint_.empty()) os << oom_hint_;
  if (oom_hint_provider_) {
    try {
      os << oom_hint_provider_();
    } catch (...) {  // advice is best effort; the report above stands on its own
    }
  }
  throw OutOfMemory(os.str(), bytes, stats_);
}

}  // namespace kiln
