// The data plugin: registers Kiln's data-loader stages (sources, map/scale, shuffle, batch, cache, prefetch).
#include "kiln/plugin.hpp"

#include "stages.hpp"

namespace kiln::data {

void require_source(const ConfigNode& cfg, const StageContext& ctx, const char* type) {
  if (ctx.upstream)
    cfg.fail("type", std::string("'") + type + "' is a source and must be the first of the stages (it follows '" +
                         ctx.upstream->name() + "')");
}

void require_upstream(const ConfigNode& cfg, const StageContext& ctx, const char* type) {
  if (!ctx.upstream)
    cfg.fail("type", std::string("'") + type +
                         "' transforms the elements of the stage before it and cannot be first; start the stages "
                         "with a source (idx, cifar10, csv, synthetic, text, tokens)");
}

namespace {

const PluginDescriptor* descriptor() {
  static const PluginDescriptor d{
      "data", KILN_VERSION_STRING, kApiVersion, KILN_BUILD_FINGERPRINT,
      "data-loader stages: idx, cifar10, csv, synthetic, text, tokens, map, scale, shuffle, "
      "batch, cache, prefetch"};
  return &d;
}

void register_all(Registry& reg) {
  reg.add_stage("idx", make_idx);
  reg.add_stage("cifar10", make_cifar10);
  reg.add_stage("csv", make_csv);
  reg.add_stage("synthetic", make_synthetic);
  reg.add_stage("text", make_text);
  reg.add_stage("tokens", make_tokens);
  reg.add_stage("map", make_map);
  reg.add_stage("scale", make_scale);
  reg.add_stage("shuffle", make_shuffle);
  reg.add_stage("batch", make_batch);
  reg.add_stage("cache", make_cache);
  reg.add_stage("prefetch", make_prefetch);
}

}  // namespace
}  // namespace kiln::data

KILN_PLUGIN(kiln::data::descriptor, kiln::data::register_all)
