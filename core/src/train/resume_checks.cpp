// A resume refuses state that does not match the run before anything is loaded or changed on disk
// (resume_checks.hpp).
#include "resume_checks.hpp"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/checkpoint.hpp"
#include "kiln/error.hpp"
#include "kiln/files.hpp"
#include "kiln/session.hpp"
#include "kiln/strategy.hpp"
#include "run_dir.hpp"

namespace kiln {

// A text source's ids stand for the characters of vocab.json: a text whose characters changed since would give the
// trained ids other meanings (and vocab.json would be rewritten), so the resume is refused before anything changes.
void check_resume_vocabulary(const Session& s_) {
  const TrainSettings& ts_ = s_.train();
  const std::string vpath = ts_.output_dir + "/vocab.json";
  if (s_.vocabulary().empty() || !regular_file_problem(vpath).empty()) return;
  std::ifstream f(vpath);
  std::string saved((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!saved.empty() && (saved.back() == '\n' || saved.back() == '\r')) saved.pop_back();
  if (saved == s_.vocabulary()) return;
  throw DataError(describe_source(s_.config(), "train") + ": its vocabulary differs from " + vpath +
                  ", the one the checkpoint was trained with (saved: " + std::to_string(saved.size()) +
                  " bytes of JSON, now: " + std::to_string(s_.vocabulary().size()) +
                  "); the same id would stand for another character. Resume with the text the run was started with, "
                  "or start over with --overwrite. Nothing was changed in " +
                  ts_.output_dir);
}

// The checkpoint's header and tensors against this run: an epoch or step this run cannot have reached, a tensor the
// model has not or of another shape, and state this run's optimizer keeps (Adam's moments, EMA shadows) that the
// checkpoint lacks are refused before anything is loaded or trimmed.
void check_checkpoint_fits(const Session& s_, Runner& runner, const Checkpoint& c, const std::string& path,
                           int64_t per_epoch_, int64_t size_hint) {
  const TrainSettings& ts_ = s_.train();
  const std::string where = path + " (resuming " + s_.config().file() + ")";
  std::ostringstream bad;
  if (c.epoch < 0 || c.step < 0)
    bad << "its header holds epoch " << c.epoch << ", step " << c.step << "; neither can be negative";
  else if (c.epoch > ts_.epochs)
    bad << "its header holds epoch " << c.epoch << ", beyond the run's [train] epochs = " << ts_.epochs
        << " (raise epochs to continue it)";
  else if (per_epoch_ > 0) {
    // Steps per epoch as the data sizes them: an epoch ends after per_epoch_ batches, or one fewer when the batch
    // stage drops a remainder.
    const int64_t hint = size_hint;
    int64_t lo = hint / ts_.batch_size;
    if (ts_.steps_per_epoch > 0) lo = std::min(lo, ts_.steps_per_epoch);
    if (c.step > (c.epoch + 1) * per_epoch_ || c.step < c.epoch * lo)
      bad << "its header holds epoch " << c.epoch << " and step " << c.step
          << ", which this run cannot reach: " << c.epoch << " epoch(s) of "
          << (lo == per_epoch_ ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(per_epoch_))
          << " steps are steps " << c.epoch * lo << " to " << (c.epoch + 1) * per_epoch_;
  }
  if (!bad.str().empty())
    throw DataError(where + ": " + bad.str() + ". The file is damaged or from another run; nothing was changed in " +
                    ts_.output_dir);
  const std::map<std::string, HostTensor> want = runner.save_state();
  std::vector<std::string> missing, extra, shapes;
  for (const auto& [name, t] : want) {
    auto it = c.tensors.find(name);
    if (it == c.tensors.end())
      missing.push_back(name);
    else if (it->second.shape != t.shape)
      shapes.push_back("'" + name + "' is " + it->second.shape.str() + " there, " + t.shape.str() + " in the model");
  }
  for (const auto& [name, t] : c.tensors)
    if (!want.count(name)) extra.push_back(name);
  if (missing.empty() && extra.empty() && shapes.empty()) return;
  auto list = [](const std::vector<std::string>& v, bool quote) {
    std::string o;
    for (size_t i = 0; i < v.size() && i < 4; ++i) o += (i ? ", " : "") + (quote ? "'" + v[i] + "'" : v[i]);
    if (v.size() > 4) o += " and " + std::to_string(v.size() - 4) + " more";
    return o;
  };
  // Tensors of a parameter the checkpoint has (its name before the last '/'): optimizer state, not another model.
  bool only_state = shapes.empty();
  for (const auto& m : missing) only_state = only_state && m.find('/') != std::string::npos;
  for (const auto& m : extra) only_state = only_state && m.find('/') != std::string::npos;
  std::string why = where + ": the checkpoint does not match this run:";
  if (!shapes.empty()) why += " " + list(shapes, false) + ";";
  if (!missing.empty()) why += " this run needs " + list(missing, true) + ", which the checkpoint does not hold;";
  if (!extra.empty()) why += " it holds " + list(extra, true) + ", which this run has no use for;";
  why += only_state ? " the optimizer state differs: it was written with another [optimizer] type or ema, and "
                      "resuming would start this run's optimizer state from zero."
                    : " it was written by another model.";
  throw DataError(why +
                  " Resume with the configuration the checkpoint was written with, or start over with "
                  "--overwrite. Nothing was changed in " +
                  ts_.output_dir);
}

void check_resume_config(const Session& s, const std::string& output_dir) {
  check_resume_vocabulary(s);
  std::ifstream saved_cfg(output_dir + "/config.toml");
  if (!saved_cfg) return;
  const std::string saved((std::istreambuf_iterator<char>(saved_cfg)), std::istreambuf_iterator<char>());
  const auto changed = resume_incompatible_keys(saved, s.config().resolved_text());
  if (changed.empty()) return;
  std::string list;
  for (const auto& c : changed) list += "\n  " + c;
  throw ConfigError(s.config().file() + ": cannot resume the run in " + output_dir + ": these keys differ from " +
                    output_dir + "/config.toml, the configuration it was started with:" + list +
                    "\nResume with the same values, or start over with --overwrite (keys that may change on a resume "
                    "are listed in docs/user_guide.md, \"Stopping and resuming\")");
}

}  // namespace kiln
