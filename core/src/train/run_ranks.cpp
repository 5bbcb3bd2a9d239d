// Cross-rank checks of the trainer: the same config everywhere, one decision to stop or checkpoint.
#include "run_ranks.hpp"

#include <cstring>
#include <sstream>
#include <vector>

#include "kiln/error.hpp"

namespace kiln {

namespace {

// "key = value" lines with their table ("optimizer.learning_rate = 0.002"), in file order.
std::vector<std::string> keyed_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  std::string table;
  for (std::string line; std::getline(is, line);) {
    const auto start = line.find_first_not_of(" \t");
    if (start == std::string::npos) continue;
    line = line.substr(start);
    if (line[0] == '[') {
      table = line.substr(line[1] == '[' ? 2 : 1);
      table = table.substr(0, table.find(']'));
      continue;
    }
    out.push_back(table.empty() ? line : table + "." + line);
  }
  return out;
}

}  // namespace

void check_same_config(ProcessGroup& pg, const std::string& resolved_text, const std::string& file) {
  auto all = pg.all_gather({reinterpret_cast<const uint8_t*>(resolved_text.data()), resolved_text.size()});
  const std::string first(all[0].begin(), all[0].end());
  const auto ref = keyed_lines(first);
  std::string report;
  for (size_t r = 1; r < all.size(); ++r) {
    const std::string theirs(all[r].begin(), all[r].end());
    if (theirs == first) continue;
    const auto other = keyed_lines(theirs);
    size_t i = 0;
    while (i < ref.size() && i < other.size() && ref[i] == other[i]) ++i;
    const std::string a = i < ref.size() ? ref[i] : "(nothing)", b = i < other.size() ? other[i] : "(nothing)";
    const std::string key = (i < ref.size() ? a : b).substr(0, (i < ref.size() ? a : b).find(" ="));
    report += "\n  rank " + std::to_string(r) + ": key " + key + ": rank 0 has '" + a + "', rank " + std::to_string(r) +
              " has '" + b + "'";
  }
  if (!report.empty())
    throw ConfigError(file +
                      ": the ranks of this run were started with different configurations (every rank must read "
                      "the same TOML and --set options):" +
                      report);
}

StepAgreement agree_after_step(ProcessGroup& pg, int stop_signal, bool checkpoint_due) {
  int32_t mine[2] = {stop_signal, checkpoint_due ? 1 : 0};
  auto all = pg.all_gather({reinterpret_cast<const uint8_t*>(mine), sizeof mine});
  StepAgreement a;
  for (size_t r = 0; r < all.size(); ++r) {
    int32_t v[2] = {0, 0};
    if (all[r].size() == sizeof v) std::memcpy(v, all[r].data(), sizeof v);
    if (a.stop_signal == 0) a.stop_signal = v[0];
    if (r == 0) a.checkpoint_due = v[1] != 0;
  }
  return a;
}

void agree_checkpoint_written(ProcessGroup& pg, const std::string& error) {
  auto all = pg.all_gather({reinterpret_cast<const uint8_t*>(error.data()), error.size()});
  if (pg.rank() == 0 || all[0].empty()) return;
  throw Error("rank 0 could not write the checkpoint, so every rank stops: " +
              std::string(all[0].begin(), all[0].end()));
}

}  // namespace kiln
