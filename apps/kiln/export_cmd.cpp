// kiln export CONFIG --format safetensors|onnx --output FILE: a checkpoint's weights for other tools.
// safetensors: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__"},
// then the tensors' bytes; names and layouts are Kiln's (docs/user_guide.md, "kiln export").
#include <iostream>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/half.hpp"
#include "model_io.hpp"

namespace kiln::app {

namespace {

// `type`: F32 as the checkpoint holds the weights, or BF16/F16 rounded to nearest even (what torch's .to() gives).
std::string safetensors(const TrainedModel& m, DType type) {
  const char* tag = type == DType::bf16 ? "BF16" : type == DType::f16 ? "F16" : "F32";
  std::string header = "{\"__metadata__\":{\"format\":\"kiln\",\"kiln_version\":" + json_str(KILN_VERSION_STRING) +
                       ",\"checkpoint\":" + json_str(m.checkpoint_path) + ",\"epoch\":\"" +
                       std::to_string(m.checkpoint.epoch) + "\",\"step\":\"" + std::to_string(m.checkpoint.step) +
                       "\",\"weights\":\"" + (m.ema ? "ema" : "raw") +
                       "\",\"layout\":\"dense kernel (in, out); conv2d kernel (out, in, kh, kw)\"}";
  size_t offset = 0;
  for (const auto& [name, shape] : m.params) {  // model order; the data follows in the same order
    header += ',';
    header += json_str(name);
    header += ":{\"dtype\":\"" + std::string(tag) + "\",\"shape\":[";
    for (size_t i = 0; i < shape.rank(); ++i) {
      if (i) header += ',';
      header += std::to_string(shape[i]);
    }
    const size_t bytes = m.weights.at(name).data.size() * dtype_size(type);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned (spaces are allowed JSON padding)
  std::string out;
  const uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  out += header;
  for (const auto& [name, shape] : m.params) {
    const HostTensor& t = m.weights.at(name);
    if (type == DType::f32) {
      out.append(reinterpret_cast<const char*>(t.data.data()), t.bytes());  // x86-64: little-endian float32
      continue;
    }
    std::vector<uint16_t> h(t.data.size());
    from_float(t.data.data(), h.data(), type, h.size());
    out.append(reinterpret_cast<const char*>(h.data()), h.size() * 2);
  }
  return out;
}

}  // namespace

int cmd_export(const Options& o) {
  check_new_output(o, "--output");
  auto m = load_trained_model(o);
  std::string bytes;
  const DType type = o.dtype == "bfloat16" ? DType::bf16 : o.dtype == "float16" ? DType::f16 : DType::f32;
  if (type != DType::f32 && o.format != "safetensors")
    throw ConfigError("--dtype " + o.dtype + " applies to --format safetensors; the ONNX export is float32");
  if (o.format == "safetensors")
    bytes = safetensors(*m, type);
  else if (o.format == "onnx")
    bytes = onnx_model(*m);
  else
    throw ConfigError("--format " + o.format + ": expected safetensors or onnx");
  write_file_atomic(o.output, bytes);
  size_t values = 0;
  for (const auto& [name, t] : m->weights) values += t.data.size();
  std::cout << "exported " << m->params.size() << " tensors (" << values << " values, " << (m->ema ? "ema" : "raw")
            << " weights) of " << m->checkpoint_path << " (epoch " << m->checkpoint.epoch << ", step "
            << m->checkpoint.step << ") as " << o.format << (type == DType::f32 ? "" : " " + o.dtype) << " to "
            << o.output << "\n";
  return 0;
}

}  // namespace kiln::app
