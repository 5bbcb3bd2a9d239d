// [log] tensorboard: the event files carry the same scalars as metrics.jsonl. Read back here with an independent
// TFRecord/CRC-32C/protobuf decoder, and with TensorBoard's own reader (EventAccumulator) when the tools venv has it.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "test_support.hpp"

namespace {

const std::string kFm = "/usr/share/datasets/fashion-mnist/";

std::string config(const std::string& out) {
  return R"([run]
name = "tb"
seed = 5
[model]
input_shape = [1, 28, 28]
loss = "softmax_cross_entropy"
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 32
activation = "relu"
[[model.layers]]
type = "dense"
units = 10
[optimizer]
type = "adam"
learning_rate = 2e-3
clip_norm = 5.0
[train]
epochs = 2
batch_size = 32
progress = "none"
output_dir = ")" +
         out + R"("
[log]
every_steps = 4
tensorboard = true
[data.train]
stages = [{type = "idx", images = ")" +
         kFm + R"(train-images-idx3-ubyte.gz", labels = ")" + kFm +
         R"(train-labels-idx1-ubyte.gz", limit = 640}, {type = "scale", factor = 0.00392156862745098}, {type = "batch"}]
[data.test]
stages = [{type = "idx", images = ")" +
         kFm + R"(t10k-images-idx3-ubyte.gz", labels = ")" + kFm +
         R"(t10k-labels-idx1-ubyte.gz", limit = 320}, {type = "scale", factor = 0.00392156862745098}, {type = "batch"}]
)";
}

// CRC-32C bit by bit (not the table Kiln uses), masked as TFRecord stores it.
uint32_t masked_crc(const char* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= static_cast<uint8_t>(p[i]);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
  }
  c ^= 0xffffffffu;
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

struct Reader {
  const std::string& b;
  size_t pos, end;
  uint64_t varint() {
    uint64_t v = 0;
    for (int s = 0; pos < end; s += 7) {
      const uint8_t c = static_cast<uint8_t>(b[pos++]);
      v |= uint64_t{c & 0x7fu} << s;
      if (!(c & 0x80)) return v;
    }
    FAIL("varint runs past the message");
    return v;
  }
};

// (step, tag) -> value from every Summary of every Event of the file.
std::map<std::pair<int64_t, std::string>, double> read_events(const std::string& path, int& records) {
  std::ifstream f(path, std::ios::binary);
  const std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::map<std::pair<int64_t, std::string>, double> out;
  size_t pos = 0;
  records = 0;
  while (pos < b.size()) {
    REQUIRE(b.size() - pos >= 16);
    uint64_t len;
    uint32_t lc, dc;
    std::memcpy(&len, b.data() + pos, 8);
    std::memcpy(&lc, b.data() + pos + 8, 4);
    REQUIRE(lc == masked_crc(b.data() + pos, 8));
    REQUIRE(len <= b.size() - pos - 16);
    std::memcpy(&dc, b.data() + pos + 12 + len, 4);
    REQUIRE(dc == masked_crc(b.data() + pos + 12, len));
    ++records;
    Reader ev{b, pos + 12, pos + 12 + len};
    int64_t step = 0;
    while (ev.pos < ev.end) {
      const uint64_t key = ev.varint();
      const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
      if (wire == 1)
        ev.pos += 8;
      else if (wire == 0) {
        const uint64_t v = ev.varint();
        if (field == 2) step = static_cast<int64_t>(v);
      } else if (wire == 2) {
        const size_t l = ev.varint(), start = ev.pos;
        ev.pos += l;
        if (field != 5) continue;
        Reader sum{b, start, start + l};  // Summary: repeated Value value = 1
        while (sum.pos < sum.end) {
          REQUIRE(sum.varint() == (1u << 3 | 2u));
          const size_t vl = sum.varint(), vs = sum.pos;
          sum.pos += vl;
          Reader val{b, vs, vs + vl};
          std::string tag;
          float x = NAN;
          while (val.pos < val.end) {
            const uint64_t k = val.varint();
            if (k == (1u << 3 | 2u)) {
              const size_t tl = val.varint();
              tag = b.substr(val.pos, tl);
              val.pos += tl;
            } else {
              REQUIRE(k == (2u << 3 | 5u));  // simple_value, fixed32
              std::memcpy(&x, b.data() + val.pos, 4);
              val.pos += 4;
            }
          }
          out[{step, tag}] = x;
        }
      } else {
        FAIL("unexpected wire type " << wire);
      }
    }
    pos += 12 + len + 4;
  }
  return out;
}

std::string event_file(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) return e.path().string();
  return {};
}

double field(const std::string& line, const std::string& key) {
  std::smatch m;
  REQUIRE(std::regex_search(line, m, std::regex("\"" + key + "\":([-0-9.eE+]+)")));
  return std::stod(m[1]);
}

}  // namespace

TEST_CASE("[log] tensorboard event files hold metrics.jsonl's scalars with valid TFRecord CRCs",
          "[e2e][log][tensorboard]") {
  auto dir = kiln::test::temp_dir("tb");
  auto cfg = dir / "run.toml";
  std::ofstream(cfg) << config((dir / "out").string());
  auto r = kiln::test::run_app("train " + cfg.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string ev = event_file(dir / "out");
  REQUIRE(!ev.empty());
  int records = 0;
  auto scalars = read_events(ev, records);
  // file_version + 2 epochs x (5 step records: 20 steps per epoch, every 4) + 2 epoch records.
  CHECK(records == 1 + 10 + 2);
  std::ifstream m((dir / "out" / "metrics.jsonl").string());
  int checked = 0;
  for (std::string l; std::getline(m, l);) {
    const auto step = static_cast<int64_t>(field(l, "step"));
    if (l.find("\"event\":\"step\"") != std::string::npos) {
      for (const char* k : {"loss", "learning_rate", "grad_norm"}) {
        CAPTURE(l, k);
        REQUIRE(scalars.count({step, k}));
        CHECK(scalars[{step, k}] == Approx(field(l, k)).epsilon(1e-6));
        ++checked;
      }
    } else {
      for (const char* k : {"train_loss", "test_loss", "test_accuracy"}) {
        CAPTURE(l, k);
        REQUIRE(scalars.count({step, k}));
        CHECK(scalars[{step, k}] == Approx(field(l, k)).epsilon(1e-6));
        ++checked;
      }
    }
  }
  CHECK(checked == 10 * 3 + 2 * 3);
}

TEST_CASE("TensorBoard's own reader (EventAccumulator) returns metrics.jsonl's scalars", "[e2e][log][tensorboard]") {
  const std::string py = std::string(KILN_SOURCE_DIR) + "/.venv-tools/bin/python";
  if (!std::filesystem::exists(py) || std::system((py + " -c 'import tensorboard' 2>/dev/null").c_str()) != 0)
    KILN_SKIP("TensorBoard's reader is not installed (./setup.sh test installs it into .venv-tools)");
  auto dir = kiln::test::temp_dir("tb-reader");
  auto cfg = dir / "run.toml";
  std::ofstream(cfg) << config((dir / "out").string());
  auto r = kiln::test::run_app("train " + cfg.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string script = std::string(KILN_SOURCE_DIR) + "/tests/integration/check_tensorboard.py";
  std::string out;
  FILE* p = ::popen((py + " " + script + " " + (dir / "out").string() + " 2>&1").c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  INFO(out);
  CHECK(status == 0);
  CHECK_THAT(out, Catch::Contains("36 scalars agree"));
}
