// The attention layer: nanoGPT's CausalSelfAttention built from batched_gemm, permute, split and causal softmax. Its
// forward and gradients against PyTorch on fixed weights, the causal mask's exact zeros on every backend present, the
// graph it emits and its keys, and kiln plan's count of its T x T tensors. A one-block transformer trained by the app
// on cpu and vulkan: tests/integration/test_conformance_training.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/memory_report.hpp"
#include "kiln/model.hpp"
#include "kiln/op_table.hpp"
#include "kiln/reference.hpp"
#include "kiln/session.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

// Values of PyTorch (float64) for nanoGPT's CausalSelfAttention (model.py: c_attn, split, view/transpose to heads,
// q k^T / sqrt(D), masked_fill(-inf), softmax, att @ v, transpose back, c_proj) with B=2, T=4, C=8, n_head=2,
// bias=True, dropout 0, on the weights below; loss = (y ** 2).mean(), Kiln's mse against zeros. Script:
//   import math, torch
//   torch.set_default_dtype(torch.float64)
//   B, T, C, H = 2, 4, 8, 2
//   D = C // H
//   x = torch.tensor([math.sin(0.7 * i + 0.3) for i in range(B * T * C)]).reshape(B, T, C).requires_grad_()
//   # Kiln's kernels are (in, out): c_attn.weight = Wqkv^T.
//   Wqkv = torch.tensor([0.3 * math.cos(0.45 * i + 0.2) for i in range(C * 3 * C)]).reshape(C, 3 * C).requires_grad_()
//   bqkv = torch.tensor([0.05 * math.sin(j) for j in range(3 * C)]).requires_grad_()
//   Wproj = torch.tensor([0.25 * math.sin(0.33 * i - 0.4) for i in range(C * C)]).reshape(C, C).requires_grad_()
//   bproj = torch.tensor([0.02 * math.cos(j) for j in range(C)]).requires_grad_()
//   def attn(x, causal):
//       q, k, v = (x @ Wqkv + bqkv).split(C, dim=2)
//       q = q.view(B, T, H, D).transpose(1, 2)
//       k = k.view(B, T, H, D).transpose(1, 2)
//       v = v.view(B, T, H, D).transpose(1, 2)
//       att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
//       if causal:
//           mask = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
//           att = att.masked_fill(mask == 0, float('-inf'))
//       att = torch.softmax(att, dim=-1)
//       y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
//       return y @ Wproj + bproj
//   y = attn(x, True)
//   loss = (y ** 2).mean()
//   loss.backward()   # then print y, attn(x, False), x.grad, Wqkv.grad, bqkv.grad, Wproj.grad, bproj.grad
const std::vector<double> kTorchOut = {
    0.0433125266,   0.0315944307,   0.00769792083,   -0.0102754152,   -0.011072693,   -6.6682054e-05, 0.00634280063,
    -0.00351538312, 0.0392688087,   0.0253632534,    -4.82764065e-05, -0.0187006991,  -0.0192678463,  -0.00714732238,
    0.00114078287,  -0.00627740094, 0.03352967,      0.0183472469,    -0.00758401625, -0.0259429505,  -0.0254350595,
    -0.0115739606,  -0.00106757826, -0.00602916906,  0.0275754885,    0.0122298775,   -0.0132044157,  -0.030459853,
    -0.0283610219,  -0.0125932268,  -7.01539201e-05, -0.00312269149,  0.00535097969,  -0.00664735523, -0.0266972299,
    -0.0371121672,  -0.0274549498,  -0.00422654729,  0.0148542401,    0.0167488464,   0.00699318449,  -0.00252116142,
    -0.0205323265,  -0.0295738419,  -0.0193567031,   0.00355769585,   0.0214844407,   0.0215095043,   0.0108827115,
    0.00332384663,  -0.0133626033,  -0.0218531265,   -0.0119181789,   0.00991129816,  0.0260674702,   0.0238273818,
    0.0167083794,   0.0101560579,   -0.00626114883,  -0.0152487845,   -0.00652365902, 0.0135138446,   0.0274892733,
    0.0229150072,
};
const std::vector<double> kTorchOutNonCausal = {
    0.0274731155,   0.0118103571,    -0.0138958109,   -0.0313485107,  -0.0293510425,  -0.0135777718, -0.000942975891,
    -0.00378959957, 0.0277346903,    0.0122248073,    -0.0133732107,  -0.0307741572,  -0.0287869171, -0.0130847524,
    -0.00057426677, -0.00358499008,  0.027773386,     0.0123881604,   -0.0131028286,  -0.0304259243, -0.0283984133,
    -0.012697903,   -0.000230818866, -0.00332200693,  0.0275754885,   0.0122298775,   -0.0132044157, -0.030459853,
    -0.0283610219,  -0.0125932268,   -7.01539201e-05, -0.00312269149, 0.0170375113,   0.0108654324,  -0.00524808412,
    -0.0140413547,  -0.00525216433,  0.0147121905,    0.0284851504,   0.0236009453,   0.0164434885,  0.0101312038,
    -0.00604328402, -0.0148117116,   -0.00591454501,  0.0142292671,   0.0282337991,   0.0236082907,  0.0163099778,
    0.00984843774,  -0.00644479065,  -0.0152886301,   -0.00641540858, 0.0137585093,   0.0278439491,  0.0233414193,
    0.0167083794,   0.0101560579,    -0.00626114883,  -0.0152487845,  -0.00652365902, 0.0135138446,  0.0274892733,
    0.0229150072,
};
// loss 0.000355293449371
const std::vector<double> kDqkvKernel = {
    -7.30504547e-06, -6.99106981e-06, -5.28513164e-06, -2.52689313e-06, -2.4883348e-07,  -2.47183164e-06,
    -4.20267379e-06, -5.09673924e-06, 1.06160577e-05,  8.52477437e-06,  4.903576e-06,    4.86958778e-07,
    4.1536865e-06,   7.00899151e-06,  8.45658924e-06,  8.21688301e-06,  0.000518554403,  -7.53855696e-05,
    -0.000386355571, 0.000752912524,  -0.000943119476, 0.000887667172,  -0.000613525438, 0.000188232988,
    -2.91059076e-06, -3.35908357e-06, -3.13876338e-06, -2.29349721e-06, 1.49303025e-06,  6.94352293e-07,
    -2.4257523e-07,  -1.13120462e-06, 1.04637675e-05,  8.54357511e-06,  5.26999179e-06,  1.32283189e-06,
    2.87957184e-06,  5.80306365e-06,  7.76701111e-06,  8.24157781e-06,  -0.000664485869, 0.00141577207,
    -0.00181826269,  0.00177279844,   -0.00129918579,  0.000495929687,  0.000429505743,  -0.00124912633,
    2.85276026e-06,  1.85273216e-06,  4.83814344e-07,  -9.8143371e-07,  2.53269852e-06,  3.53397149e-06,
    3.83161025e-06,  3.36635321e-06,  5.39020388e-06,  4.54419898e-06,  3.15784809e-06,  1.5365565e-06,
    2.51149552e-07,  1.86786427e-06,  3.4244863e-06,   4.39012978e-06,  -0.00153500805,  0.00224106998,
    -0.00239501245,  0.00195890955,   -0.00104422472,  -0.000129051279, 0.00127053366,   -0.00209900201,
    7.27441356e-06,  6.19317901e-06,  3.87884662e-06,  7.92213399e-07,  2.38119911e-06,  4.71150868e-06,
    6.10372956e-06,  6.28066252e-06,  -2.21845682e-06, -1.59238494e-06, -4.39480904e-07, 1.02761457e-06,
    -2.4953923e-06,  -2.94582086e-06, -2.52862793e-06, -1.52606488e-06, -0.00168359197,  0.00201235766,
    -0.00184535044,  0.00122371489,   -0.000298148453, -0.000693337412, 0.00151400975,   -0.00196168425,
    8.27479649e-06,  7.620877e-06,    5.44959673e-06,  2.19327017e-06,  1.10978454e-06,  3.67314971e-06,
    5.50516949e-06,  6.24107811e-06,  -8.78374262e-06, -6.98004534e-06, -3.83011517e-06, 3.53694575e-08,
    -4.06831215e-06, -6.37404041e-06, -7.29248894e-06, -6.72452738e-06, -0.00104035627,  0.000837202093,
    -0.000427791276, -8.70120051e-05, 0.000588151692,  -0.000931536126, 0.00104542339,   -0.000901755738,
    5.38341334e-06,  5.46435746e-06,  4.45731634e-06,  2.56279771e-06,  -6.83579032e-07, 9.07251045e-07,
    2.31744218e-06,  3.26621715e-06,  -1.1217897e-05,  -9.08488135e-06, -5.41938642e-06, -9.73510467e-07,
    -3.72784124e-06, -6.80444916e-06, -8.62657845e-06, -8.76033958e-06, 9.2175236e-05,   -0.000731702703,
    0.00119096481,   -0.00135681579,  0.00119783491,   -0.000731618845, 8.51580787e-05,  0.000582282591,
    -3.98732258e-08, 7.37865222e-07,  1.36869043e-06,  1.72700144e-06,  -2.15544471e-06, -2.28534197e-06,
    -1.9602144e-06,  -1.24479678e-06, -8.37609915e-06, -6.9169557e-06,  -4.45983556e-06, -1.52453321e-06,
    -1.63410834e-06, -4.03461914e-06, -5.90345332e-06, -6.67602719e-06, 0.00118135529,   -0.00195647628,
    0.00224959153,   -0.00198848791,  0.00124415765,   -0.000187609788, -0.000915158408, 0.00179246432,
    -5.44440679e-06, -4.33565656e-06, -2.36365198e-06, 7.89694087e-08,  -2.61357106e-06, -4.40310294e-06,
    -5.31595151e-06, -5.17036333e-06, -1.59489098e-06, -1.49587771e-06, -1.40275435e-06, -1.35854416e-06,
    1.22817125e-06,  6.32755294e-07,  -4.0384185e-07,  -1.4518749e-06,  0.00171492549,   -0.0022610885,
    0.00225020021,   -0.0016849431,   0.000705333606,  0.000444635083,  -0.0014850616,   0.00215962207,
};
const std::vector<double> kDqkvBias = {
    9.56749648e-07,  1.91605937e-06,  2.49387057e-06,  2.57513769e-06,
    -2.46653546e-06, -2.21695766e-06, -1.52597075e-06, -5.31154216e-07,
    -1.69406589e-21, -2.11758237e-22, -2.11758237e-22, 5.29395592e-22,
    5.29395592e-23,  -2.11758237e-22, 3.17637355e-22,  0,
    -0.00134570022,  0.000842493965,  -0.000131727342, -0.000611492185,
    0.00120406192,   -0.00149999387,  0.00142638101,   -0.00100135891,
};
const std::vector<double> kDprojKernel = {
    1.79105213e-05,  0.000145132755,  0.000363565165,  0.000460449153,  0.000311822328,  2.53874804e-07,
    -0.000255233371, -0.000293254587, 0.000160562809,  0.000268541583,  0.00048708951,   0.000545590906,
    0.000289520121,  -0.000166616936, -0.000531509403, -0.000591051758, 0.000469926165,  0.000437860472,
    0.000427079487,  0.000317422468,  4.79316027e-05,  -0.000309645554, -0.00059782508,  -0.000699693929,
    0.000840921686,  0.000597627252,  0.000214426106,  -0.000133830523, -0.000329464967, -0.000398311717,
    -0.000463767148, -0.000613192341, 0.00101309738,   0.000621434395,  -3.16054901e-05, -0.000531571385,
    -0.000618131151, -0.000402908355, -0.000246221999, -0.000408280681, 0.000795555182,  0.000428249357,
    -0.000186557732, -0.00062619921,  -0.000629448036, -0.000321258505, -8.40770231e-05, -0.000195528413,
    0.00024671213,   6.33135278e-05,  -0.000229043398, -0.000418024589, -0.000374770025, -0.00016752288,
    4.18583412e-06,  -6.04479194e-06, -0.000349423547, -0.000313313445, -0.000226722055, -0.000128503279,
    -4.69613132e-05, 1.94816026e-05,  9.25739969e-05,  0.000185300415,
};
const std::vector<double> kDprojBias = {
    0.00573817965,  0.00287019364,   -0.002499753,  -0.00591146368,
    -0.00466844098, -0.000269528139, 0.00300753986, 0.00206425297,
};

constexpr int64_t kB = 2, kT = 4, kC = 8;

std::vector<float> fixed(int64_t n, double scale, double step, double phase, bool cosine) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double a = step * double(i) + phase;
    v[size_t(i)] = static_cast<float>(scale * (cosine ? std::cos(a) : std::sin(a)));
  }
  return v;
}

// Runs a graph's forward and backward nodes on the reference implementation, with host buffers per storage root.
struct ReferenceRun {
  const Graph& g;
  std::map<TensorId, std::vector<float>> bufs;
  explicit ReferenceRun(const Graph& graph) : g(graph) {
    for (TensorId t = 0; t < static_cast<TensorId>(g.tensors().size()); ++t)
      if (g.root(t) == t) bufs[t].assign(static_cast<size_t>(g.tensor(t).shape.numel()), 0.f);
  }
  std::vector<float>& at(TensorId t) { return bufs.at(g.root(t)); }
  std::vector<float>& named(const std::string& name) {
    const TensorId t = g.find(name);
    REQUIRE(t != kNoTensor);
    return at(t);
  }
  void run() {
    for (const Node& n : g.nodes()) {
      if (n.phase == Phase::update) continue;
      std::vector<const float*> in;
      std::vector<float*> out;
      for (TensorId t : n.in) in.push_back(at(t).data());
      for (TensorId t : n.out) out.push_back(at(t).data());
      reference_op(n.kind, n.attrs, in, out);
    }
  }
  TensorId grad_of(const std::string& name) {
    const TensorId p = g.find(name);
    for (const auto& [param, grad] : g.param_grads)
      if (param == p) return grad;
    FAIL("no gradient for " << name);
    return kNoTensor;
  }
};

std::string model_toml(const std::string& attention_keys) {
  return "[model]\ninput_shape = [4, 8]\nloss = \"mse\"\n"
         "[[model.layers]]\nname = \"attn\"\ntype = \"attention\"\nheads = 2\n" +
         attention_keys + "[[model.layers]]\ntype = \"flatten\"\n";
}

// Within rtol of each value, plus rtol / 10 of the largest (float32 intermediates against PyTorch's float64).
void check_close(const std::vector<float>& got, const std::vector<double>& want, double rtol) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": kiln " << got[i] << ", pytorch " << want[i]);
    CHECK(std::fabs(double(got[i]) - want[i]) <= rtol * (std::fabs(want[i]) + 0.1 * scale));
  }
}

Graph attention_graph(const std::string& keys, bool training, GraphOptions* opts = nullptr) {
  static OptimizerSpec o;
  GraphOptions go = opts ? *opts : GraphOptions{};
  go.batch = kB;
  go.training = training;
  go.optimizer = training ? &o : nullptr;
  return build_graph(test::model_from(model_toml(keys)), go);
}

void set_weights(ReferenceRun& r) {
  r.at(r.g.input) = fixed(kB * kT * kC, 1.0, 0.7, 0.3, false);
  r.named("attn.qkv_kernel") = fixed(kC * 3 * kC, 0.3, 0.45, 0.2, true);
  r.named("attn.qkv_bias") = fixed(3 * kC, 0.05, 1.0, 0.0, false);
  r.named("attn.proj_kernel") = fixed(kC * kC, 0.25, 0.33, -0.4, false);
  r.named("attn.proj_bias") = fixed(kC, 0.02, 1.0, 0.0, true);
}

}  // namespace

TEST_CASE("attention matches PyTorch's nanoGPT CausalSelfAttention forward, causal and not", "[attention]") {
  for (const bool causal : {true, false}) {
    INFO("causal " << causal);
    const Graph g = attention_graph(causal ? "" : "causal = false\n", false);
    ReferenceRun r(g);
    set_weights(r);
    r.run();
    check_close(r.at(g.outputs[0]), causal ? kTorchOut : kTorchOutNonCausal, 1e-4);
  }
}

TEST_CASE("attention's gradients (autodiff through its ops) match PyTorch's", "[attention]") {
  const Graph g = attention_graph("", true);
  ReferenceRun r(g);
  set_weights(r);
  r.run();  // labels stay zero: loss = mean(y^2)
  CHECK(r.at(g.losses[0])[0] == Approx(0.000355293449).epsilon(1e-4));
  check_close(r.at(r.grad_of("attn.qkv_kernel")), kDqkvKernel, 1e-4);
  check_close(r.at(r.grad_of("attn.qkv_bias")), kDqkvBias, 1e-4);
  check_close(r.at(r.grad_of("attn.proj_kernel")), kDprojKernel, 1e-4);
  check_close(r.at(r.grad_of("attn.proj_bias")), kDprojBias, 1e-4);
}

TEST_CASE("causal softmax gives exactly 0 after the diagonal and ignores what is there, on every backend",
          "[attention]") {
  // 3 blocks of T = 5 rows; the masked scores hold NaN, infinities and huge values, which must change nothing.
  const int64_t T = 5, rows = 3 * T;
  std::vector<float> x(static_cast<size_t>(rows * T));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  const float poison[] = {NAN, INFINITY, -INFINITY, 1e30f, -1e30f};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < T; ++j) x[size_t(r * T + j)] = j <= r % T ? u(rng) : poison[(r + j) % 5];
  const SoftmaxAttrs a{rows, T, true};
  std::vector<float> want(x.size());
  {
    const float* in[] = {x.data()};
    float* out[] = {want.data()};
    reference_op(OpKind::SoftmaxForward, a, in, out);
  }
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < T; ++j) {
      const float y = want[size_t(r * T + j)];
      if (j > r % T)
        CHECK(y == 0.f);
      else
        CHECK(y > 0.f);
      sum += y;
    }
    CHECK(sum == Approx(1.0).epsilon(1e-6));
  }
  CHECK(want[0] == 1.f);  // the first row of a block sees only itself
  int ran = 0;
  for (const std::string backend : {"cpu", "vulkan", "cuda"}) {
    if (!test::registry().has_backend(backend)) continue;
    auto be = test::registry().backend(backend)(BackendOptions{});
    if (be->enumerate().empty()) continue;
    INFO("backend " << backend);
    auto dev = be->open(0);
    const size_t bytes = x.size() * sizeof(float);
    Block* b = dev->allocate_block(2 * bytes);
    REQUIRE(b);
    const BufferView xin{b, 0, bytes}, yout{b, bytes, bytes};
    dev->copy_from_host(x.data(), xin);
    dev->run(OpCall{OpKind::SoftmaxForward, a, {xin}, {yout}, {}});
    std::vector<float> got(x.size());
    dev->copy_to_host(yout, got.data());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i);
      if (want[i] == 0.f)
        CHECK(got[i] == 0.f);
      else
        CHECK(got[i] == Approx(want[i]).epsilon(1e-6));
    }
    dev->free_block(b);
    ++ran;
  }
  CHECK(ran >= 1);
}

TEST_CASE("attention emits nanoGPT's ops and parameters, and refuses what it cannot build", "[attention][graph]") {
  // nanoGPT's shakespeare_char block: 4 heads, width 128, context 64, no biases; c_proj at 0.02 / sqrt(2 * 4).
  ModelSpec m = test::model_from(
      "[model]\ninput_shape = [64]\n"
      "[[model.layers]]\nname = \"wte\"\ntype = \"embedding\"\nvocab = 65\ndim = 128\ninit_std = 0.02\n"
      "[[model.layers]]\nname = \"attn\"\ntype = \"attention\"\nheads = 4\nuse_bias = false\ndropout = 0.1\n"
      "init_std = 0.02\nproj_init_std = 0.0070710678\n"
      "[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\ntype = \"dense\"\nunits = 3\n");
  OptimizerSpec o;
  GraphOptions go;
  go.batch = 12;
  go.optimizer = &o;
  const Graph g = build_graph(m, go);
  CHECK(g.find("attn.qkv_bias") == kNoTensor);
  CHECK(g.find("attn.proj_bias") == kNoTensor);
  const TensorId wqkv = g.find("attn.qkv_kernel"), wproj = g.find("attn.proj_kernel");
  REQUIRE(wqkv != kNoTensor);
  REQUIRE(wproj != kNoTensor);
  CHECK(g.tensor(wqkv).shape == Shape{128, 384});
  CHECK(g.tensor(wqkv).init.kind == InitKind::normal);
  CHECK(g.tensor(wqkv).init.value == Approx(0.02f));
  CHECK(g.tensor(wproj).init.value == Approx(0.0070710678f));
  int scores = 0, softmax = 0, dropout = 0, permutes = 0, batched_backward = 0;
  for (const Node& n : g.nodes()) {
    if (n.kind == OpKind::BatchedGemm && n.phase == Phase::forward) {
      const auto& a = std::get<GemmAttrs>(n.attrs);
      if (a.batch == 48 && a.m == 64 && a.n == 64 && a.k == 32 && a.trans_b && a.alpha == Approx(1 / std::sqrt(32.0)))
        ++scores;
    }
    if (n.kind == OpKind::BatchedGemm && n.phase == Phase::backward) ++batched_backward;
    if (n.kind == OpKind::SoftmaxForward) {
      const auto& a = std::get<SoftmaxAttrs>(n.attrs);
      softmax += a.causal && a.rows == 48 * 64 && a.cols == 64;
    }
    if (n.kind == OpKind::DropoutForward && std::get<DropoutAttrs>(n.attrs).count == 48 * 64 * 64) ++dropout;
    if (n.kind == OpKind::Permute) ++permutes;
  }
  CHECK(scores == 1);
  CHECK(softmax == 1);
  CHECK(dropout == 1);
  CHECK(batched_backward == 4);  // dq, dk from the scores; datt, dv from att @ v
  CHECK(permutes == 4);          // two forward, their inverses backward
  // Evaluation: no dropout.
  GraphOptions ev;
  ev.batch = 12;
  ev.training = false;
  int eval_dropout = 0;
  const Graph eval = build_graph(m, ev);
  for (const Node& n : eval.nodes()) eval_dropout += n.kind == OpKind::DropoutForward;
  CHECK(eval_dropout == 0);

  CHECK_THROWS_WITH(build_graph(test::model_from("[model]\ninput_shape = [4, 8]\nloss = \"mse\"\n[[model.layers]]\n"
                                                 "name = \"a\"\ntype = \"attention\"\nheads = 3\n[[model.layers]]\n"
                                                 "type = \"flatten\"\n"),
                                GraphOptions{}),
                    Catch::Contains("heads = 3") && Catch::Contains("width 8"));
  CHECK_THROWS_WITH(
      test::model_from("[model]\ninput_shape = [4, 8]\n[[model.layers]]\ntype = \"attention\"\nheads = 0\n"),
      Catch::Contains("heads"));
  CHECK_THROWS_WITH(
      test::model_from("[model]\ninput_shape = [4, 8]\n[[model.layers]]\ntype = \"attention\"\nheads = 2\n"
                       "dropout = 1.0\n"),
      Catch::Contains("dropout"));
  CHECK_THROWS_WITH(
      test::model_from("[model]\ninput_shape = [4, 8]\n[[model.layers]]\ntype = \"attention\"\nheads = 2\n"
                       "init_std = -1\n"),
      Catch::Contains("init_std"));
  CHECK_THROWS_WITH(build_graph(test::model_from("[model]\ninput_shape = [8]\nloss = \"mse\"\n[[model.layers]]\n"
                                                 "type = \"attention\"\nheads = 2\n"),
                                GraphOptions{}),
                    Catch::Contains("(batch, positions, features)"));
}

namespace {

// A small GPT (nanoGPT's block: ln, attention, residual, ln, 4C gelu MLP, residual) over token windows from a CSV,
// classified from the flattened last norm: `blocks` blocks, T tokens, width C, batch 12.
std::filesystem::path write_gpt(const std::string& tag, int blocks, int T, int C, int heads, double dropout) {
  const auto dir = test::temp_dir(tag);
  {
    std::ofstream csv(dir / "seq.csv");
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> tok(0, 64);
    for (int r = 0; r < 48; ++r) {
      for (int j = 0; j < T; ++j) csv << tok(rng) << ",";
      csv << r % 3 << "\n";
    }
  }
  std::ofstream toml(dir / "gpt.toml");
  toml << "[model]\ninput_shape = [" << T << "]\n"
       << "[[model.layers]]\nname = \"wte\"\ntype = \"embedding\"\nvocab = 65\ndim = " << C << "\ninit_std = 0.02\n"
       << "[[model.layers]]\nname = \"x0\"\ntype = \"positional_embedding\"\ninit_std = 0.02\n";
  for (int b = 0; b < blocks; ++b) {
    const std::string x = "x" + std::to_string(b), n = std::to_string(b);
    toml << "[[model.layers]]\nname = \"ln1_" << n << "\"\ntype = \"layer_norm\"\nuse_bias = false\n"
         << "[[model.layers]]\nname = \"attn" << n << "\"\ntype = \"attention\"\nheads = " << heads
         << "\nuse_bias = false\ninit_std = 0.02\ndropout = " << dropout << "\n"
         << "[[model.layers]]\nname = \"r" << n << "\"\ntype = \"add\"\ninputs = [\"" << x << "\", \"attn" << n
         << "\"]\n"
         << "[[model.layers]]\nname = \"ln2_" << n << "\"\ntype = \"layer_norm\"\nuse_bias = false\n"
         << "[[model.layers]]\nname = \"fc" << n << "\"\ntype = \"dense\"\nunits = " << 4 * C << "\nuse_bias = false\n"
         << "activation = \"gelu\"\n"
         << "[[model.layers]]\nname = \"proj" << n << "\"\ntype = \"dense\"\nunits = " << C << "\nuse_bias = false\n"
         << "[[model.layers]]\nname = \"x" << b + 1 << "\"\ntype = \"add\"\ninputs = [\"r" << n << "\", \"proj" << n
         << "\"]\n";
  }
  toml << "[[model.layers]]\nname = \"ln_f\"\ntype = \"layer_norm\"\nuse_bias = false\n"
       << "[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\nname = \"head\"\ntype = \"dense\"\nunits = 3\n"
       << "[optimizer]\ntype = \"adamw\"\nlearning_rate = 1e-3\n"
       << "[device]\nbackend = \"cpu\"\nmemory_limit = \"1GiB\"\n"
       << "[train]\nbatch_size = 12\nepochs = 1\nevaluate = false\nprogress = \"none\"\noutput_dir = \""
       << (dir / "out").string() << "\"\n"
       << "[data.train]\nstages = [{type = \"csv\", path = \"" << (dir / "seq.csv").string()
       << "\"}, {type = \"batch\", size = 12}]\n";
  return dir / "gpt.toml";
}

}  // namespace

TEST_CASE("kiln plan counts attention's T x T tensors: a small GPT's measured step peak is within 5% of the plan",
          "[attention][memory]") {
  for (const double dropout : {0.0, 0.1}) {
    for (const std::string savers : {"", "recompute"}) {
      std::vector<std::string> ov;
      if (savers == "recompute") ov.push_back("memory.recompute=\"auto\"");
      Session s(Config::load_file(write_gpt("gpt-plan", 2, 64, 128, 4, dropout).string(), ov), test::registry());
      if (auto train = s.make_pipeline("train")) s.model().label_shape = train->label_shape();
      s.open_devices(false);
      const SweepPoint p = memory_sweep(s, {s.train().batch_size}, true, nullptr).at(0);
      INFO("dropout " << dropout << " " << savers << ": predicted " << p.predicted << ", measured " << p.measured);
      REQUIRE(p.fits);
      REQUIRE(p.measured > 0);
      CHECK(double(p.measured) <= 1.05 * double(p.predicted));
      CHECK(double(p.measured) >= 0.95 * double(p.predicted));
      // The scores dominate at T = 64: 12 x 4 x 64 x 64 floats = 768 KiB each.
      CHECK(p.predicted > 4 * 12 * 4 * 64 * 64 * 4);
    }
  }
}
