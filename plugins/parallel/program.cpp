// Segments and cross-device transfers of a placed graph.
#include "program.hpp"

#include <map>
#include <set>

#include "kiln/error.hpp"

namespace kiln::parallel {

size_t Program::bytes_per_step() const {
  size_t b = 0;
  for (const auto& t : transfers) b += t.bytes;
  return b;
}

Program make_program(const Graph& g, int slots) {
  Program p;
  p.slots = slots;
  p.keep_alive.resize(static_cast<size_t>(slots));
  std::vector<size_t> calls(static_cast<size_t>(slots), 0);
  struct Version {
    int slot = -1;
    size_t segment = 0;
    std::string layer;
    std::set<int> held;  // slots holding this version
  };
  std::map<TensorId, Version> written;  // by root: the last write
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.device < 0 || n.device >= slots)
      throw Error("model_parallel: node " + std::string(op_name(n.kind)) + " of layer '" + n.layer +
                  "' is placed on slot " + std::to_string(n.device) + " of " + std::to_string(slots));
    std::vector<Transfer> pulls;
    for (auto t : n.in) {
      TensorId r = g.root(t);
      const auto& ti = g.tensor(r);
      auto it = written.find(r);
      if (it == written.end()) {
        if (role_persistent(ti.role) && ti.device != n.device)
          throw Error("model_parallel: layer '" + n.layer + "' on slot " + std::to_string(n.device) + " reads '" +
                      ti.name + "', which lives on slot " + std::to_string(ti.device));
        continue;  // the batch (loaded on every device that reads it) or device-local persistent state
      }
      Version& v = it->second;
      if (v.held.count(n.device)) continue;
      Transfer tr;
      tr.root = r;
      tr.src = v.slot;
      tr.dst = n.device;
      tr.bytes = ti.bytes();
      tr.producer = v.segment;
      tr.from_layer = v.layer;
      tr.to_layer = n.layer;
      tr.phase = n.phase;
      bool dup = false;
      for (const auto& q : pulls) dup = dup || q.root == r;
      if (!dup) pulls.push_back(tr);
    }
    bool fresh = p.segments.empty() || p.segments.back().slot != n.device || p.segments.back().phase != n.phase ||
                 !pulls.empty();
    if (fresh) {
      Segment s;
      s.slot = n.device;
      s.phase = n.phase;
      s.begin = i;
      s.call_begin = calls[static_cast<size_t>(n.device)];
      p.segments.push_back(s);
    }
    Segment& seg = p.segments.back();
    for (auto& tr : pulls) {
      written.at(tr.root).held.insert(tr.dst);
      p.keep_alive[static_cast<size_t>(tr.src)].push_back(tr.root);
      seg.pulls.push_back(p.transfers.size());
      p.transfers.push_back(std::move(tr));
    }
    seg.end = i + 1;
    seg.call_end = ++calls[static_cast<size_t>(n.device)];
    for (auto t : n.out) {
      Version v;
      v.slot = n.device;
      v.segment = p.segments.size() - 1;
      v.layer = n.layer;
      v.held = {n.device};
      written[g.root(t)] = std::move(v);
    }
  }
  return p;
}

}  // namespace kiln::parallel
