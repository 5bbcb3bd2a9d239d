// A trained model for evaluate / predict / export: config + checkpoint, checked against each other.
#include "model_io.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>

#include "kiln/error.hpp"
#include "kiln/files.hpp"
#include "kiln/graph.hpp"
#include "kiln/memory_report.hpp"

namespace kiln::app {

namespace fs = std::filesystem;

std::unique_ptr<TrainedModel> load_trained_model(const Options& o) {
  auto m = std::make_unique<TrainedModel>();
  m->reg = Registry::with_builtins();
  load_plugins(o, m->loader, m->reg, o.config);
  m->cfg = std::make_unique<Config>(Config::load_file(o.config, o.overrides));
  m->session = std::make_unique<Session>(*m->cfg, m->reg);
  Session& s = *m->session;

  m->checkpoint_path = o.checkpoint.empty() ? s.train().output_dir + "/checkpoint.kiln" : o.checkpoint;
  std::error_code ec;
  if (!fs::exists(m->checkpoint_path, ec))
    throw DataError(m->checkpoint_path + ": no checkpoint there" +
                    (o.checkpoint.empty() ? " (the run's [train] output_dir; train it first with `kiln train " +
                                                o.config + "`, or pass --checkpoint FILE)"
                                          : std::string(" (--checkpoint)")));
  m->checkpoint = load_checkpoint(m->checkpoint_path);  // DataError for a damaged file

  if (o.weights == "ema")
    m->ema = true;
  else if (o.weights == "auto")
    m->ema = s.optimizer().ema_decay > 0;
  const auto& ck = m->checkpoint.tensors;

  // The model's parameters, in model order, from a forward graph of one example (nothing is allocated).
  GraphOptions go;
  go.batch = 1;
  go.training = false;
  Graph g = build_graph(s.model(), go);
  // Buffers (batch norm's running statistics) are part of the model too: evaluation reads them. They have no EMA.
  std::set<std::string> buffers;
  for (const auto& t : g.tensors()) {
    if (t.role == TensorRole::parameter || t.role == TensorRole::buffer) m->params.emplace_back(t.name, t.shape);
    if (t.role == TensorRole::buffer) buffers.insert(t.name);
  }
  const std::string where = m->checkpoint_path + " (the model of " + o.config + ")";
  for (const auto& [name, shape] : m->params) {
    const std::string key = m->ema && !buffers.count(name) ? name + "/ema" : name;
    auto it = ck.find(key);
    if (it == ck.end()) {
      if (m->ema && ck.count(name))
        throw DataError(m->checkpoint_path + ": holds no EMA weights ('" + key +
                        "'); the run kept none ([optimizer] ema " + "was not set when it trained): use --weights raw");
      throw DataError(where + ": the model's parameter '" + key + "' " + shape.str() +
                      " is not in the checkpoint: it was written by another model");
    }
    if (it->second.shape != shape)
      throw DataError(where + ": tensor '" + key + "' has shape " + it->second.shape.str() +
                      " in the checkpoint, but the model's is " + shape.str() +
                      ": the checkpoint was written by another model (or the config changed)");
    m->weights.emplace(name, it->second);
  }
  // A tensor the model has no parameter for (optimizer state and EMA belong to a parameter) means another model.
  for (const auto& [key, t] : ck) {
    const std::string base = key.substr(0, key.find('/'));
    bool known = false;
    for (const auto& p : m->params) known = known || p.first == base;
    if (!known)
      throw DataError(where + ": the checkpoint holds tensor '" + key + "' " + t.shape.str() +
                      ", which the model has no parameter for: it was written by another model");
  }
  return m;
}

void append_prediction_columns(const ModelSpec& model, size_t h, const HostTensor& out, int64_t batch,
                               std::vector<std::vector<float>>& cols, std::vector<std::string>* names) {
  const OutputSpec& head = model.outputs[h];
  const int64_t k = out.shape.numel() / batch;
  const bool softmax = head.loss == LossKind::softmax_cross_entropy;
  const int64_t cls = softmax && out.shape.rank() > 2 ? out.shape[out.shape.rank() - 1] : k;
  if (names)
    for (int64_t j = 0; j < k; ++j) {
      // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "p" + std::to_string(...).
      std::string name = model.outputs.size() > 1 ? head.layer + "." : std::string();
      if (cls < k) name.append("p").append(std::to_string(j / cls)).append(".");
      names->push_back(name.append(softmax ? "class_" : "out_").append(std::to_string(j % cls)));
    }
  for (int64_t i = 0; i < batch; ++i) {
    const float* zi = out.data.data() + i * k;
    auto& row = cols[static_cast<size_t>(i)];
    if (softmax) {
      for (int64_t at = 0; at < k; at += cls) {
        const float* z = zi + at;
        float mx = z[0];
        for (int64_t j = 1; j < cls; ++j) mx = std::max(mx, z[j]);
        double sum = 0;
        std::vector<double> e(static_cast<size_t>(cls));
        for (int64_t j = 0; j < cls; ++j) sum += e[static_cast<size_t>(j)] = std::exp(static_cast<double>(z[j] - mx));
        for (int64_t j = 0; j < cls; ++j) row.push_back(static_cast<float>(e[static_cast<size_t>(j)] / sum));
      }
    } else if (head.loss == LossKind::binary_cross_entropy && head.from_logits) {
      for (int64_t j = 0; j < k; ++j)
        row.push_back(static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(zi[j])))));
    } else {
      row.insert(row.end(), zi, zi + k);
    }
  }
}

std::unique_ptr<Runner> make_inference_runner(TrainedModel& m, const Shape& label_shape) {
  Session& s = *m.session;
  s.model().label_shape = label_shape;
  s.open_devices();
  if (s.train().memory_policy != "none") {
    std::ostringstream quiet;  // a plan that does not fit still refuses, with its report
    enforce_memory_plan(s, quiet);
  }
  auto runner = s.strategy().create(s.runner_context());
  runner->load_state(m.weights);
  return runner;
}

void check_new_output(const Options& o, const std::string& option) {
  // What the command reads: the config, --checkpoint, --input (the default checkpoint is a file of the run directory,
  // which check_output_file refuses by itself).
  std::vector<std::pair<std::string, std::string>> inputs{{o.config, "the config file"}};
  if (!o.checkpoint.empty()) inputs.emplace_back(o.checkpoint, "--checkpoint");
  if (!o.input.empty()) inputs.emplace_back(o.input, "--input");
  check_output_file(o.output, option, o.overwrite, inputs);
}

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\')
      out += '\\', out += static_cast<char>(c);
    else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else
      out += static_cast<char>(c);
  }
  return out + "\"";
}

std::string json_double(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os << std::setprecision(8) << v;  // as metrics.jsonl writes them
  return os.str();
}

void write_file_atomic(const std::string& path, const std::string& text) { write_file_atomically(path, text); }

void write_npy(const std::string& path, const std::vector<float>& data, const std::vector<int64_t>& shape) {
  std::string dims;  // NumPy's spelling: "(n,)" for one dim, "(n, k)" otherwise
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) dims += ", ";
    dims += std::to_string(shape[i]);
  }
  if (shape.size() == 1) dims += ',';
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces and a newline to a multiple of 64.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float));  // x86-64: little-endian
  write_file_atomic(path, out);
}

HostTensor read_npy(const std::string& path) {
  require_regular_file(path, "a .npy file (--input)");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw DataError(path + ": cannot open --input");
  std::string buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) { return DataError(path + ": not a .npy array Kiln reads (" + why + ")"); };
  if (buf.size() < 10 || buf.compare(0, 6, "\x93NUMPY") != 0) throw bad("no NumPy magic at offset 0");
  const int major = static_cast<unsigned char>(buf[6]);
  size_t hlen = 0, hstart = 0;
  if (major == 1) {
    hlen = static_cast<unsigned char>(buf[8]) | static_cast<size_t>(static_cast<unsigned char>(buf[9])) << 8;
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (buf.size() < 12) throw bad("truncated header");
    for (int i = 0; i < 4; ++i) hlen |= static_cast<size_t>(static_cast<unsigned char>(buf[8 + i])) << (8 * i);
    hstart = 12;
  } else {
    throw bad("format version " + std::to_string(major));
  }
  if (hlen > buf.size() - hstart) throw bad("truncated header");
  const std::string h = buf.substr(hstart, hlen);
  auto value_of = [&](const std::string& key) {
    auto k = h.find("'" + key + "'");
    if (k == std::string::npos) throw bad("no '" + key + "' in the header");
    auto c = h.find(':', k);
    auto v = h.find_first_not_of(' ', c + 1);
    return h.substr(v);
  };
  const std::string descr = value_of("descr");
  int kind = -1;  // 0 f4, 1 f8, 2 u1
  if (descr.rfind("'<f4'", 0) == 0)
    kind = 0;
  else if (descr.rfind("'<f8'", 0) == 0)
    kind = 1;
  else if (descr.rfind("'|u1'", 0) == 0)
    kind = 2;
  else
    throw bad("dtype " + descr.substr(0, descr.find(',')) + "; expected float32 '<f4', float64 '<f8' or uint8 '|u1'");
  if (value_of("fortran_order").rfind("False", 0) != 0) throw bad("Fortran order; save a C-order array");
  std::string sh = value_of("shape");
  if (sh.empty() || sh[0] != '(' || sh.find(')') == std::string::npos) throw bad("shape");
  sh = sh.substr(1, sh.find(')') - 1);
  std::vector<int64_t> dims;
  std::stringstream ss(sh);
  for (std::string tok; std::getline(ss, tok, ',');) {
    if (tok.find_first_not_of(' ') == std::string::npos) continue;
    try {
      dims.push_back(std::stoll(tok));
    } catch (const std::exception&) {
      throw bad("shape (" + sh + ")");
    }
  }
  const Shape shape(dims);
  if (!shape.fits()) throw bad("shape (" + sh + ") too large");
  const size_t n = static_cast<size_t>(shape.numel()), esize = kind == 0 ? 4 : kind == 1 ? 8 : 1;
  const size_t start = hstart + hlen;
  if (buf.size() - start != n * esize)
    throw bad("shape (" + sh + ") needs " + std::to_string(n * esize) + " data bytes, the file has " +
              std::to_string(buf.size() - start));
  HostTensor t(shape);
  const char* p = buf.data() + start;
  for (size_t i = 0; i < n; ++i) {
    if (kind == 0)
      std::memcpy(&t.data[i], p + 4 * i, 4);
    else if (kind == 1) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      t.data[i] = static_cast<float>(d);
    } else
      t.data[i] = static_cast<unsigned char>(p[i]);
  }
  return t;
}

}  // namespace kiln::app
