// Mid-epoch position (Checkpoint::data_state): how a checkpoint stores where a run stopped inside an epoch.
#include "train_position.hpp"

#include <cstring>

#include "kiln/error.hpp"

namespace kiln {

namespace {

constexpr char kPositionMagic[8] = {'K', 'P', 'O', 'S', 'I', 'T', 'N', '1'};

struct PosWriter {
  std::vector<uint8_t> buf;
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf.insert(buf.end(), b, b + n);
  }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void f64(double v) { raw(&v, sizeof v); }
  void tensor(const HostTensor& t) {
    u64(t.shape.rank());
    for (int64_t d : t.shape.dims()) u64(static_cast<uint64_t>(d));
    u64(t.data.size());
    raw(t.data.data(), t.data.size() * sizeof(float));
  }
};

struct PosReader {
  const std::vector<uint8_t>& buf;
  const std::string& path;
  size_t pos = 0;
  void need(uint64_t n) {
    if (n > buf.size() - pos)
      throw DataError(path + ": the checkpoint's mid-epoch position is damaged (it ends at byte " +
                      std::to_string(pos) + " of " + std::to_string(buf.size()) + ")");
  }
  void raw(void* p, size_t n) {
    need(n);
    std::memcpy(p, buf.data() + pos, n);
    pos += n;
  }
  uint64_t u64() {
    uint64_t v;
    raw(&v, sizeof v);
    return v;
  }
  double f64() {
    double v;
    raw(&v, sizeof v);
    return v;
  }
  HostTensor tensor() {
    const uint64_t rank = u64();
    need(rank * 8);
    std::vector<int64_t> dims;
    for (uint64_t i = 0; i < rank; ++i) dims.push_back(static_cast<int64_t>(u64()));
    HostTensor t;
    t.shape = Shape(std::move(dims));
    const uint64_t n = u64();
    need(n * sizeof(float));
    if (!t.shape.fits() || static_cast<uint64_t>(t.shape.numel()) != n)
      throw DataError(path + ": the checkpoint's pending batch has " + std::to_string(n) + " values for its shape");
    t.data.resize(n);
    raw(t.data.data(), n * sizeof(float));
    return t;
  }
};

}  // namespace

std::vector<uint8_t> encode_position(const Position& p) {
  PosWriter w;
  w.raw(kPositionMagic, sizeof kPositionMagic);
  w.u64(static_cast<uint64_t>(p.batches));
  w.u64(static_cast<uint64_t>(p.examples));
  w.f64(p.loss_sum);
  w.f64(p.norm_sum);
  w.u64(static_cast<uint64_t>(p.norms));
  w.u64(p.head_sum.size());
  for (double h : p.head_sum) w.f64(h);
  w.u64(p.pipeline.size());
  w.raw(p.pipeline.data(), p.pipeline.size());
  w.u64(p.pending ? 1 : 0);
  if (p.pending) {
    w.tensor(p.pending->x);
    w.tensor(p.pending->y);
    w.u64(static_cast<uint64_t>(p.pending->batch));
  }
  return std::move(w.buf);
}

Position decode_position(const std::vector<uint8_t>& b, const std::string& path) {
  PosReader r{b, path};
  char magic[8];
  r.raw(magic, sizeof magic);
  if (std::memcmp(magic, kPositionMagic, sizeof magic) != 0)
    throw DataError(path + ": the checkpoint's mid-epoch position is not one this Kiln writes");
  Position p;
  p.batches = static_cast<int64_t>(r.u64());
  p.examples = static_cast<int64_t>(r.u64());
  p.loss_sum = r.f64();
  p.norm_sum = r.f64();
  p.norms = static_cast<int64_t>(r.u64());
  const uint64_t heads = r.u64();
  r.need(heads * 8);
  for (uint64_t i = 0; i < heads; ++i) p.head_sum.push_back(r.f64());
  const uint64_t n = r.u64();
  r.need(n);
  p.pipeline.assign(b.begin() + static_cast<std::ptrdiff_t>(r.pos), b.begin() + static_cast<std::ptrdiff_t>(r.pos + n));
  r.pos += n;
  if (r.u64() != 0) {
    Element e;
    e.x = r.tensor();
    e.y = r.tensor();
    e.batch = static_cast<int64_t>(r.u64());
    p.pending = std::move(e);
  }
  if (r.pos != b.size()) throw DataError(path + ": the checkpoint's mid-epoch position has trailing bytes");
  return p;
}

}  // namespace kiln
