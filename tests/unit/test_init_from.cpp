// [init] from: the safetensors reader's refusals of damaged or hostile files, name mapping, strictness, dtype
// conversions and a Kiln checkpoint as source (docs/weights.md).
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "kiln/checkpoint.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/half.hpp"
#include "kiln/init_from.hpp"
#include "kiln/model.hpp"
#include "kiln/safetensors.hpp"
#include "kiln/session.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
using kiln::Shape;

struct StTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

std::string half_bytes(const std::vector<float>& v, kiln::DType t) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = kiln::float_to_half(v[i], t);
  return std::string(reinterpret_cast<const char*>(h.data()), h.size() * 2);
}

std::vector<float> ramp(size_t n, float scale = 0.01f, float offset = 0.f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = offset + scale * static_cast<float>(i);
  return v;
}

// A safetensors file: the given header text (length field written as it is), then `data`.
std::string raw_file(const fs::path& p, const std::string& header, const std::string& data, uint64_t len_field) {
  std::string out;
  for (int k = 0; k < 8; ++k) out += static_cast<char>((len_field >> (8 * k)) & 0xff);
  out += header + data;
  std::ofstream(p, std::ios::binary) << out;
  return p.string();
}

std::string header_of(const std::vector<StTensor>& ts) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
  size_t off = 0;
  for (const auto& t : ts) {
    h += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) h += (i ? "," : "") + std::to_string(t.shape[i]);
    h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + t.bytes.size()) + "]}";
    off += t.bytes.size();
  }
  return h + "}";
}

std::string st_file(const fs::path& p, const std::vector<StTensor>& ts) {
  std::string data;
  for (const auto& t : ts) data += t.bytes;
  const std::string h = header_of(ts);
  return raw_file(p, h, data, h.size());
}

// The model of these tests: fc1 (4 -> 3), ln (3), out (3 -> 2); 6 parameters.
const char* kModel = R"(
[model]
input_shape = [4]
[[model.layers]]
name = "fc1"
type = "dense"
units = 3
[[model.layers]]
name = "ln"
type = "layer_norm"
[[model.layers]]
name = "out"
type = "dense"
units = 2
)";

// The model's own tensors under its own names, as `kiln export` would write them.
std::vector<StTensor> kiln_named(const std::string& dtype = "F32") {
  auto bytes = [&](size_t n, float off) {
    const auto v = ramp(n, 0.01f, off);
    return dtype == "F32" ? f32_bytes(v) : half_bytes(v, dtype == "F16" ? kiln::DType::f16 : kiln::DType::bf16);
  };
  return {{"fc1.kernel", dtype, {4, 3}, bytes(12, 0.1f)}, {"fc1.bias", dtype, {3}, bytes(3, 0.2f)},
          {"ln.gamma", dtype, {3}, bytes(3, 1.f)},        {"ln.beta", dtype, {3}, bytes(3, 0.3f)},
          {"out.kernel", dtype, {3, 2}, bytes(6, 0.4f)},  {"out.bias", dtype, {2}, bytes(2, 0.5f)}};
}

kiln::InitSpec spec_of(const std::string& init_toml, const fs::path& dir) {
  auto cfg = kiln::Config::load_string("[init]\n" + init_toml, (dir / "run.toml").string());
  return kiln::parse_init(*cfg.root().table("init"), dir.string());
}

kiln::InitialWeights load(const std::string& init_toml, const fs::path& dir, const char* model = kModel,
                          kiln::OptimizerSpec opt = {}) {
  return kiln::load_initial_weights(spec_of(init_toml, dir), kiln::test::model_from(model), opt);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("safetensors reader refuses a header length that claims more than the file, naming the file", "[init_from]") {
  const auto d = kiln::test::temp_dir("st_claim");
  const std::string h = header_of(kiln_named());
  const auto p = raw_file(d / "lie.safetensors", h, "", 5000);  // 5000 claimed, the header is shorter and no data
  std::string msg;
  try {
    kiln::SafetensorsFile f(p);
  } catch (const kiln::DataError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains(p) && Catch::Contains("header length field says 5000 bytes") &&
                      Catch::Contains("truncated, or not a safetensors file"));
}

TEST_CASE("safetensors reader refuses a 1 GB header before reading or mapping it", "[init_from]") {
  const auto d = kiln::test::temp_dir("st_huge");
  const auto p = (d / "huge.safetensors").string();
  // A sparse file 1 GB long whose length field says 1e9: the header length alone is refused.
  {
    const uint64_t len = 1'000'000'000;
    std::string head;
    for (int k = 0; k < 8; ++k) head += static_cast<char>((len >> (8 * k)) & 0xff);
    head += "{";
    std::ofstream(p, std::ios::binary) << head;
    fs::resize_file(p, 8 + len);
  }
  std::string msg;
  try {
    kiln::SafetensorsFile f(p);
  } catch (const kiln::DataError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains(p) && Catch::Contains("1000000000 bytes, more than the 100000000") &&
                      Catch::Contains("nothing was read"));
  fs::remove(p);
}

TEST_CASE("safetensors reader refuses a truncated file, naming the tensor past the end", "[init_from]") {
  const auto d = kiln::test::temp_dir("st_trunc");
  const auto ts = kiln_named();
  std::string data;
  for (const auto& t : ts) data += t.bytes;
  const std::string h = header_of(ts);
  const auto p = raw_file(d / "cut.safetensors", h, data.substr(0, data.size() - 4), h.size());  // last 4 bytes gone
  std::string msg;
  try {
    kiln::SafetensorsFile f(p);
  } catch (const kiln::DataError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains(p) && Catch::Contains("tensor 'out.bias'") &&
                      Catch::Contains("past the end of the data (112 bytes after the header)"));
}

TEST_CASE("safetensors reader refuses overlapping data offsets, naming both tensors", "[init_from]") {
  const auto d = kiln::test::temp_dir("st_overlap");
  const std::string h =
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})";
  const auto p = raw_file(d / "overlap.safetensors", h, f32_bytes(ramp(6)), h.size());
  std::string msg;
  try {
    kiln::SafetensorsFile f(p);
  } catch (const kiln::DataError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains(p) && Catch::Contains("tensors 'a' [0, 16] and 'b' [8, 24] overlap"));
}

TEST_CASE("safetensors reader refuses a dtype and shape that disagree with the byte count", "[init_from]") {
  const auto d = kiln::test::temp_dir("st_count");
  const std::string h = R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})";
  const auto p = raw_file(d / "count.safetensors", h, f32_bytes(ramp(5)), h.size());
  std::string msg;
  try {
    kiln::SafetensorsFile f(p);
  } catch (const kiln::DataError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains(p) && Catch::Contains("tensor 'w' is F32 of shape (2, 3), 24 bytes") &&
                      Catch::Contains("data_offsets [0, 20] hold 20"));
  // Garbage instead of JSON, and an unknown dtype, are refused too.
  const std::string g = R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})";
  CHECK_THAT(error_of([&] { kiln::SafetensorsFile f(raw_file(d / "dtype.safetensors", g, "abcd", g.size())); }),
             Catch::Contains("tensor 'w' has dtype 'F33'"));
  const std::string j = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";  // a brace short
  CHECK_THAT(error_of([&] { kiln::SafetensorsFile f(raw_file(d / "json.safetensors", j, "abcd", j.size())); }),
             Catch::Contains("not a safetensors header Kiln reads"));
}

TEST_CASE("init from a file with NaN or inf names the file, the tensor and the element", "[init_from]") {
  const auto d = kiln::test::temp_dir("st_nan");
  for (const std::string dtype : {"F32", "F16", "BF16"}) {
    auto ts = kiln_named(dtype);
    const size_t at = 7 * (dtype == "F32" ? 4 : 2);  // fc1.kernel element 7: (2, 1)
    if (dtype == "F32") {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(ts[0].bytes.data() + at, &nan, 4);
    } else {
      const uint16_t nan = dtype == "F16" ? 0x7e00 : 0x7fc0;
      std::memcpy(ts[0].bytes.data() + at, &nan, 2);
    }
    st_file(d / ("nan_" + dtype + ".safetensors"), ts);
    const std::string msg = error_of([&] { load("from = \"nan_" + dtype + ".safetensors\"", d); });
    INFO(dtype);
    CHECK_THAT(msg,
               Catch::Contains((d / ("nan_" + dtype + ".safetensors")).string()) &&
                   Catch::Contains("tensor 'fc1.kernel' (" + dtype + ", shape (4, 3)) holds NaN at element 7 [2, 1]"));
  }
  auto ts = kiln_named();
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(ts[5].bytes.data() + 4, &inf, 4);
  st_file(d / "inf.safetensors", ts);
  CHECK_THAT(error_of([&] { load("from = \"inf.safetensors\"", d); }),
             Catch::Contains("tensor 'out.bias' (F32, shape (2,)) holds inf at element 1"));
}

TEST_CASE("init from safetensors converts float16, bfloat16 and float64 to float32", "[init_from]") {
  const auto d = kiln::test::temp_dir("st_dtypes");
  for (const std::string dtype : {"F32", "F16", "BF16"}) {
    st_file(d / (dtype + ".safetensors"), kiln_named(dtype));
    const auto w = load("from = \"" + dtype + ".safetensors\"", d);
    INFO(dtype);
    REQUIRE(w.tensors.size() == 6);
    const auto v = ramp(12, 0.01f, 0.1f);
    const auto& k = w.tensors.at("fc1.kernel");
    CHECK(k.shape == Shape{4, 3});
    for (size_t i = 0; i < v.size(); ++i) {
      const float want = dtype == "F32"   ? v[i]
                         : dtype == "F16" ? kiln::f16_to_float(kiln::float_to_f16(v[i]))
                                          : kiln::bf16_to_float(kiln::float_to_bf16(v[i]));
      CHECK(k.data[i] == want);
    }
    CHECK_THAT(w.summary, Catch::Contains("initialized 6 of the model's 6 parameters and buffers (29 values)") &&
                              Catch::Contains("(" + dtype + ")"));
  }
  // F64, e.g. a float64 NumPy array saved with safetensors.numpy.
  auto ts = kiln_named();
  std::vector<double> dv{0.5, -1.25, 3.0};
  ts[1] = {"fc1.bias", "F64", {3}, std::string(reinterpret_cast<const char*>(dv.data()), 24)};
  st_file(d / "f64.safetensors", ts);
  CHECK(load("from = \"f64.safetensors\"", d).tensors.at("fc1.bias").data == std::vector<float>{0.5f, -1.25f, 3.f});
}

TEST_CASE("init from a mismatched file is one error listing every missing, unexpected and misshaped name",
          "[init_from]") {
  const auto d = kiln::test::temp_dir("st_strict");
  auto ts = kiln_named();
  ts.erase(ts.begin() + 3);                                        // ln.beta missing
  ts.push_back({"extra.weight", "F32", {2}, f32_bytes(ramp(2))});  // unexpected
  ts[0] = {"fc1.kernel", "F32", {3, 4}, f32_bytes(ramp(12))};      // misshaped: (out, in)
  const auto p = st_file(d / "bad.safetensors", ts);
  std::string msg;
  try {
    load("from = \"bad.safetensors\"", d);
  } catch (const kiln::ConfigError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains(p) && Catch::Contains("does not match the model (strict = true)") &&
                      Catch::Contains("1 missing, 1 unexpected, 1 misshaped"));
  CHECK_THAT(msg, Catch::Contains("missing (the model's, not in the file): 'ln.beta' (3,)"));
  CHECK_THAT(msg, Catch::Contains("unexpected (in the file, used by no model tensor): 'extra.weight' (2,)"));
  CHECK_THAT(msg, Catch::Contains("misshaped: the model's 'fc1.kernel' is (4, 3), the file's 'fc1.kernel' is (3, 4)") &&
                      Catch::Contains("transpose = [\"fc1.kernel\"]"));
  // transpose = [...] fixes the layout; strict = false then loads the rest and lists what it left.
  const auto w = load("from = \"bad.safetensors\"\ntranspose = [\"fc1.kernel\"]\nstrict = false", d);
  CHECK(w.tensors.size() == 5);
  CHECK(!w.tensors.count("ln.beta"));
  CHECK(w.tensors.at("fc1.kernel").data[1] == ramp(12)[4]);  // kernel[0][1] = file[1][0]
  REQUIRE(w.missing.size() == 1);
  CHECK(w.missing[0] == "'ln.beta' (3,)");
  CHECK_THAT(w.summary, Catch::Contains("strict = false: 1 not in the file start as the config initializes them: "
                                        "'ln.beta' (3,)") &&
                            Catch::Contains("1 of the file's tensors are not used: 'extra.weight' (2,)"));
  // Misshaped stays an error with strict = false (as PyTorch's load_state_dict).
  CHECK_THAT(error_of([&] { load("from = \"bad.safetensors\"\nstrict = false", d); }),
             Catch::Contains("1 misshaped") && !Catch::Contains("strict = false loads"));
}

TEST_CASE("init map renames tensors with {i} patterns and transposes per entry", "[init_from]") {
  const auto d = kiln::test::temp_dir("st_map");
  const char* model = R"(
[model]
input_shape = [4]
[[model.layers]]
name = "h0_fc"
type = "dense"
units = 4
[[model.layers]]
name = "h1_fc"
type = "dense"
units = 4
use_bias = false
)";
  // nn.Linear layout (out, in): transposed by the map entry.
  st_file(d / "lin.safetensors", {{"blocks.0.lin.weight", "F32", {4, 4}, f32_bytes(ramp(16))},
                                  {"blocks.0.lin.bias", "F32", {4}, f32_bytes(ramp(4, 1.f))},
                                  {"blocks.1.lin.weight", "F32", {4, 4}, f32_bytes(ramp(16, 0.5f))}});
  const std::string init =
      "from = \"lin.safetensors\"\nmap = { \"h{i}_fc.kernel\" = { tensor = \"blocks.{i}.lin.weight\", transpose = "
      "true }, \"h{i}_fc.bias\" = \"blocks.{i}.lin.bias\" }";
  const auto w = load(init, d, model);
  REQUIRE(w.tensors.size() == 3);
  CHECK(w.tensors.at("h0_fc.kernel").data[1] == ramp(16)[4]);
  CHECK(w.tensors.at("h1_fc.kernel").data[4] == ramp(16, 0.5f)[1]);
  CHECK(w.tensors.at("h0_fc.bias").data == ramp(4, 1.f));
  // Without the map the names are missing, and each names the file tensor it looked for.
  CHECK_THAT(
      error_of([&] { load("from = \"lin.safetensors\"\nmap = { \"h{i}_fc.kernel\" = \"blocks.{i}.w\" }", d, model); }),
      Catch::Contains("'h1_fc.kernel' (4, 4) <- 'blocks.1.w' (") &&
          Catch::Contains("missing (the model's, not in the file): 'h0_fc.bias' (4,)"));
  // A file name with a placeholder the model's name lacks is a config error at the key.
  CHECK_THAT(error_of([&] { spec_of("from = \"x\"\nmap = { \"fc.kernel\" = \"blocks.{i}.w\" }", d); }),
             Catch::Contains("key 'init.map.fc.kernel'") && Catch::Contains("uses {i}"));
}

TEST_CASE("init from a Kiln checkpoint of another run loads its parameters, raw or EMA", "[init_from]") {
  const auto d = kiln::test::temp_dir("st_ckpt");
  kiln::Checkpoint c;
  c.step = 5;
  for (const auto& t : kiln_named()) {
    kiln::HostTensor h(Shape(t.shape));
    std::memcpy(h.data.data(), t.bytes.data(), t.bytes.size());
    c.tensors.emplace(t.name, h);
    c.tensors.emplace(t.name + "/adam_m", kiln::HostTensor(Shape(t.shape), 9.f));  // optimizer state: not loaded
    for (auto& v : h.data) v += 1.f;
    c.tensors.emplace(t.name + "/ema", h);
  }
  kiln::save_checkpoint((d / "other.kiln").string(), c);
  kiln::OptimizerSpec ema;
  ema.ema_decay = 0.99;  // this run keeps EMA shadows: they start as copies of the loaded weights
  const auto w = load("from = \"other.kiln\"", d, kModel, ema);
  CHECK(w.tensors.size() == 12);
  CHECK(w.tensors.at("ln.gamma").data == ramp(3, 0.01f, 1.f));
  CHECK(w.tensors.at("ln.gamma/ema").data == ramp(3, 0.01f, 1.f));
  CHECK_THAT(w.summary, Catch::Contains("a Kiln checkpoint"));
  const auto e = load("from = \"other.kiln\"\nweights = \"ema\"", d);
  CHECK(e.tensors.at("ln.gamma").data[0] == ramp(3, 0.01f, 1.f)[0] + 1.f);
  // A damaged checkpoint is refused by its checksum, naming the file.
  {
    std::fstream f(d / "other.kiln", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    f.put('\x55');
  }
  CHECK_THAT(error_of([&] { load("from = \"other.kiln\"", d); }),
             Catch::Contains((d / "other.kiln").string()) && Catch::Contains("checksum mismatch"));
}

TEST_CASE("init preset gpt2 names the layers it expects", "[init_from]") {
  const auto rules = kiln::init_preset_rules("gpt2");
  std::map<std::string, std::string> m;
  for (const auto& r : rules) m[r.kiln] = r.file;
  CHECK(m.at("h{i}_attn.qkv_kernel") == "h.{i}.attn.c_attn.weight");
  CHECK(m.at("wpe.table") == "wpe.weight");
  CHECK(m.at("ln_f.beta") == "ln_f.bias");
  CHECK(m.size() == 17);
  const auto d = kiln::test::temp_dir("st_preset");
  CHECK_THAT(error_of([&] { spec_of("from = \"x\"\npreset = \"llama\"", d); }), Catch::Contains("key 'init.preset'"));
}

TEST_CASE("samples/gpt2_small.toml has GPT-2 small's 124M parameters, each named by the gpt2 preset", "[init_from]") {
  const auto d = kiln::test::temp_dir("gpt2_sample");
  std::vector<uint16_t> ids(600);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i * 83 % 50257);
  std::ofstream(d / "tok.bin", std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), 1200);
  raw_file(d / "empty.safetensors", "{}      ", "", 8);
  const std::string stages =
      "[{type = \"tokens\", path = \"" + (d / "tok.bin").string() + "\", vocab_size = 50257, block_size = 256}]";
  auto cfg = kiln::Config::load_file(
      std::string(KILN_SOURCE_DIR) + "/samples/gpt2_small.toml",
      {"data.train.stages=" + stages, "data.test.stages=" + stages, "init.from=" + (d / "empty.safetensors").string()});
  kiln::Session s(cfg, kiln::test::registry());
  REQUIRE(s.init());
  CHECK(s.init()->preset == "gpt2");
  kiln::GraphOptions go;
  go.batch = 1;
  go.training = false;
  int64_t params = 0, tensors = 0;
  const kiln::Graph g = kiln::build_graph(s.model(), go);
  for (const auto& t : g.tensors())
    if (t.role == kiln::TensorRole::parameter) params += t.shape.numel(), ++tensors;
  // GPT2LMHeadModel's 124,439,808 less the 768 positions (x 768) beyond the context of 256.
  CHECK(params == 124439808 - 768 * 768);
  CHECK(tensors == 148);
  // Against a file with no tensors, every one of the 148 is missing, each with the preset's file name.
  s.model().label_shape = Shape{256};
  const std::string msg = error_of([&] { kiln::load_initial_weights(*s.init(), s.model(), s.optimizer()); });
  CHECK_THAT(msg, Catch::Contains("148 missing, 0 unexpected, 0 misshaped") &&
                      Catch::Contains("'h11_attn.qkv_kernel' (768, 2304) <- 'h.11.attn.c_attn.weight' (preset gpt2)") &&
                      Catch::Contains("'wpe.table' (256, 768) <- 'wpe.weight' (preset gpt2)"));
  size_t named = 0;
  for (size_t at = msg.find("(preset gpt2)"); at != std::string::npos; at = msg.find("(preset gpt2)", at + 1)) ++named;
  CHECK(named == 148);
}

TEST_CASE("init preset gpt2 takes the first positions, ignores mask buffers and checks a saved tied lm_head",
          "[init_from]") {
  const auto d = kiln::test::temp_dir("st_gpt2");
  const char* model = R"(
[model]
input_shape = [3]
[[model.layers]]
name = "wte"
type = "embedding"
vocab = 6
dim = 4
[[model.layers]]
name = "wpe"
type = "positional_embedding"
[[model.layers]]
name = "ln_f"
type = "layer_norm"
[[model.layers]]
name = "lm_head"
type = "dense"
use_bias = false
tie = "wte"
)";
  // The original GPT-2 files' names (no "transformer."), with the attention mask buffer and a saved lm_head.weight.
  auto files = [&](const std::string& prefix, float lm_head_offset) {
    return std::vector<StTensor>{{prefix + "wte.weight", "F32", {6, 4}, f32_bytes(ramp(24))},
                                 {prefix + "wpe.weight", "F32", {8, 4}, f32_bytes(ramp(32, 0.1f))},
                                 {prefix + "ln_f.weight", "F32", {4}, f32_bytes(ramp(4, 0.5f, 1.f))},
                                 {prefix + "ln_f.bias", "F32", {4}, f32_bytes(ramp(4, 0.2f))},
                                 {prefix + "h.0.attn.bias", "F32", {1, 1, 8, 8}, f32_bytes(ramp(64))},
                                 {"lm_head.weight", "F32", {6, 4}, f32_bytes(ramp(24, 0.01f, lm_head_offset))}};
  };
  for (const std::string prefix : {"", "transformer."}) {
    st_file(d / "gpt2.safetensors", files(prefix, 0.f));
    const auto w = load("from = \"gpt2.safetensors\"\npreset = \"gpt2\"", d, model);
    INFO(prefix);
    CHECK(w.tensors.size() == 4);
    CHECK(w.tensors.at("wpe.table").shape == Shape{3, 4});
    const auto pos = ramp(32, 0.1f);
    CHECK(w.tensors.at("wpe.table").data == std::vector<float>(pos.begin(), pos.begin() + 12));
    CHECK(w.tensors.at("ln_f.gamma").data == ramp(4, 0.5f, 1.f));
  }
  // An lm_head.weight that is not wte.weight is a file this tied model cannot represent.
  st_file(d / "untied.safetensors", files("", 1.f));
  CHECK_THAT(error_of([&] { load("from = \"untied.safetensors\"\npreset = \"gpt2\"", d, model); }),
             Catch::Contains("unexpected (in the file, used by no model tensor): 'lm_head.weight' (6, 4)"));
}

TEST_CASE("init loads buffers too: batch norm's running statistics", "[init_from]") {
  const auto d = kiln::test::temp_dir("st_bn");
  const char* model = R"(
[model]
input_shape = [4]
[[model.layers]]
name = "fc"
type = "dense"
units = 3
[[model.layers]]
name = "bn"
type = "batch_norm"
[[model.layers]]
name = "out"
type = "dense"
units = 2
)";
  std::vector<StTensor> ts{{"fc.kernel", "F32", {4, 3}, f32_bytes(ramp(12))},
                           {"fc.bias", "F32", {3}, f32_bytes(ramp(3))},
                           {"bn.gamma", "F32", {3}, f32_bytes(ramp(3, 0.1f, 1.f))},
                           {"bn.beta", "F32", {3}, f32_bytes(ramp(3, 0.1f))},
                           {"bn.running_mean", "F32", {3}, f32_bytes({0.5f, -0.5f, 0.25f})},
                           {"bn.running_var", "F32", {3}, f32_bytes({2.f, 3.f, 4.f})},
                           {"out.kernel", "F32", {3, 2}, f32_bytes(ramp(6))},
                           {"out.bias", "F32", {2}, f32_bytes(ramp(2))}};
  st_file(d / "bn.safetensors", ts);
  const auto w = load("from = \"bn.safetensors\"", d, model);
  CHECK(w.tensors.size() == 8);
  CHECK(w.tensors.at("bn.running_var").data == std::vector<float>{2.f, 3.f, 4.f});
  CHECK(w.tensors.at("bn.running_mean").data == std::vector<float>{0.5f, -0.5f, 0.25f});
  // Without them the file is refused, naming the buffers.
  ts.erase(ts.begin() + 4, ts.begin() + 6);
  st_file(d / "nobuf.safetensors", ts);
  CHECK_THAT(error_of([&] { load("from = \"nobuf.safetensors\"", d, model); }),
             Catch::Contains("'bn.running_mean' (3,)") && Catch::Contains("'bn.running_var' (3,)") &&
                 Catch::Contains("2 missing"));
}
