// A source over NumPy buffers: example k is row k of x and of y, read in place (no copy until the batch).
#include "array_source.hpp"

#include <algorithm>
#include <cstring>

#include "kiln/config.hpp"

namespace kiln::python {

namespace {

class ArraySource final : public Stage {
 public:
  ArraySource(std::string id, ArrayData a)
      : id_(std::move(id)),
        a_(std::move(a)),
        example_(std::vector<int64_t>(a_.x_shape.begin() + 1, a_.x_shape.end())),
        label_(std::vector<int64_t>(a_.y_shape.begin() + 1, a_.y_shape.end())),
        n_(a_.x_shape[0]) {}

  std::string name() const override { return "arrays"; }
  Shape example_shape() const override { return example_; }
  Shape label_shape() const override { return label_; }
  int64_t size_hint() const override { return n_; }
  void reset(uint64_t) override { pos_ = 0; }
  std::optional<Element> next() override {
    if (pos_ >= n_) return std::nullopt;
    ++stats_.elements;
    return at(static_cast<uint64_t>(pos_++));
  }
  bool random_access() const override { return true; }
  Element at(uint64_t k) override {
    if (k >= static_cast<uint64_t>(n_))
      throw DataError("kiln.data.arrays '" + id_ + "': example " + std::to_string(k) + " requested, it holds " +
                      std::to_string(n_));
    Element e;
    e.x = HostTensor(example_);
    e.y = HostTensor(label_);
    const size_t px = e.x.data.size(), py = e.y.data.size();
    std::memcpy(e.x.data.data(), a_.x + k * px, px * sizeof(float));
    std::memcpy(e.y.data.data(), a_.y + k * py, py * sizeof(float));
    return e;
  }
  StageState save() const override {
    StageState s(sizeof(int64_t));
    std::memcpy(s.data(), &pos_, sizeof pos_);
    return s;
  }
  void restore(const StageState& s) override {
    int64_t p = 0;
    if (s.size() != sizeof p)
      throw DataError("kiln.data.arrays '" + id_ + "': the checkpoint's position of this source has " +
                      std::to_string(s.size()) + " bytes, expected 8 (written by another source?)");
    std::memcpy(&p, s.data(), sizeof p);
    if (p < 0 || p > n_)
      throw DataError("kiln.data.arrays '" + id_ + "': the checkpoint is at example " + std::to_string(p) +
                      " of the epoch, but the arrays hold " + std::to_string(n_) + " examples (other arrays?)");
    pos_ = p;
  }
  std::string reading() const override { return "NumPy arrays in memory, " + std::to_string(n_) + " examples"; }
  void collect_stats(std::vector<StageStats>& out) const override {
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  std::string id_;
  ArrayData a_;
  Shape example_, label_;
  int64_t n_, pos_ = 0;
  StageStats stats_;
};

}  // namespace

StageFactory arrays_stage_factory(std::shared_ptr<const std::map<std::string, ArrayData>> arrays) {
  return [arrays](const ConfigNode& cfg, StageContext ctx) -> std::unique_ptr<Stage> {
    if (ctx.upstream) cfg.fail("type", "\"arrays\" is a source: it must be the first stage of the pipeline");
    const std::string id = cfg.get_string("id");
    cfg.finish();
    auto it = arrays->find(id);
    if (it == arrays->end()) {
      std::string known;
      for (const auto& [k, v] : *arrays) known += (known.empty() ? "" : ", ") + ("\"" + k + "\"");
      cfg.fail("id", "no kiln.data.arrays with id \"" + id + "\" was given to this run (it has " +
                         (known.empty() ? std::string("none") : known) + "); pass them as kiln.Run(..., sources={\"" +
                         id + "\": kiln.data.arrays(x, y)})");
    }
    return std::make_unique<ArraySource>(id, it->second);
  };
}

}  // namespace kiln::python
