// Planning a model with very many layers is near-linear. No timings (house rule): the planner
// counts the work its arena placement does, and the tests check how that count grows with depth, and that the
// placement stays correct (no two tensors live at once share bytes) and tight.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <sstream>

#include "kiln/executor.hpp"
#include "kiln/memory_savers.hpp"
#include "kiln/model.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

// `n` layers: dense 16 and relu activations alternating, as in bench/planning/deep_model.py.
ModelSpec chain(int n) {
  std::ostringstream os;
  os << "[model]\ninput_shape = [16]\nloss = \"softmax_cross_entropy\"\n";
  for (int i = 0; i < n; ++i)
    os << (i % 2 == 0 || i == n - 1 ? "[[model.layers]]\ntype = \"dense\"\nunits = 16\n"
                                    : "[[model.layers]]\ntype = \"activation\"\n");
  return test::model_from(os.str());
}

struct Planned {
  Graph g;
  MemoryPlan plan;
};

Planned plan_chain(int n, const OptimizerSpec& opt) {
  ModelSpec m = chain(n);
  GraphOptions o;
  o.batch = 8;
  o.optimizer = &opt;
  Planned p{build_graph(m, o), {}};
  p.plan = plan_memory(p.g, nullptr);
  return p;
}

// Arena roots that own their bytes: (first, last, offset, bytes).
struct Span {
  size_t first, last, off, bytes;
};
std::vector<Span> arena_spans(const Planned& p) {
  Liveness L = analyze_liveness(p.g, PlanOptions{});
  std::vector<Span> s;
  for (size_t t = 0; t < p.g.tensors().size(); ++t)
    if (p.plan.region[t] == Region::arena && p.g.tensors()[t].alias_of == kNoTensor && size_t(L.rep[t]) == t)
      s.push_back({L.first[t] == SIZE_MAX ? 0 : L.first[t], L.last[t], p.plan.offset[t],
                   aligned_size(p.g.tensors()[t].bytes())});
  return s;
}

// The most bytes live at one step: no placement can use less arena than this.
size_t peak_live(const std::vector<Span>& spans) {
  std::map<size_t, long long> delta;
  for (const auto& s : spans) delta[s.first] += (long long)s.bytes, delta[s.last + 1] -= (long long)s.bytes;
  long long cur = 0, peak = 0;
  for (auto [t, d] : delta) peak = std::max(peak, cur += d);
  return size_t(peak);
}

// No two arena tensors that are live at the same step overlap in memory. Sorted by offset, each tensor is checked
// against those that start below its end (a sweep over offsets, not all pairs).
void check_disjoint(std::vector<Span> spans, size_t arena) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.off < b.off; });
  size_t bad = 0, outside = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    outside += spans[i].off + spans[i].bytes > arena;
    for (size_t j = i + 1; j < spans.size() && spans[j].off < spans[i].off + spans[i].bytes; ++j)
      if (!(spans[i].last < spans[j].first || spans[j].last < spans[i].first)) ++bad;
  }
  CHECK(bad == 0);
  CHECK(outside == 0);
}

}  // namespace

TEST_CASE("planning a model 4x deeper does about 4x the placement work, not 16x", "[planner][scale]") {
  OptimizerSpec adam;
  adam.kind = OptimizerKind::adam;
  auto small = plan_chain(3000, adam), big = plan_chain(12000, adam);
  const size_t n_small = arena_spans(small).size(), n_big = arena_spans(big).size();
  INFO("arena tensors " << n_small << " and " << n_big << "; placement steps " << small.plan.placement_steps << " and "
                        << big.plan.placement_steps);
  REQUIRE(n_small > kGreedyPlacementMax);  // both above the greedy placement's bound
  CHECK(n_big >= 3 * n_small);
  // Linear work gives a ratio of ~4 (n log n a little more); the quadratic greedy scan gave ~16.
  CHECK(big.plan.placement_steps <= 6 * small.plan.placement_steps);
  CHECK(big.plan.placement_steps <= 8 * n_big);
  // Graph building stays linear as well: nodes and tensors grow in proportion to the layers.
  CHECK(big.g.nodes().size() <= 5 * small.g.nodes().size());
}

TEST_CASE("the sweep placement of a deep model is correct and within 10% of the bytes live at its peak",
          "[planner][scale]") {
  OptimizerSpec sgd;
  sgd.kind = OptimizerKind::sgd;
  auto p = plan_chain(3000, sgd);
  auto spans = arena_spans(p);
  REQUIRE(spans.size() > kGreedyPlacementMax);
  check_disjoint(spans, p.plan.arena);
  const size_t lower = peak_live(spans);
  INFO("arena " << p.plan.arena << " bytes, peak live " << lower);
  CHECK(p.plan.arena >= lower);
  CHECK(double(p.plan.arena) <= 1.1 * double(lower));
}

TEST_CASE("a model with few arena tensors keeps the greedy-by-size placement, correct and tight", "[planner][scale]") {
  OptimizerSpec sgd;
  sgd.kind = OptimizerKind::sgd;
  auto p = plan_chain(200, sgd);
  auto spans = arena_spans(p);
  REQUIRE(spans.size() <= kGreedyPlacementMax);
  check_disjoint(spans, p.plan.arena);
  CHECK(p.plan.arena >= peak_live(spans));
  CHECK(double(p.plan.arena) <= 1.1 * double(peak_live(spans)));
}
