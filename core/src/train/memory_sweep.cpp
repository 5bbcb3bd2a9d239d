// `kiln plan --sweep`: peak memory against batch size, predicted by the planner and measured by running one real
// training step per batch size and reading the allocator's peak (the plot people draw by hand with nvidia-smi).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>

#include "kiln/error.hpp"
#include "kiln/memory_report.hpp"
#include "kiln/session.hpp"

namespace kiln {

namespace {

// A batch of zeros shaped like the model's input and labels (class 0 / target 0: a finite loss).
Element zero_batch(const ModelSpec& m, const OptimizerSpec* opt, int64_t batch) {
  GraphOptions o;
  o.batch = batch;
  o.training = false;
  o.optimizer = opt;
  Graph g = build_graph(m, o);
  Element e;
  e.batch = batch;
  e.x = HostTensor(g.tensor(g.input).shape, 0.5f);
  e.y = HostTensor(g.tensor(g.label).shape, 0.f);
  return e;
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s)
    o += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : c == '"' ? "&quot;" : std::string(1, c);
  return o;
}

std::string mib(size_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(b) / (1 << 20));
  return buf;
}

}  // namespace

std::vector<int64_t> default_sweep_batches(int64_t largest_fit, int64_t unit) {
  std::vector<int64_t> b;
  unit = std::max<int64_t>(unit, 1);
  for (int64_t x = unit; x <= std::max<int64_t>(largest_fit, unit); x *= 2) b.push_back(x);
  if (largest_fit > 0 && b.back() != largest_fit) b.push_back(largest_fit);
  b.push_back(std::max<int64_t>(2 * std::max<int64_t>(largest_fit, 1), b.back() + 1));  // one point past the limit
  return b;
}

std::vector<SweepPoint> memory_sweep(Session& s, const std::vector<int64_t>& batches, bool measure,
                                     std::ostream* progress) {
  RunnerContext base = s.runner_context();
  if (base.devices.empty()) throw Error("memory_sweep: the session's devices are not open");
  std::vector<SweepPoint> out;
  for (int64_t b : batches) {
    SweepPoint p;
    p.batch = b;
    RunnerContext ctx = base;
    ctx.global_batch = b;
    auto plans = s.strategy().plan(ctx);
    p.fits = true;
    for (size_t i = 0; i < plans.size(); ++i) {
      size_t di = std::min(i, base.devices.size() - 1);
      for (size_t d = 0; d < base.devices.size(); ++d)
        if (base.devices[d].device->info().label() == plans[i].device) di = d;
      size_t limit = base.devices[di].allocator->limit();
      p.predicted = std::max(p.predicted, plans[i].total());
      p.limit = p.limit ? std::min(p.limit, limit) : limit;
      p.fits = p.fits && plans[i].total() <= limit;
    }
    if (measure && p.fits) {
      // A clean device per batch size: blocks of the previous size go back, this size's plan is taken as one block.
      for (auto& d : base.devices) d.allocator->release_free_blocks();
      for (size_t i = 0; i < plans.size(); ++i)
        for (auto& d : base.devices)
          if (d.device->info().label() == plans[i].device) d.allocator->reserve(plans[i].total());
      for (auto& d : base.devices) d.allocator->reset_peak();
      auto t0 = std::chrono::steady_clock::now();
      {
        auto runner = s.strategy().create(ctx);
        Element e = zero_batch(s.model(), ctx.optimizer, b);
        runner->train_step(e, StepScalars{0, static_cast<float>(ctx.optimizer ? ctx.optimizer->lr : 0.0)});
      }  // the runner frees everything it allocated
      for (auto& d : base.devices) d.allocator->release_free_blocks();
      p.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (auto& d : base.devices) p.measured = std::max(p.measured, d.allocator->stats().peak_in_use);
    }
    if (progress)
      *progress << "  batch " << b << ": predicted " << format_bytes(p.predicted)
                << (p.measured ? ", measured " + format_bytes(p.measured)
                               : std::string(p.fits ? "" : " (over the limit, not run)"))
                << "\n"
                << std::flush;
    out.push_back(p);
  }
  return out;
}

std::string sweep_csv(const std::vector<SweepPoint>& points) {
  std::ostringstream os;
  os << "batch,predicted_bytes,measured_bytes,limit_bytes,fits,step_seconds\n";
  for (const auto& p : points)
    os << p.batch << "," << p.predicted << "," << (p.measured ? std::to_string(p.measured) : "") << "," << p.limit
       << "," << (p.fits ? "yes" : "no") << "," << (p.measured ? std::to_string(p.step_seconds) : "") << "\n";
  return os.str();
}

std::string sweep_svg(const std::vector<SweepPoint>& points, const std::string& title) {
  const double W = 720, H = 440, L = 80, R = 20, T = 40, B = 60;
  if (points.empty()) return "<svg xmlns=\"http://www.w3.org/2000/svg\"/>\n";
  double bmin = static_cast<double>(points.front().batch), bmax = bmin, ymax = 0;
  for (const auto& p : points) {
    bmin = std::min(bmin, static_cast<double>(p.batch));
    bmax = std::max(bmax, static_cast<double>(p.batch));
    ymax = std::max(
        {ymax, static_cast<double>(p.predicted), static_cast<double>(p.measured), static_cast<double>(p.limit)});
  }
  ymax = std::max(ymax * 1.08, 1.0);
  const bool logx = bmax / std::max(bmin, 1.0) >= 8;
  auto xpos = [&](double b) {
    double f = bmax == bmin ? 0.5 : logx ? std::log2(b / bmin) / std::log2(bmax / bmin) : (b - bmin) / (bmax - bmin);
    return L + f * (W - L - R);
  };
  auto ypos = [&](double v) { return H - B - v / ymax * (H - T - B); };
  std::ostringstream os;
  os << std::fixed;
  os.precision(1);
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << xml_escape(title)
     << "</text>\n"
     << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B
     << "\" stroke=\"black\"/>\n"
     << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 5; ++i) {  // y grid in MiB
    double v = ymax * i / 5;
    os << "<line x1=\"" << L << "\" y1=\"" << ypos(v) << "\" x2=\"" << W - R << "\" y2=\"" << ypos(v)
       << "\" stroke=\"#ddd\"/>\n"
       << "<text x=\"" << L - 6 << "\" y=\"" << ypos(v) + 4 << "\" text-anchor=\"end\">" << mib(static_cast<size_t>(v))
       << "</text>\n";
  }
  for (const auto& p : points)
    os << "<text x=\"" << xpos(static_cast<double>(p.batch)) << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">"
       << p.batch << "</text>\n";
  os << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 18 << "\" text-anchor=\"middle\">batch size"
     << (logx ? " (log scale)" : "") << "</text>\n"
     << "<text x=\"18\" y=\"" << (T + H - B) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
     << (T + H - B) / 2 << ")\">peak memory (MiB)</text>\n";
  const double lim = static_cast<double>(points.front().limit);
  os << "<line x1=\"" << L << "\" y1=\"" << ypos(lim) << "\" x2=\"" << W - R << "\" y2=\"" << ypos(lim)
     << "\" stroke=\"#c0392b\" stroke-dasharray=\"6 4\"/>\n"
     << "<text x=\"" << W - R - 4 << "\" y=\"" << ypos(lim) - 5 << "\" text-anchor=\"end\" fill=\"#c0392b\">limit "
     << mib(points.front().limit) << " MiB</text>\n";
  os << "<polyline fill=\"none\" stroke=\"#2c7fb8\" stroke-width=\"2\" points=\"";
  for (const auto& p : points)
    os << xpos(static_cast<double>(p.batch)) << "," << ypos(static_cast<double>(p.predicted)) << " ";
  os << "\"/>\n";
  for (const auto& p : points)
    if (p.measured)
      os << "<circle cx=\"" << xpos(static_cast<double>(p.batch)) << "\" cy=\"" << ypos(static_cast<double>(p.measured))
         << "\" r=\"4\" fill=\"#e67e22\"/>\n";
  os << "<line x1=\"" << L + 16 << "\" y1=\"" << T + 10 << "\" x2=\"" << L + 40 << "\" y2=\"" << T + 10
     << "\" stroke=\"#2c7fb8\" stroke-width=\"2\"/>"
     << "<text x=\"" << L + 46 << "\" y=\"" << T + 14 << "\">predicted (kiln plan)</text>\n"
     << "<circle cx=\"" << L + 28 << "\" cy=\"" << T + 28 << "\" r=\"4\" fill=\"#e67e22\"/>"
     << "<text x=\"" << L + 46 << "\" y=\"" << T + 32 << "\">measured (allocator peak, one training step)</text>\n"
     << "</svg>\n";
  return os.str();
}

}  // namespace kiln
