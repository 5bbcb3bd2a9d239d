// test_package's plugin: one layer, `conan_dense` (y = x W + b), built against the packaged SDK headers only.
#include <kiln/config.hpp>
#include <kiln/error.hpp>
#include <kiln/plugin.hpp>

namespace conan_check {

using namespace kiln;

class ConanDense : public Layer {
 public:
  explicit ConanDense(const ConfigNode& c) : units_(c.get_int("units")) {
    if (units_ < 1) c.fail("units", "must be >= 1, got " + std::to_string(units_));
    c.finish();
  }
  std::string type() const override { return "conan_dense"; }
  // x: (N, F) -> y: (N, units)
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape s = g.shape(in[0]);
    if (s.rank() != 2)
      throw ConfigError("layer '" + g.layer() + "': conan_dense expects (batch, features), got " + s.str());
    const int64_t n = s[0], f = s[1];
    const Shape out{n, units_};
    TensorId w = g.param("kernel", {f, units_}, Init{InitKind::glorot_uniform, f, units_});
    TensorId b = g.param("bias", {units_}, Init{});
    TensorId h = g.op1(OpKind::Gemm, GemmAttrs{n, units_, f}, {in[0], w}, out);
    return g.op1(OpKind::BiasAdd, BiasAttrs{n, units_, 1}, {h, b}, out);
  }

 private:
  int64_t units_;
};

const PluginDescriptor* descriptor() {
  static const PluginDescriptor d{"conan_check", "1.0.0", kApiVersion, KILN_BUILD_FINGERPRINT,
                                  "Conan test_package plugin: a conan_dense layer"};
  return &d;
}

void register_all(Registry& reg) {
  reg.add_layer("conan_dense",
                [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<ConanDense>(c); });
}

}  // namespace conan_check

KILN_PLUGIN(conan_check::descriptor, conan_check::register_all)
