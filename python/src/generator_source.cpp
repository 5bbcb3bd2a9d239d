// A source over a Python iterator: each item (x, y) is one example or, batched, a batch that is handed on as its
// rows (the usual batch stage follows). Its position is (epoch, examples delivered): a resumed run calls fn again and
// skips that many, which gives the same examples when fn is deterministic.
#include "generator_source.hpp"

#include <pybind11/numpy.h>

#include <cstring>
#include <optional>

#include "kiln/config.hpp"

namespace py = pybind11;

namespace kiln::python {

namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

class GeneratorSource final : public Stage {
 public:
  GeneratorSource(std::string id, const GeneratorSpec& spec) : id_(std::move(id)) {
    py::gil_scoped_acquire g;  // copying Python objects changes their reference counts
    spec_ = spec;
    start(0);
    if (!fill())
      throw DataError("kiln.data.generator '" + id_ +
                      "': the iterator of epoch 0 yielded nothing; a source must "
                      "deliver at least one example");
    example_ = Shape(std::vector<int64_t>(x_->shape() + (spec_.batched ? 1 : 0), x_->shape() + x_->ndim()));
    label_ = Shape(std::vector<int64_t>(y_->shape() + (spec_.batched ? 1 : 0), y_->shape() + y_->ndim()));
  }
  ~GeneratorSource() override {
    py::gil_scoped_acquire g;
    it_ = py::object();
    x_.reset();
    y_.reset();
    spec_.fn = py::object();
  }

  std::string name() const override { return "generator"; }
  Shape example_shape() const override { return example_; }
  Shape label_shape() const override { return label_; }
  void reset(uint64_t epoch) override {
    py::gil_scoped_acquire g;
    start(epoch);
  }
  std::optional<Element> next() override {
    py::gil_scoped_acquire g;
    if (row_ >= rows_ && !fill()) return std::nullopt;
    Element e;
    e.x = HostTensor(example_);
    e.y = HostTensor(label_);
    std::memcpy(e.x.data.data(), x_->data() + row_ * e.x.data.size(), e.x.bytes());
    std::memcpy(e.y.data.data(), y_->data() + row_ * e.y.data.size(), e.y.bytes());
    ++row_;
    ++pos_;
    ++stats_.elements;
    return e;
  }
  StageState save() const override {
    StageState s(2 * sizeof(int64_t));
    std::memcpy(s.data(), &epoch_, sizeof epoch_);
    std::memcpy(s.data() + sizeof epoch_, &pos_, sizeof pos_);
    return s;
  }
  void restore(const StageState& s) override {
    int64_t at[2];
    if (s.size() != sizeof at)
      throw DataError("kiln.data.generator '" + id_ + "': the checkpoint's position of this source has " +
                      std::to_string(s.size()) + " bytes, expected 16 (written by another source?)");
    std::memcpy(at, s.data(), sizeof at);
    py::gil_scoped_acquire g;
    start(static_cast<uint64_t>(at[0]));
    for (int64_t k = 0; k < at[1]; ++k)
      if ((row_ >= rows_ && !fill()) || (++row_, ++pos_, false))
        throw DataError("kiln.data.generator '" + id_ + "': the checkpoint is at example " + std::to_string(at[1]) +
                        " of epoch " + std::to_string(at[0] + 1) + ", but the iterator ended after " +
                        std::to_string(k) + " (does the function give the same examples every time?)");
  }
  std::string reading() const override { return "a Python iterator, read as the pipeline pulls"; }
  void collect_stats(std::vector<StageStats>& out) const override {
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  // Both with the GIL taken.
  void start(uint64_t epoch) {
    epoch_ = static_cast<int64_t>(epoch);
    pos_ = 0;
    row_ = rows_ = 0;
    try {
      py::object items = spec_.takes_epoch ? spec_.fn(epoch) : spec_.fn();
      it_ = py::iter(items);
    } catch (py::error_already_set& e) {
      throw DataError("kiln.data.generator '" + id_ + "': calling the function for epoch " + std::to_string(epoch + 1) +
                      " raised " + e.what());
    }
  }
  bool fill() {
    try {
      PyObject* item = PyIter_Next(it_.ptr());
      if (!item) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return false;
      }
      py::object o = py::reinterpret_steal<py::object>(item);
      auto t = o.cast<py::tuple>();
      if (t.size() != 2) throw py::type_error("expected an (x, y) pair, got a tuple of " + std::to_string(t.size()));
      x_ = FloatArray::ensure(t[0]);
      y_ = FloatArray::ensure(t[1]);
      if (!*x_ || !*y_) throw py::type_error("x and y must be arrays of numbers");
    } catch (py::error_already_set& e) {
      throw DataError("kiln.data.generator '" + id_ + "': item " + std::to_string(pos_) + " of epoch " +
                      std::to_string(epoch_ + 1) + ": the iterator raised " + e.what());
    } catch (const py::cast_error& e) {
      throw DataError("kiln.data.generator '" + id_ + "': item " + std::to_string(pos_) + " of epoch " +
                      std::to_string(epoch_ + 1) + " is not an (x, y) pair of arrays");
    } catch (const py::builtin_exception& e) {
      throw DataError("kiln.data.generator '" + id_ + "': item " + std::to_string(pos_) + " of epoch " +
                      std::to_string(epoch_ + 1) + ": " + e.what());
    }
    const int64_t n = spec_.batched ? (x_->ndim() > 0 ? x_->shape(0) : -1) : 1;
    const int64_t ny = spec_.batched ? (y_->ndim() > 0 ? y_->shape(0) : -1) : 1;
    if (spec_.batched && (n < 1 || ny != n))
      throw DataError("kiln.data.generator '" + id_ + "': item " + std::to_string(pos_) + " of epoch " +
                      std::to_string(epoch_ + 1) + " holds x of " + std::to_string(x_->ndim()) + " dims (" +
                      std::to_string(n) + " rows) and y of " + std::to_string(ny) +
                      " rows; a batched generator yields (x (N, ...), y (N, ...)) with N >= 1");
    if (example_.rank() || label_.rank() || stats_.elements) check_shapes();
    rows_ = n;
    row_ = 0;
    return true;
  }
  void check_shapes() const {
    const int skip = spec_.batched ? 1 : 0;
    const Shape xs(std::vector<int64_t>(x_->shape() + skip, x_->shape() + x_->ndim()));
    const Shape ys(std::vector<int64_t>(y_->shape() + skip, y_->shape() + y_->ndim()));
    if (!(xs == example_) || !(ys == label_))
      throw DataError("kiln.data.generator '" + id_ + "': item " + std::to_string(pos_) + " of epoch " +
                      std::to_string(epoch_ + 1) + " has examples x " + xs.str() + ", y " + ys.str() +
                      ", but the first item's were x " + example_.str() + ", y " + label_.str());
  }

  std::string id_;
  GeneratorSpec spec_;
  py::object it_;
  std::optional<FloatArray> x_, y_;  // the current item (optional: an empty array is made only with the GIL)
  Shape example_, label_;
  int64_t epoch_ = 0, pos_ = 0, row_ = 0, rows_ = 0;
  StageStats stats_;
};

}  // namespace

StageFactory generator_stage_factory(std::shared_ptr<const std::map<std::string, GeneratorSpec>> gens) {
  return [gens](const ConfigNode& cfg, StageContext ctx) -> std::unique_ptr<Stage> {
    if (ctx.upstream) cfg.fail("type", "\"generator\" is a source: it must be the first stage of the pipeline");
    const std::string id = cfg.get_string("id");
    cfg.finish();
    auto it = gens->find(id);
    if (it == gens->end()) {
      std::string known;
      for (const auto& [k, v] : *gens) known += (known.empty() ? "" : ", ") + ("\"" + k + "\"");
      cfg.fail("id", "no kiln.data.generator with id \"" + id + "\" was given to this run (it has " +
                         (known.empty() ? std::string("none") : known) + "); pass them as kiln.Run(..., sources={\"" +
                         id + "\": kiln.data.generator(fn)})");
    }
    return std::make_unique<GeneratorSource>(id, it->second);
  };
}

}  // namespace kiln::python
