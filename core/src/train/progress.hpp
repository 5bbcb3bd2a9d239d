// The progress of an epoch as a terminal bar or plain lines ([train] progress), with the loss, throughput and an ETA.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>

namespace kiln {

class Progress {
 public:
  Progress(std::ostream& out, const std::string& mode, int64_t epoch, int64_t epochs, int64_t total)
      : out_(out), epoch_(epoch), epochs_(epochs), total_(total) {
    bar_ = mode == "bar" || (mode == "auto" && ::isatty(STDOUT_FILENO) && &out == &std::cout);
    none_ = mode == "none";
    every_ = std::max<int64_t>(1, total > 0 ? total / 10 : 100);
  }
  // `extra`: per-head losses and the gradient norm, when there are any.
  void update(int64_t done, double loss, double ex_per_s, double s_per_batch, bool force = false,
              const std::string& extra = {}) {
    if (none_) return;
    if (!bar_ && done == last_printed_) return;  // the forced line at the epoch's end may repeat the last one
    char stats[200];
    // Slow models run below one example per second: show what is there instead of "0 examples/s".
    std::snprintf(
        stats, sizeof stats,
        ex_per_s >= 10 ? "loss %.4f  %.0f examples/s  %.4f s/batch" : "loss %.4f  %.3g examples/s  %.4f s/batch", loss,
        ex_per_s, s_per_batch);
    std::string eta = extra;
    if (total_ > 0 && done < total_ && s_per_batch > 0) {
      const double left = static_cast<double>(total_ - done) * s_per_batch;
      char e[64];
      if (left >= 3600)
        std::snprintf(e, sizeof e, "  eta %dh%02dm", static_cast<int>(left / 3600), static_cast<int>(left / 60) % 60);
      else if (left >= 60)
        std::snprintf(e, sizeof e, "  eta %dm%02ds", static_cast<int>(left / 60), static_cast<int>(left) % 60);
      else
        std::snprintf(e, sizeof e, "  eta %.0fs", left);
      eta += e;
    }
    if (bar_) {
      const int width = 30;
      int filled = total_ > 0 ? static_cast<int>(width * done / total_) : 0;
      std::string b(static_cast<size_t>(filled), '=');
      if (filled < width) b += '>', b += std::string(static_cast<size_t>(width - filled - 1), ' ');
      out_ << "\repoch " << epoch_ << "/" << epochs_ << " [" << b << "] " << done << "/"
           << (total_ > 0 ? std::to_string(total_) : "?") << "  " << stats << eta << "   " << std::flush;
    } else if (force || done % every_ == 0) {
      out_ << "epoch " << epoch_ << "/" << epochs_ << " batch " << done << "/"
           << (total_ > 0 ? std::to_string(total_) : "?") << "  " << stats << eta << "\n"
           << std::flush;
      last_printed_ = done;
    }
  }
  void finish() {
    if (bar_) out_ << "\n";
  }

 private:
  std::ostream& out_;
  int64_t epoch_, epochs_, total_;
  bool bar_ = false, none_ = false;
  int64_t every_;
  int64_t last_printed_ = -1;
};

}  // namespace kiln
