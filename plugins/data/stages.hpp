// Factories of the data plugin's stages, registered by plugin.cpp. Each reads its own TOML table (the host
// has consumed "type"), validates it against the upstream and calls cfg.finish().
#pragma once
#include <memory>

#include "kiln/config.hpp"
#include "kiln/data.hpp"

namespace kiln::data {

// Sources (ctx.upstream must be null).
std::unique_ptr<Stage> make_idx(const ConfigNode& cfg, StageContext ctx);
std::unique_ptr<Stage> make_cifar10(const ConfigNode& cfg, StageContext ctx);
std::unique_ptr<Stage> make_csv(const ConfigNode& cfg, StageContext ctx);
std::unique_ptr<Stage> make_synthetic(const ConfigNode& cfg, StageContext ctx);
std::unique_ptr<Stage> make_text(const ConfigNode& cfg, StageContext ctx);    // text_source.cpp
std::unique_ptr<Stage> make_tokens(const ConfigNode& cfg, StageContext ctx);  // text_source.cpp

// Transforming stages (ctx.upstream required).
std::unique_ptr<Stage> make_map(const ConfigNode& cfg, StageContext ctx);
std::unique_ptr<Stage> make_scale(const ConfigNode& cfg, StageContext ctx);
std::unique_ptr<Stage> make_shuffle(const ConfigNode& cfg, StageContext ctx);
std::unique_ptr<Stage> make_batch(const ConfigNode& cfg, StageContext ctx);
std::unique_ptr<Stage> make_cache(const ConfigNode& cfg, StageContext ctx);
std::unique_ptr<Stage> make_prefetch(const ConfigNode& cfg, StageContext ctx);

// Config checks shared by the factories: a ConfigError naming the key when violated.
void require_source(const ConfigNode& cfg, const StageContext& ctx, const char* type);
void require_upstream(const ConfigNode& cfg, const StageContext& ctx, const char* type);

}  // namespace kiln::data
