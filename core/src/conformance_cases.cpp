// The conformance case table: every op of the op set, forward and backward, and the optimizer updates, over
// tiny, odd and prime sizes, tails around 64/256-wide tiles and workgroups, and large tensors; in-place cases
// for every op that may alias. Integer inputs make most cases exact (as oneDNN's benchdnn does); float cases
// check precision against the tolerances.
#include <string>
#include <vector>

#include "conformance_impl.hpp"
#include "kiln/op_table.hpp"

namespace kiln::conformance {
namespace {

using V = std::vector<Gen>;
const Gen kI = ints(-3, 3);     // exact products and sums for every size in this table
const Gen kF = uni(-1.f, 1.f);

std::string n(int64_t v) { return std::to_string(v); }

class Table {
 public:
  std::vector<OpCase> cases;
  OpCase& add(std::string variant, OpKind k, OpAttrs a, V in, V out, Check check, bool exact) {
    OpCase c;
    c.id = std::string(op_name(k)) + "/" + variant;
    c.kind = k;
    c.attrs = std::move(a);
    c.in = std::move(in);
    c.out = std::move(out);
    c.check = check;
    c.exact = exact;
    cases.push_back(std::move(c));
    return cases.back();
  }
};

void gemm_cases(Table& t) {
  struct S {
    int64_t m, n, k;
  };
  const S shapes[] = {{1, 1, 1},    {1, 7, 3},      {5, 1, 9},     {2, 3, 5},      {17, 33, 65},  {63, 64, 65},
                      {64, 64, 64}, {65, 63, 127},  {129, 17, 31}, {3, 257, 5},    {31, 97, 200}, {100, 1, 1000}};
  const char* tn[] = {"nn", "nt", "tn", "tt"};
  for (const S& s : shapes)
    for (int tr = 0; tr < 4; ++tr) {
      GemmAttrs a{s.m, s.n, s.k, (tr & 2) != 0, (tr & 1) != 0, 1.f, 0.f};
      t.add(std::string(tn[tr]) + "." + n(s.m) + "x" + n(s.n) + "x" + n(s.k) + ".int", OpKind::Gemm, a, {kI, kI},
            {kOut}, Check::reduction, true);
    }
  const S fshapes[] = {{17, 33, 65}, {64, 64, 64}, {65, 63, 127}, {129, 17, 31}};
  for (int i = 0; i < 4; ++i) {
    const S& s = fshapes[i];
    GemmAttrs a{s.m, s.n, s.k, (i & 2) != 0, (i & 1) != 0, 1.f, 0.f};
    t.add(std::string(tn[i]) + "." + n(s.m) + "x" + n(s.n) + "x" + n(s.k) + ".float", OpKind::Gemm, a, {kF, kF},
          {kOut}, Check::reduction, false);
  }
  t.add("nn.33x17x9.alpha2.beta-1.int", OpKind::Gemm, GemmAttrs{33, 17, 9, false, false, 2.f, -1.f}, {kI, kI}, {kI},
        Check::reduction, true);
  t.add("tn.70x66x40.alpha0.5.beta0.25.float", OpKind::Gemm, GemmAttrs{70, 66, 40, true, false, 0.5f, 0.25f},
        {kF, kF}, {kF}, Check::reduction, false);
  t.add("nn.2049x33x17.int", OpKind::Gemm, GemmAttrs{2049, 33, 17}, {kI, kI}, {kOut}, Check::reduction, true).large =
      true;
  t.add("nn.512x512x512.float", OpKind::Gemm, GemmAttrs{512, 512, 512}, {kF, kF}, {kOut}, Check::reduction, false)
      .large = true;
}

void conv_cases(Table& t) {
  struct C {
    const char* name;
    int64_t n, c, h, w, k, r, s, sh, sw, ph, pw;
    bool floats;
    bool large;
  };
  const C cfgs[] = {
      {"1x1x1x1.k1.r1", 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, false, false},
      {"2x3x7x5.k4.r3.p1", 2, 3, 7, 5, 4, 3, 3, 1, 1, 1, 1, true, false},
      {"2x5x9x11.k6.r3.s2.p1", 2, 5, 9, 11, 6, 3, 3, 2, 2, 1, 1, true, false},
      {"1x2x8x8.k3.r5.p2", 1, 2, 8, 8, 3, 5, 5, 1, 1, 2, 2, false, false},
      {"2x67x6x6.k65.r1", 2, 67, 6, 6, 65, 1, 1, 1, 1, 0, 0, true, false},
      {"3x4x10x7.k5.r2.s3", 3, 4, 10, 7, 5, 2, 2, 3, 3, 0, 0, false, false},
      {"2x3x5x6.k2.r3x2.s1x2.p2x0", 2, 3, 5, 6, 2, 3, 2, 1, 2, 2, 0, false, false},
      {"1x3x13x13.k8.r3.valid", 1, 3, 13, 13, 8, 3, 3, 1, 1, 0, 0, false, false},
      {"8x16x14x14.k32.r5.p2", 8, 16, 14, 14, 32, 5, 5, 1, 1, 2, 2, true, false},
      {"16x8x16x16.k16.r3.p1", 16, 8, 16, 16, 16, 3, 3, 1, 1, 1, 1, true, false},
      {"16x1x28x28.k32.r3.p1", 16, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, true, false},  // the CNN sample's layers
      {"16x32x14x14.k64.r3.p1", 16, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, true, false},
      {"16x16x28x28.k32.r3.p1", 16, 16, 28, 28, 32, 3, 3, 1, 1, 1, 1, true, true},
      {"2x3x8x8.k4.r1.s2", 2, 3, 8, 8, 4, 1, 1, 2, 2, 0, 0, true, false},  // strided pointwise
      {"1x4x9x7.k3.r2x4.s3x1.p0x3", 1, 4, 9, 7, 3, 2, 4, 3, 1, 0, 3, true, false},
      {"7x3x3x3.k2.r3.valid", 7, 3, 3, 3, 2, 3, 3, 1, 1, 0, 0, true, false},  // one output pixel
  };
  const OpKind kinds[] = {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter};
  for (const C& c : cfgs) {
    ConvAttrs a;
    a.n = c.n, a.c = c.c, a.h = c.h, a.w = c.w, a.k = c.k, a.r = c.r, a.s = c.s;
    a.stride_h = c.sh, a.stride_w = c.sw, a.pad_h = c.ph, a.pad_w = c.pw;
    a.oh = (c.h + 2 * c.ph - c.r) / c.sh + 1;
    a.ow = (c.w + 2 * c.pw - c.s) / c.sw + 1;
    for (OpKind k : kinds) {
      t.add(std::string(c.name) + ".int", k, a, {kI, kI}, {kOut}, Check::reduction, true).large = c.large;
      if (c.floats) t.add(std::string(c.name) + ".float", k, a, {kF, kF}, {kOut}, Check::reduction, false).large = c.large;
    }
  }
}

void pool_cases(Table& t) {
  struct P {
    const char* name;
    int64_t n, c, h, w, kh, kw, sh, sw, ph, pw;
    bool large;
  };
  const P cfgs[] = {
      {"1x1x1x1.k1", 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, false},
      {"2x3x8x8.k2.s2", 2, 3, 8, 8, 2, 2, 2, 2, 0, 0, false},
      {"2x3x7x9.k3.s2.p1", 2, 3, 7, 9, 3, 3, 2, 2, 1, 1, false},
      {"1x2x5x5.k3.s1.p1", 1, 2, 5, 5, 3, 3, 1, 1, 1, 1, false},
      {"1x1x3x3.k2.p2.empty_windows", 1, 1, 3, 3, 2, 2, 1, 1, 2, 2, false},
      {"4x5x13x11.k3x2.s3x2.p0x1", 4, 5, 13, 11, 3, 2, 3, 2, 0, 1, false},
      {"16x32x32x32.k2.s2", 16, 32, 32, 32, 2, 2, 2, 2, 0, 0, true},
      {"2x3x17x37.k2.s2.odd", 2, 3, 17, 37, 2, 2, 2, 2, 0, 0, false},  // 18 windows a row: 8 + 8 + 2, odd edges
      {"3x4x14x14.k2.s2", 3, 4, 14, 14, 2, 2, 2, 2, 0, 0, false},      // 7 windows a row, the last row masked
      {"2x3x5x27.k2.s2.odd", 2, 3, 5, 27, 2, 2, 2, 2, 0, 0, false},    // 13 a row: 8, then the last 8 again, odd edges
      {"2x3x6x28.k2.s2", 2, 3, 6, 28, 2, 2, 2, 2, 0, 0, false},        // 14 a row (the CNN sample's 28x28)
  };
  for (const P& p : cfgs) {
    PoolAttrs a;
    a.n = p.n, a.c = p.c, a.h = p.h, a.w = p.w, a.kh = p.kh, a.kw = p.kw;
    a.stride_h = p.sh, a.stride_w = p.sw, a.pad_h = p.ph, a.pad_w = p.pw;
    a.oh = (p.h + 2 * p.ph - p.kh) / p.sh + 1;
    a.ow = (p.w + 2 * p.pw - p.kw) / p.sw + 1;
    const std::string base = p.name;
    // Small integers make ties common: max_pool_backward must pick the first maximum of each window.
    t.add(base + ".int", OpKind::MaxPoolForward, a, {kI}, {kOut}, Check::elementwise, true).large = p.large;
    t.add(base + ".int", OpKind::MaxPoolBackward, a, {kI, {Gen::max_pool_y}, kI}, {kOut}, Check::elementwise, true)
        .large = p.large;
    t.add(base + ".float", OpKind::MaxPoolBackward, a, {kF, {Gen::max_pool_y}, kF}, {kOut}, Check::elementwise, false)
        .large = p.large;
    // Averages divide by the window's valid count: correctly rounded, so still compared elementwise.
    t.add(base + ".int", OpKind::AvgPoolForward, a, {kI}, {kOut}, Check::elementwise, false).large = p.large;
    t.add(base + ".int", OpKind::AvgPoolBackward, a, {kI}, {kOut}, Check::elementwise, false).large = p.large;
  }
}

void activation_cases(Table& t) {
  const int64_t sizes[] = {1, 255, 256, 257, 4099};
  const Activation acts[] = {Activation::relu, Activation::sigmoid,   Activation::tanh,
                             Activation::gelu, Activation::gelu_tanh, Activation::silu};
  for (Activation act : acts) {
    const std::string an(activation_name(act));
    // y ranges of each activation, so backward inputs are values forward could produce; gelu, gelu_tanh and
    // silu backward read x (both tails).
    const Gen y = act == Activation::sigmoid ? uni(0.f, 1.f)
                  : act == Activation::tanh  ? uni(-1.f, 1.f)
                  : activation_backward_reads_input(act) ? uni(-8.f, 8.f)
                                                         : uni(-2.f, 2.f);
    for (int64_t s : sizes) {
      ActivationAttrs a{act, s};
      t.add(an + "." + n(s) + ".float", OpKind::ActivationForward, a, {uni(-8.f, 8.f)}, {kOut}, Check::elementwise,
            false);
      t.add(an + "." + n(s) + ".float", OpKind::ActivationBackward, a, {y, kF}, {kOut}, Check::elementwise, false);
    }
    ActivationAttrs a{act, 1000};
    t.add(an + ".1000.inplace", OpKind::ActivationForward, a, {uni(-8.f, 8.f)}, {kOut}, Check::elementwise, false)
        .alias = {{0, 0}};
    t.add(an + ".1000.inplace", OpKind::ActivationBackward, a, {y, kF}, {kOut}, Check::elementwise, false).alias = {
        {0, 1}};
  }
  t.add("relu.4099.int", OpKind::ActivationForward, ActivationAttrs{Activation::relu, 4099}, {kI}, {kOut},
        Check::elementwise, true);
  t.add("relu.4099.int", OpKind::ActivationBackward, ActivationAttrs{Activation::relu, 4099}, {kI, kI}, {kOut},
        Check::elementwise, true);
  t.add("relu.4194305.float", OpKind::ActivationForward, ActivationAttrs{Activation::relu, 4194305}, {kF}, {kOut},
        Check::elementwise, false)
      .large = true;
}

void softmax_cases(Table& t) {
  struct S {
    int64_t rows, cols;
    bool large;
  };
  const S shapes[] = {{1, 1, false}, {3, 10, false},   {64, 10, false},  {5, 257, false},
                      {7, 1000, false}, {2, 4099, false}, {4096, 100, true}};
  for (const S& s : shapes) {
    const std::string v = n(s.rows) + "x" + n(s.cols);
    SoftmaxAttrs a{s.rows, s.cols};
    t.add(v, OpKind::SoftmaxForward, a, {uni(-5.f, 5.f)}, {kOut}, Check::reduction, false).large = s.large;
    t.add(v, OpKind::SoftmaxBackward, a, {uni(0.f, 1.f), kF}, {kOut}, Check::reduction, false).large = s.large;
  }
}

void loss_cases(Table& t) {
  struct S {
    int64_t rows, cols;
  };
  const S shapes[] = {{1, 1}, {4, 10}, {64, 10}, {130, 7}, {33, 1000}};
  for (const S& s : shapes) {
    const std::string v = n(s.rows) + "x" + n(s.cols);
    LossAttrs a{s.rows, s.cols, 1.f / float(s.rows), true};
    t.add(v, OpKind::SoftmaxCrossEntropy, a, {uni(-6.f, 6.f), {Gen::labels, 0, float(s.cols)}}, {kOut, kOut},
          Check::reduction, false);
    LossAttrs soft = a;  // labels as class probabilities (and below, one-hot-like 0/1 rows)
    soft.soft_labels = true;
    t.add(v + ".probabilities", OpKind::SoftmaxCrossEntropy, soft, {uni(-6.f, 6.f), uni(0.f, 1.f)}, {kOut, kOut},
          Check::reduction, false);
    t.add(v + ".binary_labels", OpKind::SoftmaxCrossEntropy, soft, {uni(-6.f, 6.f), ints(0, 1)}, {kOut, kOut},
          Check::reduction, false);
    t.add(v, OpKind::MeanSquaredError, a, {kF, kF}, {kOut, kOut}, Check::reduction, false);
    t.add(v + ".logits", OpKind::BinaryCrossEntropy, a, {uni(-8.f, 8.f), ints(0, 1)}, {kOut, kOut}, Check::reduction,
          false);
    LossAttrs p = a;
    p.from_logits = false;
    t.add(v + ".probabilities", OpKind::BinaryCrossEntropy, p, {uni(0.001f, 0.999f), uni(0.f, 1.f)}, {kOut, kOut},
          Check::reduction, false);
  }
  LossAttrs a{4, 10, 0.25f, true};
  t.add("4x10.bad_label_gives_nan", OpKind::SoftmaxCrossEntropy, a, {uni(-6.f, 6.f), {Gen::labels_bad, 0, 10.f}},
        {kOut, kOut}, Check::reduction, false);
  t.add("2x4200000.int", OpKind::MeanSquaredError, LossAttrs{2, 4200000, 0.5f, true}, {kI, kI}, {kOut, kOut},
        Check::reduction, false)
      .large = true;
  t.add("8x10.int", OpKind::MeanSquaredError, LossAttrs{8, 10, 1.f, true}, {kI, kI}, {kOut, kOut}, Check::reduction,
        false);
}

void elementwise_cases(Table& t) {
  const int64_t sizes[] = {0, 1, 3, 255, 256, 257, 4099, 65537};
  for (int64_t s : sizes) {
    const std::string v = n(s);
    t.add(v + ".int", OpKind::Add, ElementwiseAttrs{s, 1.f, 1.f}, {kI, kI}, {kOut}, Check::elementwise, true);
    t.add(v + ".alpha2.beta-3.int", OpKind::Add, ElementwiseAttrs{s, 2.f, -3.f}, {kI, kI}, {kOut}, Check::elementwise,
          true);
    t.add(v + ".int", OpKind::Mul, ElementwiseAttrs{s}, {kI, kI}, {kOut}, Check::elementwise, true);
    t.add(v + ".alpha2.beta-1.int", OpKind::Axpby, ElementwiseAttrs{s, 2.f, -1.f}, {kI}, {kI}, Check::elementwise,
          true);
    t.add(v + ".alpha3.int", OpKind::Scale, ElementwiseAttrs{s, 3.f}, {kI}, {kOut}, Check::elementwise, true);
    t.add(v + ".value2.5", OpKind::Fill, ElementwiseAttrs{s, 2.5f}, {}, {kOut}, Check::elementwise, true);
    t.add(v + ".int", OpKind::Copy, ElementwiseAttrs{s}, {kI}, {kOut}, Check::elementwise, true);
  }
  t.add("4099.alpha0.3.beta1.7.float", OpKind::Add, ElementwiseAttrs{4099, 0.3f, 1.7f}, {kF, kF}, {kOut},
        Check::elementwise, false);
  t.add("4099.float", OpKind::Mul, ElementwiseAttrs{4099}, {kF, kF}, {kOut}, Check::elementwise, false);
  t.add("4099.alpha0.7.beta-0.2.float", OpKind::Axpby, ElementwiseAttrs{4099, 0.7f, -0.2f}, {kF}, {kF},
        Check::elementwise, false);
  t.add("4099.alpha0.1.float", OpKind::Scale, ElementwiseAttrs{4099, 0.1f}, {kF}, {kOut}, Check::elementwise, false);
  t.add("1000.inplace_a.int", OpKind::Add, ElementwiseAttrs{1000, 2.f, 1.f}, {kI, kI}, {kOut}, Check::elementwise,
        true)
      .alias = {{0, 0}};
  t.add("1000.inplace_b.int", OpKind::Add, ElementwiseAttrs{1000, 1.f, -2.f}, {kI, kI}, {kOut}, Check::elementwise,
        true)
      .alias = {{0, 1}};
  t.add("1000.inplace_a.int", OpKind::Mul, ElementwiseAttrs{1000}, {kI, kI}, {kOut}, Check::elementwise, true).alias =
      {{0, 0}};
  t.add("1000.inplace_b.int", OpKind::Mul, ElementwiseAttrs{1000}, {kI, kI}, {kOut}, Check::elementwise, true).alias =
      {{0, 1}};
  t.add("1000.inplace.int", OpKind::Scale, ElementwiseAttrs{1000, -2.f}, {kI}, {kOut}, Check::elementwise, true).alias =
      {{0, 0}};
  t.add("4194305.int", OpKind::Add, ElementwiseAttrs{4194305, 1.f, -1.f}, {kI, kI}, {kOut}, Check::elementwise, true)
      .large = true;
  // Past 128 MiB per tensor: some devices cannot bind it (they must say so through supports()).
  t.add("33554441.int", OpKind::Copy, ElementwiseAttrs{33554441}, {kI}, {kOut}, Check::elementwise, true).large = true;
}

void reduce_cases(Table& t) {
  struct R {
    int64_t outer, reduce, inner;
    bool floats, large;
  };
  const R shapes[] = {{1, 1, 1, false, false},     {3, 5, 7, true, false},     {1, 100000, 1, true, false},
                      {2, 1000, 3, false, false},  {1000, 3, 1, false, false}, {7, 257, 129, true, false},
                      {64, 64, 1, false, false},   {5, 0, 3, false, false},    {1, 4194304, 1, false, true}};
  for (const R& r : shapes) {
    const std::string v = n(r.outer) + "x" + n(r.reduce) + "x" + n(r.inner);
    ReduceAttrs a{r.outer, r.reduce, r.inner};
    t.add(v + ".int", OpKind::ReduceSum, a, {kI}, {kOut}, Check::reduction, true).large = r.large;
    if (r.floats) t.add(v + ".float", OpKind::ReduceSum, a, {kF}, {kOut}, Check::reduction, false);
  }
}

void bias_cases(Table& t) {
  struct B {
    int64_t outer, channels, inner;
    bool large;
  };
  const B shapes[] = {{1, 1, 1, false},    {2, 3, 5, false},    {64, 10, 1, false}, {8, 16, 49, false},
                      {1, 1, 100000, false}, {3, 300, 7, false}, {32, 64, 1024, true}};
  for (const B& b : shapes) {
    const std::string v = n(b.outer) + "x" + n(b.channels) + "x" + n(b.inner);
    BiasAttrs a{b.outer, b.channels, b.inner};
    t.add(v + ".int", OpKind::BiasAdd, a, {kI, kI}, {kOut}, Check::elementwise, true).large = b.large;
    t.add(v + ".int", OpKind::BiasGrad, a, {kI}, {kOut}, Check::reduction, true).large = b.large;
  }
  t.add("8x16x49.inplace.int", OpKind::BiasAdd, BiasAttrs{8, 16, 49}, {kI, kI}, {kOut}, Check::elementwise, true)
      .alias = {{0, 0}};
  t.add("8x16x49.float", OpKind::BiasGrad, BiasAttrs{8, 16, 49}, {kF}, {kOut}, Check::reduction, false);
  t.add("1x1x100000.float", OpKind::BiasGrad, BiasAttrs{1, 1, 100000}, {kF}, {kOut}, Check::reduction, false);
  t.add("1x2x2200000.int", OpKind::BiasGrad, BiasAttrs{1, 2, 2200000}, {kI}, {kOut}, Check::reduction, true).large = true;
}

void concat_cases(Table& t) {
  struct C {
    int64_t outer, inner;
    std::vector<int64_t> sizes;
  };
  const C shapes[] = {{1, 1, {1}},           {3, 4, {2, 3}},      {2, 5, {5, 1, 7}},
                      {7, 1, {3, 0, 2}},     {1, 1000, {3, 4, 5}}, {64, 49, {16, 32}}};
  for (const C& c : shapes) {
    std::string v = n(c.outer) + "x[";
    for (size_t i = 0; i < c.sizes.size(); ++i) {
      if (i) v += ',';
      v += n(c.sizes[i]);
    }
    v += "]x";
    v += n(c.inner);
    v += ".int";
    ConcatAttrs a{c.outer, c.inner, c.sizes};
    t.add(v, OpKind::Concat, a, V(c.sizes.size(), kI), {kOut}, Check::elementwise, true);
    t.add(v, OpKind::Split, a, {kI}, V(c.sizes.size(), kOut), Check::elementwise, true);
  }
}

void dropout_cases(Table& t) {
  struct D {
    const char* name;
    int64_t count;
    float rate;
    uint32_t seed, counter;
    bool exact;
  };
  const D cfgs[] = {{"1.rate0.5", 1, 0.5f, 1, 0, true},          {"257.rate0.5", 257, 0.5f, 7, 3, true},
                    {"100003.rate0.5", 100003, 0.5f, 42, 1000, true}, {"4099.rate0.25", 4099, 0.25f, 3, 1, false},
                    {"4099.rate0", 4099, 0.f, 5, 2, true},         {"4099.rate1", 4099, 1.f, 5, 2, true}};
  for (const D& d : cfgs) {
    DropoutAttrs a{d.count, d.rate, d.seed, d.counter};
    for (OpKind k : {OpKind::DropoutForward, OpKind::DropoutBackward})
      t.add(std::string(d.name) + (d.exact ? ".int" : ".float"), k, a, {d.exact ? kI : kF}, {kOut}, Check::elementwise,
            d.exact);
  }
  t.add("1000.rate0.5.inplace.int", OpKind::DropoutForward, DropoutAttrs{1000, 0.5f, 9, 9}, {kI}, {kOut},
        Check::elementwise, true)
      .alias = {{0, 0}};
  t.add("1000.rate0.5.inplace.int", OpKind::DropoutBackward, DropoutAttrs{1000, 0.5f, 9, 9}, {kI}, {kOut},
        Check::elementwise, true)
      .alias = {{0, 0}};
}

void optimizer_cases(Table& t) {
  const int64_t sizes[] = {1, 257, 10007};
  const Gen pos = uni(0.f, 0.01f);  // second-moment state is never negative
  for (int64_t s : sizes) {
    const std::string v = n(s);
    t.add(v + ".plain", OpKind::SgdUpdate, SgdAttrs{s, 0.1f, 0.f, 0.f, false}, {kF}, {kF, kF}, Check::elementwise,
          false);
    t.add(v + ".momentum", OpKind::SgdUpdate, SgdAttrs{s, 0.05f, 0.9f, 0.f, false}, {kF}, {kF, kF}, Check::elementwise,
          false);
    t.add(v + ".nesterov.wd", OpKind::SgdUpdate, SgdAttrs{s, 0.05f, 0.9f, 0.01f, true}, {kF}, {kF, kF},
          Check::elementwise, false);
    t.add(v + ".step1", OpKind::AdamUpdate, AdamAttrs{s, 1e-3f, 0.9f, 0.999f, 1e-7f, 0.f, 1}, {kF},
          {kF, uni(-0.1f, 0.1f), pos}, Check::elementwise, false);
    t.add(v + ".step10.wd", OpKind::AdamUpdate, AdamAttrs{s, 1e-2f, 0.8f, 0.99f, 1e-8f, 0.01f, 10}, {kF},
          {kF, uni(-0.1f, 0.1f), pos}, Check::elementwise, false);
    t.add(v + ".step10.adamw", OpKind::AdamUpdate, AdamAttrs{s, 1e-2f, 0.9f, 0.99f, 1e-8f, 0.f, 10, 0.1f}, {kF},
          {kF, uni(-0.1f, 0.1f), pos}, Check::elementwise, false);
    t.add(v + ".plain", OpKind::RmspropUpdate, RmspropAttrs{s, 1e-2f, 0.9f, 1e-7f, 0.f}, {kF}, {kF, pos, kF},
          Check::elementwise, false);
    t.add(v + ".momentum", OpKind::RmspropUpdate, RmspropAttrs{s, 1e-2f, 0.9f, 1e-7f, 0.9f}, {kF}, {kF, pos, kF},
          Check::elementwise, false);
    t.add(v + ".decay0.999", OpKind::EmaUpdate, EmaAttrs{s, 0.999f}, {kF}, {kF}, Check::elementwise, false);
    t.add(v + ".decay0.5.int", OpKind::EmaUpdate, EmaAttrs{s, 0.5f}, {kI}, {kI}, Check::elementwise, true);
  }
}

// Gradient clipping by global norm: the sum of squares accumulates over many tensors (beta = 1) and must stay right
// at lengths past what one shader invocation may loop over; the scale clips (max_norm below the norm) or not.
void clip_cases(Table& t) {
  for (int64_t s : {1, 63, 64, 65, 257, 10007}) {
    const std::string v = n(s);
    t.add(v + ".int", OpKind::SumSquares, ElementwiseAttrs{s, 1.f, 0.f}, {kI}, {kOut}, Check::reduction, true);
    t.add(v + ".accumulate.int", OpKind::SumSquares, ElementwiseAttrs{s, 1.f, 1.f}, {kI}, {kI}, Check::reduction, true);
    t.add(v + ".alpha0.5.beta2", OpKind::SumSquares, ElementwiseAttrs{s, 0.5f, 2.f}, {kF}, {kF}, Check::reduction,
          false);
    for (float mx : {0.5f, 1.f, 10.f})
      t.add(v + ".max" + (mx == 0.5f ? std::string("0.5") : n(int64_t(mx))), OpKind::ClipByGlobalNorm,
            ElementwiseAttrs{s, mx, 0.f}, {uni(0.25f, 4.f)}, {kF}, Check::elementwise, false);
  }
  // 64 * 32768 elements and more: several dispatches on Vulkan; 0/1 squares keep the f32 sums exact.
  t.add("2100000.int", OpKind::SumSquares, ElementwiseAttrs{2100000, 1.f, 0.f}, {ints(-1, 1)}, {kOut},
        Check::reduction, true);
  t.add("4200001.accumulate.int", OpKind::SumSquares, ElementwiseAttrs{4200001, 1.f, 1.f}, {ints(-1, 1)},
        {ints(0, 3)}, Check::reduction, true)
      .large = true;
  t.add("3000001.max1", OpKind::ClipByGlobalNorm, ElementwiseAttrs{3000001, 1.f, 0.f}, {uni(0.25f, 4.f)}, {kF},
        Check::elementwise, false)
      .large = true;
}

// Small float cases on which every gradient rule is checked by finite differences (op_gradcheck.cpp); they also
// run on every backend like any case. Inputs from spread() keep clear of relu's kink and max-pool ties.
void gradient_cases(Table& t) {
  auto g = [&](std::string variant, OpKind k, OpAttrs a, V in, V out, Check check) {
    t.add("grad." + std::move(variant), k, std::move(a), std::move(in), std::move(out), check, false).gradcheck = true;
  };
  const Gen f = uni(-1.f, 1.f);
  for (int tr = 0; tr < 4; ++tr) {
    const bool ta = tr & 1, tb = tr & 2;
    g(std::string(ta ? "t" : "n") + (tb ? "t" : "n") + ".5x4x3.alpha0.5", OpKind::Gemm,
      GemmAttrs{5, 4, 3, ta, tb, 0.5f, 0.f}, {f, f}, {kOut}, Check::reduction);
  }
  g("3x4x5", OpKind::BiasAdd, BiasAttrs{3, 4, 5}, {f, f}, {kOut}, Check::elementwise);
  g("2x3x6x5.k4.r3x2.s2x1.p1x0", OpKind::Conv2dForward, ConvAttrs{2, 3, 6, 5, 4, 3, 2, 2, 1, 1, 0, 3, 4}, {f, f},
    {kOut}, Check::reduction);
  g("2x2x5x5.k3.s2.p1", OpKind::MaxPoolForward, PoolAttrs{2, 2, 5, 5, 3, 3, 2, 2, 1, 1, 3, 3}, {spread(-1.f, 1.f)},
    {kOut}, Check::elementwise);
  g("2x2x5x5.k3.s2.p1", OpKind::AvgPoolForward, PoolAttrs{2, 2, 5, 5, 3, 3, 2, 2, 1, 1, 3, 3}, {f}, {kOut},
    Check::elementwise);
  for (int i = 0; i < kActivationCount; ++i) {
    const auto act = static_cast<Activation>(i);
    g(std::string(activation_name(act)) + ".40", OpKind::ActivationForward, ActivationAttrs{act, 40},
      {spread(-2.f, 2.f)}, {kOut}, Check::elementwise);
  }
  g("3x5", OpKind::LayerNormForward, LayerNormAttrs{3, 5, 1e-5f, true}, {f, uni(0.5f, 1.5f), f}, {kOut, kOut, kOut},
    Check::reduction);
  g("4x6.nobias", OpKind::LayerNormForward, LayerNormAttrs{4, 6, 1e-5f, false}, {f, uni(0.5f, 1.5f)},
    {kOut, kOut, kOut}, Check::reduction);
  g("3x4x5", OpKind::BatchNormForward, BatchNormAttrs{3, 4, 5, 1e-5f, 0.1f, true}, {f, uni(0.5f, 1.5f), f},
    {kOut, kOut, kOut, uni(-0.5f, 0.5f), uni(0.5f, 2.f)}, Check::reduction);
  g("6x3", OpKind::BatchNormForward, BatchNormAttrs{6, 3, 1, 1e-5f, 0.1f, true}, {f, uni(0.5f, 1.5f), f},
    {kOut, kOut, kOut, uni(-0.5f, 0.5f), uni(0.5f, 2.f)}, Check::reduction);
  g("4x7", OpKind::SoftmaxForward, SoftmaxAttrs{4, 7}, {uni(-2.f, 2.f)}, {kOut}, Check::reduction);
  g("4x7", OpKind::SoftmaxCrossEntropy, LossAttrs{4, 7, 0.25f, true}, {uni(-2.f, 2.f), {Gen::labels, 0, 7.f}},
    {kOut, kOut}, Check::reduction);
  g("4x7", OpKind::MeanSquaredError, LossAttrs{4, 7, 0.25f, true}, {f, f}, {kOut, kOut}, Check::reduction);
  g("4x7.logits", OpKind::BinaryCrossEntropy, LossAttrs{4, 7, 0.25f, true}, {uni(-3.f, 3.f), uni(0.f, 1.f)},
    {kOut, kOut}, Check::reduction);
  g("4x7.probabilities", OpKind::BinaryCrossEntropy, LossAttrs{4, 7, 0.25f, false}, {uni(0.1f, 0.9f), uni(0.f, 1.f)},
    {kOut, kOut}, Check::reduction);
  g("30.alpha0.5.beta-2", OpKind::Add, ElementwiseAttrs{30, 0.5f, -2.f}, {f, f}, {kOut}, Check::elementwise);
  g("30.alpha1.beta1", OpKind::Add, ElementwiseAttrs{30, 1.f, 1.f}, {f, f}, {kOut}, Check::elementwise);
  g("30", OpKind::Mul, ElementwiseAttrs{30}, {f, f}, {kOut}, Check::elementwise);
  g("30.alpha-1.5", OpKind::Scale, ElementwiseAttrs{30, -1.5f}, {f}, {kOut}, Check::elementwise);
  g("30", OpKind::Copy, ElementwiseAttrs{30}, {f}, {kOut}, Check::elementwise);
  g("2x(3,1,2)x2", OpKind::Concat, ConcatAttrs{2, 2, {3, 1, 2}}, {f, f, f}, {kOut}, Check::elementwise);
  g("2x(3,1,2)x2", OpKind::Split, ConcatAttrs{2, 2, {3, 1, 2}}, {f}, {kOut, kOut, kOut}, Check::elementwise);
  g("50.rate0.3", OpKind::DropoutForward, DropoutAttrs{50, 0.3f, 7, 3}, {f}, {kOut}, Check::elementwise);
}

// Rows from 1 to 100,003 values (long reductions within one row), and 70,000 rows (long column sums of the
// parameter gradients); with and without beta.
void layer_norm_cases(Table& t) {
  struct S {
    int64_t rows, cols;
  };
  const S shapes[] = {{1, 1}, {1, 7}, {3, 64}, {5, 65}, {17, 255}, {64, 128}, {2, 40000}, {1, 100003}, {70000, 3}};
  const Gen mean = uni(-0.5f, 0.5f), rstd = uni(0.5f, 2.f), gamma = uni(0.5f, 1.5f);
  for (const S& sh : shapes)
    for (bool bias : {true, false}) {
      const LayerNormAttrs a{sh.rows, sh.cols, 1e-5f, bias};
      const std::string v = n(sh.rows) + "x" + n(sh.cols) + (bias ? "" : ".nobias");
      V fin{kF, gamma};
      if (bias) fin.push_back(kF);
      t.add(v, OpKind::LayerNormForward, a, fin, {kOut, kOut, kOut}, Check::reduction, false);
      V out{kOut, kOut};
      if (bias) out.push_back(kOut);
      t.add(v, OpKind::LayerNormBackward, a, {kF, gamma, mean, rstd, kF}, out, Check::reduction, false);
    }
}

// Batch norm, training and evaluation: rank-2 (inner 1) and image shapes, tails around 64/256, and channels of
// 70,000+ values three ways (one long image row, many samples of inner 1, several samples of long images) so the
// per-channel reductions are long. Running statistics are read-write outputs with data.
void batch_norm_cases(Table& t) {
  struct S {
    int64_t n, c, inner;
  };
  const S shapes[] = {{2, 1, 1},    {4, 3, 1},     {2, 3, 5},   {3, 7, 64},     {5, 16, 65},
                      {2, 4, 255},  {32, 64, 1},   {1, 2, 70001}, {70000, 3, 1}, {8, 2, 9000}};
  const Gen mean = uni(-0.5f, 0.5f), rstd = uni(0.5f, 2.f), gamma = uni(0.5f, 1.5f);
  const Gen run_mean = uni(-0.5f, 0.5f), run_var = uni(0.5f, 2.f);
  for (const S& sh : shapes)
    for (bool training : {true, false}) {
      const BatchNormAttrs a{sh.n, sh.c, sh.inner, 1e-5f, 0.1f, training};
      const std::string v = n(sh.n) + "x" + n(sh.c) + "x" + n(sh.inner) + (training ? "" : ".eval");
      t.add(v, OpKind::BatchNormForward, a, {kF, gamma, kF}, {kOut, kOut, kOut, run_mean, run_var}, Check::reduction,
            false);
      t.add(v, OpKind::BatchNormBackward, a, {kF, gamma, mean, rstd, kF}, {kOut, kOut, kOut}, Check::reduction, false);
    }
  // A channel of 4,200,002 values: more than one Vulkan dispatch's share (256 x 16,384), so partial sums accumulate.
  for (bool training : {true, false}) {
    const BatchNormAttrs a{2, 1, 2100001, 1e-5f, 0.1f, training};
    const std::string v = std::string("2x1x2100001") + (training ? "" : ".eval");
    t.add(v, OpKind::BatchNormForward, a, {kF, gamma, kF}, {kOut, kOut, kOut, run_mean, run_var}, Check::reduction,
          false).large = true;
    t.add(v, OpKind::BatchNormBackward, a, {kF, gamma, mean, rstd, kF}, {kOut, kOut, kOut}, Check::reduction, false)
        .large = true;
  }
  // Momentum 1 (the running statistics become the batch's) and 0 (they stay), a larger epsilon.
  t.add("4x3x5.momentum1", OpKind::BatchNormForward, BatchNormAttrs{4, 3, 5, 1e-3f, 1.f, true},
        {kF, gamma, kF}, {kOut, kOut, kOut, run_mean, run_var}, Check::reduction, false);
  t.add("4x3x5.momentum0", OpKind::BatchNormForward, BatchNormAttrs{4, 3, 5, 1e-5f, 0.f, true},
        {kF, gamma, kF}, {kOut, kOut, kOut, run_mean, run_var}, Check::reduction, false);
}

void embedding_cases(Table& t) {
  struct E {
    int64_t rows, vocab, dim;
    bool large;
  };
  // Character-model sizes (65 x 128, 12 x 64 tokens), a vocabulary of 1, rows of 1, tails around 256, long rows.
  for (const E e : {E{1, 1, 1, false}, E{7, 5, 3, false}, E{768, 65, 128, false}, E{257, 300, 17, false},
                    E{70000, 3, 2, true}, E{64, 50257, 8, true}}) {
    const EmbeddingAttrs a{e.rows, e.vocab, e.dim};
    const std::string v = n(e.rows) + "x" + n(e.vocab) + "x" + n(e.dim);
    const Gen ids{Gen::labels, 0, float(e.vocab)};
    t.add(v + ".int", OpKind::EmbeddingForward, a, {ids, kI}, {kOut}, Check::elementwise, true).large = e.large;
    t.add(v + ".int", OpKind::EmbeddingBackward, a, {ids, kI}, {kOut}, Check::reduction, true).large = e.large;
    if (!e.large) t.add(v + ".float", OpKind::EmbeddingBackward, a, {ids, kF}, {kOut}, Check::reduction, false);
  }
  // An id out of range gives a row of NaN forward and is skipped backward.
  t.add("4x10x3.bad_id", OpKind::EmbeddingForward, EmbeddingAttrs{4, 10, 3}, {{Gen::labels_bad, 0, 10.f}, kI}, {kOut},
        Check::elementwise, true);
  t.add("4x10x3.bad_id", OpKind::EmbeddingBackward, EmbeddingAttrs{4, 10, 3}, {{Gen::labels_bad, 0, 10.f}, kI},
        {kOut}, Check::reduction, true);
  t.add("grad.12x9x5", OpKind::EmbeddingForward, EmbeddingAttrs{12, 9, 5}, {{Gen::labels, 0, 9.f}, kF}, {kOut},
        Check::elementwise, false)
      .gradcheck = true;
}

// Long loops (issue 15): llvmpipe (lavapipe) ends a shader invocation's loops after 65535 iterations in all, so
// a kernel that walks a long reduction in one invocation gives a wrong answer past some size (a dense layer of
// 32000 inputs did). Cases at and beyond those sizes, for every reduction-like op; any backend must pass them
// or refuse them through supports().
void long_loop_cases(Table& t) {
  // GEMM: K = 29952 ran right and 29968 wrong (35 loop iterations per 16-wide K step); 32000 is the report's
  // layer; 600001 is past what one invocation may walk even at one iteration per step (16 * 32768 here).
  const int64_t ks[] = {29800, 30000, 32000, 70001};
  for (int64_t k : ks)
    t.add("nn.3x10x" + n(k) + ".int", OpKind::Gemm, GemmAttrs{3, 10, k}, {kI, kI}, {kOut}, Check::reduction, true);
  t.add("nn.8x10x32000.float", OpKind::Gemm, GemmAttrs{8, 10, 32000}, {kF, kF}, {kOut}, Check::reduction, false);
  t.add("tt.65x3x40000.float", OpKind::Gemm, GemmAttrs{65, 3, 40000, true, true}, {kF, kF}, {kOut},
        Check::reduction, false);
  t.add("tn.2x3x600001.alpha2.beta-1.int", OpKind::Gemm, GemmAttrs{2, 3, 600001, true, false, 2.f, -1.f}, {kI, kI},
        {kI}, Check::reduction, true)
      .large = true;
  t.add("nt.3x2x300007.float", OpKind::Gemm, GemmAttrs{3, 2, 300007, false, true}, {kF, kF}, {kOut},
        Check::reduction, false)
      .large = true;

  // Convolutions: the implicit GEMM's reduction is c*r*s forward, k*r*s backward-data, n*oh*ow for the filter.
  struct C {
    const char* name;
    int64_t n, c, h, w, k, r, s, pad;
    bool large;
  };
  const C convs[] = {{"1x3400x3x3.k3.r3.p1", 1, 3400, 3, 3, 3, 3, 3, 1, false},     // c*r*s = 30600
                     {"1x60000x3x3.k2.r3.p1", 1, 60000, 3, 3, 2, 3, 3, 1, true},   // c*r*s = 540000
                     {"1x2x3x3.k60000.r3.p1", 1, 2, 3, 3, 60000, 3, 3, 1, true},   // k*r*s = 540000
                     {"2x1x180x180.k3.r1", 2, 1, 180, 180, 3, 1, 1, 0, false},    // n*oh*ow = 64800
                     {"2x1x600x600.k1.r1", 2, 1, 600, 600, 1, 1, 1, 0, true}};    // n*oh*ow = 720000
  for (const C& c : convs) {
    ConvAttrs a;
    a.n = c.n, a.c = c.c, a.h = c.h, a.w = c.w, a.k = c.k, a.r = c.r, a.s = c.s, a.pad_h = c.pad, a.pad_w = c.pad;
    a.oh = c.h + 2 * c.pad - c.r + 1;
    a.ow = c.w + 2 * c.pad - c.s + 1;
    for (OpKind k : {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter})
      t.add(std::string(c.name) + ".int", k, a, {kI, kI}, {kOut}, Check::reduction, true).large = c.large;
  }

  // Softmax: a workgroup walks each row in 64-wide steps, three passes forward, two backward. Forward with equal
  // logits: every output is 1/cols exactly, so a backend's f32 sum of 600,000 exponentials (the CPU's is
  // sequential: 7e-5 relative error on random logits) is exact, and a short loop still shows (a short sum or
  // unwritten outputs).
  for (int64_t cols : {600000, 1500000}) {
    SoftmaxAttrs a{2, cols};
    t.add("2x" + n(cols) + ".equal", OpKind::SoftmaxForward, a, {ints(0, 0)}, {kOut}, Check::reduction, false).large =
        true;
    t.add("2x" + n(cols), OpKind::SoftmaxBackward, a, {uni(0.f, 1.f), kF}, {kOut}, Check::reduction, false).large =
        true;
  }

  // Losses: the cross-entropy's scalar loss walked 64 rows at a time, every column of each row in one
  // invocation; the elementwise losses sum in one workgroup.
  struct L {
    int64_t rows, cols;
    bool large;
  };
  const L ce[] = {{2, 40000, false}, {130, 20000, true}, {640, 10000, true}};
  for (const L& l : ce)
    t.add(n(l.rows) + "x" + n(l.cols), OpKind::SoftmaxCrossEntropy, LossAttrs{l.rows, l.cols, 1.f / float(l.rows), true},
          {uni(-6.f, 6.f), {Gen::labels, 0, float(l.cols)}}, {kOut, kOut}, Check::reduction, false)
        .large = l.large;
  t.add("3x3000000.int", OpKind::MeanSquaredError, LossAttrs{3, 3000000, 1.f / 3.f, true}, {kI, kI}, {kOut, kOut},
        Check::reduction, false)
      .large = true;
  t.add("3x3000000.logits", OpKind::BinaryCrossEntropy, LossAttrs{3, 3000000, 1.f / 3.f, true},
        {uni(-8.f, 8.f), ints(0, 1)}, {kOut, kOut}, Check::reduction, false)
      .large = true;

  // Reductions over the middle axis and bias gradients, one workgroup or one invocation per output.
  t.add("3x2097153x1.int", OpKind::ReduceSum, ReduceAttrs{3, 2097153, 1}, {kI}, {kOut}, Check::reduction, true).large =
      true;
  t.add("1x32768x1024.int", OpKind::ReduceSum, ReduceAttrs{1, 32768, 1024}, {kI}, {kOut}, Check::reduction, true)
      .large = true;
  t.add("2x70000x3.int", OpKind::ReduceSum, ReduceAttrs{2, 70000, 3}, {kI}, {kOut}, Check::reduction, true);
  t.add("1x3x4200001.int", OpKind::BiasGrad, BiasAttrs{1, 3, 4200001}, {kI}, {kOut}, Check::reduction, true).large =
      true;
  t.add("70000x2x1.int", OpKind::BiasGrad, BiasAttrs{70000, 2, 1}, {kI}, {kOut}, Check::reduction, true);
  t.add("40x9000x30.int", OpKind::BiasGrad, BiasAttrs{40, 9000, 30}, {kI}, {kOut}, Check::reduction, true).large =
      true;

  // Pooling windows: a 150x150 window walks 22650 iterations per output; 256x256 (global pooling of a 256x256
  // image) 65792.
  for (int64_t k : {150, 256}) {
    PoolAttrs a;
    a.n = 1, a.c = 2, a.h = k, a.w = k, a.kh = k, a.kw = k, a.stride_h = k, a.stride_w = k, a.oh = 1, a.ow = 1;
    const std::string v = "1x2x" + n(k) + "x" + n(k) + ".k" + n(k) + ".global.int";
    t.add(v, OpKind::MaxPoolForward, a, {kI}, {kOut}, Check::elementwise, true);
    t.add(v, OpKind::MaxPoolBackward, a, {kI, {Gen::max_pool_y}, kI}, {kOut}, Check::elementwise, true);
    t.add(v, OpKind::AvgPoolForward, a, {kI}, {kOut}, Check::elementwise, false);
    t.add(v, OpKind::AvgPoolBackward, a, {kI}, {kOut}, Check::elementwise, false);
  }
}

// Attention's ops: batched GEMM (nanoGPT's shapes: 48 heads x 64 x 64 scores over 32, and back), permutations
// of (B, T, H, D) and of the fused (B, T, 3, H, D) projection, causal softmax over (B*H*T, T). Long reductions:
// K = 70001 in one batch, more batches than one Vulkan dispatch may launch (65535), causal rows of 2048.
void attention_cases(Table& t) {
  struct G {
    int64_t batch, m, n, k;
    bool large;
  };
  const char* tn[] = {"nn", "nt", "tn", "tt"};
  const G shapes[] = {{1, 1, 1, 1, false},    {3, 5, 7, 2, false},     {4, 17, 33, 65, false}, {2, 65, 63, 127, false},
                      {48, 64, 64, 32, false}, {48, 64, 32, 64, false}, {0, 3, 4, 5, false},    {5, 0, 3, 4, false},
                      {2, 3, 4, 0, false},     {70000, 2, 3, 2, true},  {2, 3, 10, 70001, true}};
  for (const G& s : shapes)
    for (int tr = 0; tr < 4; ++tr) {
      const GemmAttrs a{s.m, s.n, s.k, (tr & 2) != 0, (tr & 1) != 0, 1.f, 0.f, s.batch};
      const std::string v = std::string(tn[tr]) + "." + n(s.batch) + "x" + n(s.m) + "x" + n(s.n) + "x" + n(s.k);
      t.add(v + ".int", OpKind::BatchedGemm, a, {kI, kI}, {kOut}, Check::reduction, true).large = s.large;
      if (!s.large && s.m * s.n * s.k > 0 && s.batch > 1)
        t.add(v + ".float", OpKind::BatchedGemm, a, {kF, kF}, {kOut}, Check::reduction, false);
    }
  // nanoGPT's scaled scores q k^T / sqrt(32); alpha and beta together.
  t.add("nt.48x64x64x32.scaled.float", OpKind::BatchedGemm, GemmAttrs{64, 64, 32, false, true, 0.17677669f, 0.f, 48},
        {kF, kF}, {kOut}, Check::reduction, false);
  t.add("tn.3x33x17x9.alpha2.beta-1.int", OpKind::BatchedGemm, GemmAttrs{33, 17, 9, true, false, 2.f, -1.f, 3},
        {kI, kI}, {kI}, Check::reduction, true);

  struct P {
    std::vector<int64_t> dims, perm;
    bool large;
  };
  const P perms[] = {{{7}, {0}, false},
                     {{3, 5}, {1, 0}, false},
                     {{2, 4, 3, 5}, {0, 2, 1, 3}, false},   // (B, T, H, D) -> (B, H, T, D)
                     {{2, 3, 4, 5}, {0, 2, 1, 3}, false},   // and back
                     {{12, 64, 4, 32}, {0, 2, 1, 3}, false},  // nanoGPT's heads
                     {{2, 5, 3, 2, 4}, {2, 0, 3, 1, 4}, false},  // fused (B, T, 3, H, D) -> (3, B, H, T, D)
                     {{3, 2, 2, 5, 4}, {1, 3, 0, 2, 4}, false},  // and back
                     {{2, 3, 1, 4, 2, 3}, {5, 3, 1, 0, 4, 2}, false},
                     {{3, 0, 4}, {2, 1, 0}, false},
                     {{64, 257, 3, 67}, {0, 2, 1, 3}, true},
                     {{1, 1031, 5, 997}, {3, 1, 2, 0}, true}};
  for (const P& p : perms) {
    PermuteAttrs a;
    a.rank = static_cast<int64_t>(p.dims.size());
    std::string v;
    for (size_t i = 0; i < p.dims.size(); ++i) {
      a.dims[i] = p.dims[i], a.perm[i] = p.perm[i];
      if (i) v += 'x';
      v += n(p.dims[i]);
    }
    v += ".perm";
    for (int64_t q : p.perm) v += n(q);
    t.add(v + ".int", OpKind::Permute, a, {kI}, {kOut}, Check::elementwise, true).large = p.large;
  }

  struct S {
    int64_t rows, cols;
    bool large;
  };
  // rows = B*H*T: several blocks of T rows; the first row of each block has one unmasked column.
  const S causal[] = {{1, 1, false},     {3, 0, false},  {4, 4, false},      {12, 3, false},  {3072, 64, false},
                      {2 * 257, 257, false}, {2048, 2048, true}, {3, 600000, true}};
  for (const S& s : causal) {
    const SoftmaxAttrs a{s.rows, s.cols, true};
    const std::string v = n(s.rows) + "x" + n(s.cols) + ".causal";
    t.add(v, OpKind::SoftmaxForward, a, {uni(-5.f, 5.f)}, {kOut}, Check::reduction, false).large = s.large;
  }
  // Backward ignores `causal`: dx = y (dy - y.dy) for any y (a causal forward's y is 0 after the diagonal).
  t.add("12x3.causal", OpKind::SoftmaxBackward, SoftmaxAttrs{12, 3, true}, {uni(0.f, 1.f), kF}, {kOut},
        Check::reduction, false);

  auto g = [&](std::string variant, OpKind k, OpAttrs a, V in, Check check) {
    t.add("grad." + std::move(variant), k, std::move(a), std::move(in), {kOut}, check, false).gradcheck = true;
  };
  for (int tr = 0; tr < 4; ++tr)
    g(std::string(tn[tr]) + ".3x5x4x3.alpha0.5", OpKind::BatchedGemm,
      GemmAttrs{5, 4, 3, (tr & 2) != 0, (tr & 1) != 0, 0.5f, 0.f, 3}, {kF, kF}, Check::reduction);
  PermuteAttrs p;
  p.rank = 5, p.dims = {2, 3, 3, 2, 2}, p.perm = {2, 0, 3, 1, 4};
  g("2x3x3x2x2.perm20314", OpKind::Permute, p, {kF}, Check::elementwise);
  g("10x5.causal", OpKind::SoftmaxForward, SoftmaxAttrs{10, 5, true}, {uni(-2.f, 2.f)}, Check::reduction);
}

std::vector<OpCase> build() {
  Table t;
  gradient_cases(t);
  gemm_cases(t);
  bias_cases(t);
  conv_cases(t);
  pool_cases(t);
  activation_cases(t);
  softmax_cases(t);
  loss_cases(t);
  elementwise_cases(t);
  reduce_cases(t);
  concat_cases(t);
  dropout_cases(t);
  optimizer_cases(t);
  layer_norm_cases(t);
  batch_norm_cases(t);
  embedding_cases(t);
  clip_cases(t);
  attention_cases(t);
  long_loop_cases(t);
  return std::move(t.cases);
}

}  // namespace

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> all = build();
  return all;
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> all = cases();
  for (size_t k = kBuiltinOpCount; k < op_count(); ++k) {
    const OpDesc& d = op_desc(static_cast<OpKind>(k));
    if (!d.cases) continue;
    for (OpCase c : d.cases()) {
      c.kind = static_cast<OpKind>(k);
      if (c.id.rfind(d.name + "/", 0) != 0) c.id = d.name + "/" + c.id;
      all.push_back(std::move(c));
    }
  }
  return all;
}

}  // namespace kiln::conformance
