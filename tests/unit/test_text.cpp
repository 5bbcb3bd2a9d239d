// Language models: the text and tokens sources (nanoGPT's shakespeare_char preparation and get_batch),
// cross-entropy over every position of a sequence, gradient clipping by global norm against PyTorch, and the
// vocabulary `kiln sample` decodes with.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <set>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/model.hpp"
#include "kiln/op_table.hpp"
#include "kiln/session.hpp"
#include "kiln/single_runner.hpp"
#include "kiln/text_generation.hpp"
#include "test_data_support.hpp"
#include "test_support.hpp"

using namespace kiln;
namespace td = kiln::test::data;

namespace {

const std::string kShakespeare = std::string(KILN_SOURCE_DIR) + "/samples/data/tinyshakespeare/input.txt";

std::string write_text(const std::string& tag, const std::string& text) {
  auto p = test::temp_dir(tag) / "input.txt";
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

std::string stage_error(const std::string& stages, const td::PipelineOptions& o = {}) {
  try {
    td::build(stages, o);
  } catch (const ConfigError& e) {
    return std::string("config: ") + e.what();
  } catch (const DataError& e) {
    return std::string("data: ") + e.what();
  }
  return "";
}

std::vector<float> ids_of(const std::string& text, const std::string& vocab) {
  std::vector<float> out;
  for (char c : text) out.push_back(static_cast<float>(vocab.find(c)));
  return out;
}

}  // namespace

TEST_CASE("text source: nanoGPT's shakespeare_char vocabulary (65 sorted characters) and 90/10 split", "[text]") {
  // prepare.py: chars = sorted(list(set(data))); n = len(data); train = data[:int(n*0.9)]; val = data[int(n*0.9):]
  //   -> vocab size 65, n = 1115394, int(n*0.9) = 1003854 (python3 prints these for samples/data/tinyshakespeare).
  const std::string chars = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  REQUIRE(chars.size() == 65);
  std::ifstream f(kShakespeare, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(text.size() == 1115394);
  const int64_t cut = 1003854;

  auto train = td::build("stages = [{type = \"text\", path = \"" + kShakespeare +
                         "\", block_size = 8, sampling = \"sequential\"}]");
  CHECK(train->example_shape() == Shape{8});
  CHECK(train->label_shape() == Shape{8});
  CHECK(train->size_hint() == (cut - 1) / 8);
  // The saved vocabulary lists the 65 characters in order.
  const Vocabulary v = parse_vocabulary(train->vocabulary(), "vocab");
  REQUIRE(v.size() == 65);
  for (size_t i = 0; i < chars.size(); ++i) CHECK(v.tokens[i] == std::string(1, chars[i]));

  // Sequential windows: x = data[i : i+8], y = data[i+1 : i+9] at i = 0, 8, 16, ...
  train->reset(0);
  for (int64_t k = 0; k < 3; ++k) {
    auto e = train->next();
    REQUIRE(e);
    CHECK(e->x.data == ids_of(text.substr(static_cast<size_t>(k * 8), 8), chars));
    CHECK(e->y.data == ids_of(text.substr(static_cast<size_t>(k * 8 + 1), 8), chars));
  }
  // The val split starts at int(n * 0.9); [data.test] reads it by default.
  td::PipelineOptions test_pipeline;
  test_pipeline.pipeline = "test";
  auto val = td::build(
      "stages = [{type = \"text\", path = \"" + kShakespeare + "\", block_size = 8, sampling = \"sequential\"}]",
      test_pipeline);
  CHECK(val->size_hint() == (int64_t(text.size()) - cut - 1) / 8);
  val->reset(0);
  auto first = val->next();
  REQUIRE(first);
  CHECK(first->x.data == ids_of(text.substr(static_cast<size_t>(cut), 8), chars));
  CHECK(first->y.data == ids_of(text.substr(static_cast<size_t>(cut + 1), 8), chars));
}

TEST_CASE("text source: random windows are seeded, aligned with their next-token labels, and resumable", "[text]") {
  std::string text;
  for (int i = 0; i < 300; ++i) text += static_cast<char>('a' + (i * 7) % 26);
  const std::string path = write_text("text_random", text);
  const std::string cfg =
      "stages = [{type = \"text\", path = \"" + path + "\", block_size = 5, examples_per_epoch = 40}]";
  td::PipelineOptions seven;
  seven.seed = 7;
  auto a = td::build(cfg), b = td::build(cfg), other = td::build(cfg, seven);
  const auto ea = td::epoch(*a, 0), eb = td::epoch(*b, 0), e1 = td::epoch(*a, 1), eo = td::epoch(*other, 0);
  REQUIRE(ea.size() == 40);
  CHECK(td::same(ea, eb));   // same seed, same windows
  CHECK(!td::same(ea, e1));  // a fresh draw every epoch
  CHECK(!td::same(ea, eo));  // another seed, other windows
  // Every window is a run of the text with its labels shifted by one: y[j] = x[j + 1].
  const std::string vocab = [&] {
    std::set<char> s(text.begin(), text.end());
    return std::string(s.begin(), s.end());
  }();
  const auto ids = ids_of(text.substr(0, static_cast<size_t>(300 * 0.9)), vocab);
  std::set<int64_t> offsets;
  for (const auto& e : ea) {
    bool found = false;
    for (size_t i = 0; i + 6 <= ids.size() && !found; ++i)
      if (std::equal(e.x.data.begin(), e.x.data.end(), ids.begin() + static_cast<long>(i)) &&
          std::equal(e.y.data.begin(), e.y.data.end(), ids.begin() + static_cast<long>(i + 1))) {
        found = true;
        offsets.insert(static_cast<int64_t>(i));
      }
    CHECK(found);
  }
  CHECK(offsets.size() > 10);  // spread over the split
  // Resuming mid-epoch gives the rest of the same epoch.
  a->reset(1);
  td::drain(*a, 13);
  const StageState st = a->save();
  auto c = td::build(cfg);
  c->reset(1);
  c->restore(st);
  const auto rest = td::drain(*c);
  REQUIRE(rest.size() == 27);
  CHECK(td::same(rest.front(), e1[13]));
}

TEST_CASE("text source: UTF-8 characters, a byte vocabulary, and the tokens source round trip", "[text]") {
  const std::string text = "héllo wörld, ça va? " + std::string(40, 'x');
  const std::string path = write_text("text_utf8", text);
  auto chars =
      td::build("stages = [{type = \"text\", path = \"" + path + "\", block_size = 4, sampling = \"sequential\"}]");
  const Vocabulary v = parse_vocabulary(chars->vocabulary(), "vocab");
  CHECK(v.tokens.size() == 15);  // distinct characters (h é l o space w ö r d , ç a v ? x), not bytes
  std::string decoded;
  chars->reset(0);
  auto e = chars->next();
  REQUIRE(e);
  for (float id : e->x.data) decoded += v.decode(static_cast<int64_t>(id));
  CHECK(decoded == "héll");
  CHECK(v.encode("wörld", "prompt").size() == 5);
  CHECK_THROWS_WITH(v.encode("hola Z", "--prompt"),
                    Catch::Contains("--prompt") && Catch::Contains("'Z'") && Catch::Contains("position 5"));

  auto bytes = td::build("stages = [{type = \"text\", path = \"" + path +
                         "\", vocab = \"bytes\", block_size = 4, "
                         "sampling = \"sequential\"}]");
  bytes->reset(0);
  e = bytes->next();
  REQUIRE(e);
  CHECK(e->x.data == std::vector<float>{'h', 0xc3, 0xa9, 'l'});
  CHECK(parse_vocabulary(bytes->vocabulary(), "vocab").size() == 256);

  // tokens: little-endian uint16, as nanoGPT's prepare.py writes train.bin (np.uint16 tofile).
  std::vector<uint16_t> ids;
  for (int i = 0; i < 100; ++i) ids.push_back(static_cast<uint16_t>((i * 997) % 50257));
  const auto bin = test::temp_dir("tokens") / "train.bin";
  {
    std::ofstream f(bin, std::ios::binary);
    for (uint16_t id : ids) f.put(static_cast<char>(id & 0xff)).put(static_cast<char>(id >> 8));
  }
  auto tok = td::build("stages = [{type = \"tokens\", path = \"" + bin.string() +
                       "\", vocab_size = 50304, block_size = 6, sampling = \"sequential\"}]");
  CHECK(tok->size_hint() == 99 / 6);
  CHECK(tok->vocabulary().empty());
  const auto all = td::epoch(*tok, 0);
  REQUIRE(all.size() == 16);
  for (size_t k = 0; k < all.size(); ++k)
    for (size_t j = 0; j < 6; ++j) {
      CHECK(all[k].x.data[j] == float(ids[k * 6 + j]));
      CHECK(all[k].y.data[j] == float(ids[k * 6 + j + 1]));
    }
  // An id at or above vocab_size names the file and the token.
  auto small = td::build("stages = [{type = \"tokens\", path = \"" + bin.string() +
                         "\", vocab_size = 1000, block_size = 6, "
                         "sampling = \"sequential\"}]");
  small->reset(0);
  CHECK_THROWS_WITH(td::drain(*small), Catch::Contains(bin.string()) && Catch::Contains("vocab_size = 1000"));
}

TEST_CASE("text and tokens sources refuse bad keys, values and files, naming them", "[text]") {
  const std::string path = write_text("text_errors", "abcdefghij");
  const std::string src = "stages = [{type = \"text\", path = \"" + path + "\"";
  CHECK_THAT(stage_error(src + "}]"), Catch::Contains("block_size"));
  CHECK_THAT(stage_error(src + ", block_size = 0}]"),
             Catch::Contains("pipeline.toml:1") && Catch::Contains("block_size"));
  CHECK_THAT(stage_error(src + ", block_size = 4, vocab = \"words\"}]"), Catch::Contains("vocab"));
  CHECK_THAT(stage_error(src + ", block_size = 4, split = \"test\"}]"), Catch::Contains("split"));
  CHECK_THAT(stage_error(src + ", block_size = 4, val_fraction = 1.5}]"), Catch::Contains("val_fraction"));
  CHECK_THAT(stage_error(src + ", block_size = 4, sampling = \"shuffled\"}]"), Catch::Contains("sampling"));
  CHECK_THAT(stage_error(src + ", block_size = 4, blocksize = 4}]"), Catch::Contains("blocksize"));
  CHECK_THAT(stage_error(src + ", block_size = 4, examples_per_epoch = -1}]"), Catch::Contains("examples_per_epoch"));
  // The val split of 10 characters holds 1: too short for a window, named with its file.
  CHECK_THAT(stage_error(src + ", block_size = 4, split = \"val\"}]"),
             Catch::StartsWith("data: text: " + path) && Catch::Contains("val split") && Catch::Contains("block_size"));
  CHECK_THAT(stage_error(src + ", block_size = 2, sampling = \"sequential\", examples_per_epoch = 50}]"),
             Catch::Contains("examples_per_epoch") && Catch::Contains("sequential windows"));
  CHECK_THAT(stage_error("stages = [{type = \"text\", path = \"/nonexistent/input.txt\", block_size = 4}]"),
             Catch::StartsWith("data: text: /nonexistent/input.txt"));
  const std::string bad = write_text("text_bad_utf8",
                                     "abc\xff"
                                     "def" +
                                         std::string(30, 'x'));
  CHECK_THAT(stage_error("stages = [{type = \"text\", path = \"" + bad + "\", block_size = 4}]"),
             Catch::Contains(bad) && Catch::Contains("byte offset 3"));
  CHECK_THAT(stage_error("stages = [{type = \"text\", path = \"" + bad + "\", block_size = 4}]"),
             Catch::Contains("UTF-8") && Catch::Contains("bytes"));
  CHECK(stage_error("stages = [{type = \"text\", path = \"" + bad + "\", block_size = 4, vocab = \"bytes\"}]") == "");
  const std::string odd = write_text("tokens_odd", "abc");
  CHECK_THAT(stage_error("stages = [{type = \"tokens\", path = \"" + odd + "\", vocab_size = 10, block_size = 1}]"),
             Catch::Contains(odd) && Catch::Contains("odd"));
  CHECK_THAT(stage_error("stages = [{type = \"tokens\", path = \"" + odd + "\", block_size = 1}]"),
             Catch::Contains("vocab_size"));
  CHECK_THAT(stage_error("stages = [{type = \"tokens\", path = \"" + odd + "\", vocab_size = 70000, block_size = 1}]"),
             Catch::Contains("vocab_size") && Catch::Contains("65536"));
  CHECK_THAT(stage_error("stages = [{type = \"synthetic\", shape = [2], examples = 4}, {type = \"text\", path = \"" +
                         path + "\", block_size = 4}]"),
             Catch::Contains("source"));
}

namespace {

// A character model without attention: ids (4) -> embedding (4, 3) -> dense (4, 5) logits per position.
const char* kCharModel = R"(
[model]
input_shape = [4]
[[model.layers]]
name = "wte"
type = "embedding"
vocab = 5
dim = 3
[[model.layers]]
name = "head"
type = "dense"
units = 5
)";

struct Rig {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Allocator> alloc;
  Rig() {
    dev = test::registry().backend("cpu")(BackendOptions{})->open(0);
    alloc = std::make_unique<Allocator>(*dev, AllocatorOptions{});
  }
  DeviceContext ctx() { return {dev.get(), alloc.get()}; }
};

// The weights of tests/unit/test_text.cpp's PyTorch script (below), exactly as it builds them.
void set_weights(SingleDeviceRunner& r) {
  HostTensor table(Shape{5, 3}), kernel(Shape{3, 5}), bias(Shape{5});
  for (int v = 0; v < 5; ++v)
    for (int d = 0; d < 3; ++d) table.data[size_t(v * 3 + d)] = static_cast<float>(0.5 * std::sin(1 + v * 3 + d));
  for (int d = 0; d < 3; ++d)
    for (int o = 0; o < 5; ++o) kernel.data[size_t(d * 5 + o)] = static_cast<float>(0.7 * std::cos(2 + d * 5 + o));
  for (int o = 0; o < 5; ++o) bias.data[size_t(o)] = static_cast<float>(0.1 * o - 0.2);
  r.state().write("wte.table", table);
  r.state().write("head.kernel", kernel);
  r.state().write("head.bias", bias);
}

Element char_batch() {
  Element e;
  e.batch = 2;
  e.x = HostTensor(Shape{2, 4});
  e.y = HostTensor(Shape{2, 4});
  e.x.data = {0, 1, 2, 3, 4, 3, 2, 1};
  e.y.data = {1, 2, 3, 4, 3, 2, 1, 0};
  return e;
}

}  // namespace

// PyTorch (Debian's python3-torch), the numbers below:
//   V, D = 5, 3
//   table = torch.tensor([[0.5*math.sin(1+v*3+d) for d in range(D)] for v in range(V)], requires_grad=True)
//   kernel = torch.tensor([[0.7*math.cos(2+d*5+o) for o in range(V)] for d in range(D)], requires_grad=True)
//   bias = torch.tensor([0.1*o-0.2 for o in range(V)], requires_grad=True)
//   x = torch.tensor([[0,1,2,3],[4,3,2,1]]); y = torch.tensor([[1,2,3,4],[3,2,1,0]])
//   logits = table[x] @ kernel + bias                                   # (2, 4, 5)
//   loss = F.cross_entropy(logits.view(-1, V), y.view(-1)); loss.backward()
//   norm = torch.nn.utils.clip_grad_norm_([table, kernel, bias], 0.2)
//   with torch.no_grad(): for p in (table, kernel, bias): p -= 0.1 * p.grad
// -> loss 1.72370815, norm 0.421713948 (clipped to 0.2), weights after the SGD step as listed.
TEST_CASE(
    "clip_norm and per-position cross-entropy match PyTorch's clip_grad_norm_ and F.cross_entropy on a tiny "
    "character model",
    "[clip_norm][text]") {
  Rig rig;
  ModelSpec m = test::model_from(kCharModel);
  m.label_shape = Shape{4};
  auto c = Config::load_string("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.1\nclip_norm = 0.2\n", "run.toml");
  OptimizerSpec sgd = parse_optimizer(*c.root().table("optimizer"));
  REQUIRE(sgd.clip_norm == Approx(0.2));
  RunnerContext rc;
  rc.model = &m;
  rc.optimizer = &sgd;
  rc.devices = {rig.ctx()};
  rc.global_batch = 2;
  SingleDeviceRunner runner(rc, 0);

  // The loss averages over all 2 x 4 positions, labels (2, 4).
  const Graph& g = runner.executor(2, true, false).graph();
  CHECK(g.tensor(g.label).shape == Shape{2, 4});
  const Node* ce = nullptr;
  size_t first_clip = 0, first_update = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.kind == OpKind::SoftmaxCrossEntropy) ce = &n;
    if (n.kind == OpKind::SumSquares && !first_clip) first_clip = i;
    if (n.kind == OpKind::SgdUpdate && !first_update) first_update = i;
  }
  REQUIRE(ce);
  CHECK(std::get<LossAttrs>(ce->attrs).rows == 8);
  CHECK(std::get<LossAttrs>(ce->attrs).cols == 5);
  CHECK(std::get<LossAttrs>(ce->attrs).scale == Approx(1.0 / 8));
  CHECK(first_clip > 0);
  CHECK(first_clip < first_update);  // clipped before the optimizer reads the gradients

  set_weights(runner);
  const StepResult r = runner.train_step(char_batch(), {0, 0.1f});
  CHECK(r.total_loss == Approx(1.72370815).epsilon(1e-6));
  CHECK(r.grad_norm == Approx(0.421713948).epsilon(1e-5));
  const auto st = runner.save_state();
  const std::vector<float> table = {0.416393995f,  0.454644203f,  0.0748989433f, -0.381401002f, -0.476801962f,
                                    -0.135198802f, 0.325823158f,  0.491546601f,  0.206952229f,  -0.269941449f,
                                    -0.500327528f, -0.270544171f, 0.211761117f,  0.492217302f,  0.321715355f};
  const std::vector<float> kernel = {-0.294481248f, -0.688420951f,  -0.460412323f, 0.202428505f,  0.66972065f,
                                     0.52340883f,   -0.0961082801f, -0.642130315f, -0.580406129f, -0.000925835688f,
                                     0.589205027f,  0.636843443f,   0.0938889608f, -0.528142869f, -0.672311246f};
  const std::vector<float> bias = {-0.202102065f, -0.0963836908f, 0.00230264361f, 0.101587884f, 0.194595233f};
  for (auto [name, want] :
       {std::pair{"wte.table", &table}, std::pair{"head.kernel", &kernel}, std::pair{"head.bias", &bias}})
    for (size_t i = 0; i < want->size(); ++i) {
      INFO(name << "[" << i << "]");
      CHECK(st.at(name).data[i] == Approx((*want)[i]).margin(1e-6));
    }
}

TEST_CASE("clip_norm: the global norm op pair on the reference, PyTorch's coefficient, and its config errors",
          "[clip_norm]") {
  // Two gradients accumulate into one sum of squares: 3^2 + 4^2 + 12^2 = 169, norm 13.
  std::vector<float> g1 = {3, 4}, g2 = {12}, s = {0};
  const float* in1[] = {g1.data()};
  const float* in2[] = {g2.data()};
  float* out[] = {s.data()};
  op_desc(OpKind::SumSquares).reference(ElementwiseAttrs{2, 1.f, 0.f}, in1, out);
  op_desc(OpKind::SumSquares).reference(ElementwiseAttrs{1, 1.f, 1.f}, in2, out);
  CHECK(s[0] == 169.f);
  const float* sin[] = {s.data()};
  float* x1[] = {g1.data()};
  op_desc(OpKind::ClipByGlobalNorm).reference(ElementwiseAttrs{2, 6.5f, 0.f}, sin, x1);  // coef 6.5 / (13 + 1e-6)
  CHECK(g1[0] == Approx(1.5).epsilon(1e-6));
  CHECK(g1[1] == Approx(2.0).epsilon(1e-6));
  float* x2[] = {g2.data()};
  op_desc(OpKind::ClipByGlobalNorm).reference(ElementwiseAttrs{1, 100.f, 0.f}, sin, x2);  // below the max: unchanged
  CHECK(g2[0] == 12.f);

  auto err = [](const std::string& toml) {
    try {
      parse_optimizer(*Config::load_string(toml, "run.toml").root().table("optimizer"));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(err("[optimizer]\nclip_norm = -1.0\n"), Catch::Contains("run.toml:2") && Catch::Contains("clip_norm"));
  CHECK_THAT(err("[optimizer]\nclip_norm = nan\n"), Catch::Contains("clip_norm"));
  CHECK(err("[optimizer]\nclip_norm = 0.0\n") == "");
  // No clipping nodes without clip_norm.
  ModelSpec m = test::model_from(kCharModel);
  OptimizerSpec plain;
  GraphOptions go;
  go.batch = 2;
  go.optimizer = &plain;
  const Graph g = build_graph(m, go);
  CHECK(g.grad_sq == kNoTensor);
  for (const Node& n : g.nodes()) CHECK(n.kind != OpKind::SumSquares);
}

TEST_CASE("a test text source with another vocabulary than the training one is a config error", "[text]") {
  const auto dir = test::temp_dir("text_vocab_mismatch");
  std::ofstream(dir / "a.txt") << std::string(200, 'a') + "bcd";
  std::ofstream(dir / "b.txt") << std::string(200, 'a') + "xyz";
  const std::string model =
      "[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"embedding\"\nvocab = 4\ndim = 2\n"
      "[[model.layers]]\ntype = \"dense\"\nunits = 4\n";
  auto session_error = [&](const std::string& test_file) {
    const std::string toml = model + "[data.train]\nstages = [{type = \"text\", path = \"" + (dir / "a.txt").string() +
                             "\", block_size = 4}]\n[data.test]\nstages = [{type = \"text\", path = \"" +
                             (dir / test_file).string() + "\", block_size = 4, split = \"train\"}]\n";
    try {
      Session s(Config::load_string(toml, "run.toml"), test::registry());
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(session_error("b.txt"), Catch::Contains("run.toml:13") && Catch::Contains("data.test.stages[0].path") &&
                                         Catch::Contains("vocabulary differs"));
  CHECK(session_error("a.txt") == "");
}
