// The "model_parallel" strategy: [strategy] keys, and the checks that refuse a placement before any step.
#include "device_list.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/model.hpp"
#include "model_parallel.hpp"

namespace kiln::parallel {

namespace {

class ModelParallelStrategy final : public Strategy {
 public:
  ModelParallelStrategy(const ConfigNode& c, const Registry* reg) {
    o_.where = c.where();
    o_.where_devices = c.has("devices") ? c.where("devices") : c.where();
    o_.devices = parse_device_list(c, "devices");
    o_.auto_place = c.get_choice("placement", {"layers", "auto"}, "layers") == "auto";
    int64_t m = c.get_int("micro_batches", 1);
    if (m < 1 || m > 4096)
      c.fail("micro_batches", "expected 1 (no pipeline) or more micro-batches per step, found " + std::to_string(m));
    o_.micro_batches = static_cast<int>(m);
    o_.concurrent = c.get_bool("concurrent", true);
    auto limit = c.get_size_text("memory_limit", "");
    if (!limit.empty()) {
      try {
        parse_memory_size(limit, size_t{1} << 40);
      } catch (const ConfigError& e) {
        c.fail("memory_limit", e.what());
      }
    }
    extra_ = std::make_shared<ExtraDevices>(reg, limit, o_.where_devices);
    c.finish();
  }

  std::string name() const override { return "model_parallel"; }
  int device_count(int visible) const override { return devices_to_open(o_.devices, visible); }

  std::vector<DevicePlan> plan(const RunnerContext& host_ctx) const override {
    const RunnerContext ctx = with_extra(host_ctx);
    return plan_model_parallel(ctx, resolve_placement(o_, ctx), true);
  }

  std::unique_ptr<Runner> create(const RunnerContext& host_ctx) override {
    const RunnerContext ctx = with_extra(host_ctx);
    Placement p = resolve_placement(o_, ctx);
    auto plans = plan_model_parallel(ctx, p, false);
    std::string over;
    for (size_t s = 0; s < plans.size(); ++s) {
      size_t limit = ctx.devices.at(static_cast<size_t>(p.open_index[s])).allocator->limit();
      if (plans[s].total() > limit) {
        std::string layers;
        for (size_t l = 0; l < ctx.model->layers.size(); ++l)
          if (p.layer_slot[l] == static_cast<int>(s))
            layers += (layers.empty() ? "" : ", ") + ctx.model->layers[l].name;
        over += "\n  " + plans[s].device + ": planned peak " + format_bytes(plans[s].total()) + " > limit " +
                format_bytes(limit) + " (parameters " + format_bytes(plans[s].parameters) + ", optimizer state " +
                format_bytes(plans[s].optimizer_state) + ", gradients " + format_bytes(plans[s].gradients) +
                ", activations " + format_bytes(plans[s].activations) +
                "; layers: " + (layers.empty() ? "none" : layers) + ")";
      }
    }
    if (!over.empty())
      throw ConfigError(
          o_.where + ": the model-parallel placement does not fit; nothing was allocated:" + over +
          "\nMove layers to other devices (each layer's device key), use placement = \"auto\", or raise [device] "
          "memory_limit.");
    return make_model_parallel_runner(o_, ctx, std::move(p), extra_);
  }

 private:
  // The devices the strategy and the layers name, with those of backends the host did not open added.
  RunnerContext with_extra(const RunnerContext& ctx) const {
    auto entries = o_.devices;
    for (const auto& l : ctx.model->layers)
      if (!l.device.empty()) entries.push_back(parse_device_entry(l.device));
    return extra_->extend(ctx, entries);
  }

  ModelParallelOptions o_;
  std::shared_ptr<ExtraDevices> extra_;
};

}  // namespace

void register_model_parallel(Registry& reg) {
  const Registry* r = &reg;
  reg.add_strategy("model_parallel", [r](const ConfigNode& c) -> std::unique_ptr<Strategy> {
    return std::make_unique<ModelParallelStrategy>(c, r);
  });
}

}  // namespace kiln::parallel
