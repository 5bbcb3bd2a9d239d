// A run's output directory: where it is (checked before anything else), one process at a time (flock), what an
// earlier run left, metrics trimmed on resume, and the record of what ran.
#include "run_dir.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "kiln/checkpoint.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/files.hpp"
#include "kiln/session.hpp"

namespace kiln {

namespace {

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

// NAME_MAX of Linux file systems: a longer name fails only when the directory is created, as "File name too long".
constexpr size_t kMaxNameBytes = 255;

std::string check_output_dir(const Session& s) {
  namespace fs = std::filesystem;
  ConfigNode root = s.config().root();
  auto run = root.table("run");
  auto train = root.table("train");
  const bool explicit_dir = train && train->has("output_dir");
  std::string key;
  if (explicit_dir) {
    key = train->where("output_dir");
    if (s.train().output_dir.empty() || train->get_string("output_dir").empty())
      train->fail("output_dir", "is empty; leave it out to write to runs/<run name>");
  } else {
    const bool named = run && run->has("name");
    const std::string name = named ? run->get_string("name") : s.run_name();  // "" given explicitly counts
    key = named ? run->where("name") : s.config().file() + ": [run] name (from the file name)";
    std::string why;
    if (name.empty())
      why = "is empty (leave [run] name out to use the config file's name)";
    else if (name == "." || name == "..")
      why = "is '" + name + "', which is not a run name";
    else if (name.find_first_of("/\\") != std::string::npos)
      why = "contains a path separator";
    else if (std::any_of(name.begin(), name.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }))
      why = "contains a control character";
    else if (name.size() > kMaxNameBytes)
      why = "is " + std::to_string(name.size()) + " bytes long; a directory name holds at most " +
            std::to_string(kMaxNameBytes) + " bytes";
    if (!why.empty()) {
      const std::string msg = "\"" + name + "\" " + why +
                              "; the run writes to runs/<name>, so the name must be one directory name (no '/', "
                              "not '.' or '..'). Set [train] output_dir to write elsewhere";
      if (named) run->fail("name", msg);
      throw ConfigError(key + ": " + msg);
    }
  }
  std::error_code ec;
  const fs::path dir = s.train().output_dir;
  for (const auto& part : dir)
    if (part.native().size() > kMaxNameBytes)
      throw ConfigError(key + ": the output directory '" + dir.string() + "' has a component of " +
                        std::to_string(part.native().size()) + " bytes; a directory name holds at most " +
                        std::to_string(kMaxNameBytes) + " bytes");
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw ConfigError(key + ": the output directory '" + dir.string() +
                      "' exists and is not a directory; choose another [train] output_dir or [run] name");
  return key;
}

void create_output_dir(const std::string& dir, const std::string& key) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(key + ": cannot create the output directory '" + dir + "': " + ec.message());
}

RunLock::RunLock(const std::string& dir, const std::string& key, const std::string& command) {
  const std::string path = dir + "/.kiln.lock";
  // Never through a link: one planted here would make the pid written below truncate whatever file it points to.
  fd_ = open_no_follow(path, O_RDWR | O_CREAT);
  if (fd_ < 0 && errno == ELOOP)
    throw Error(path +
                ": is a symbolic link; Kiln does not open a run's files through links (a link there would make "
                "it write wherever it points). Remove the link (the directory comes from " +
                key + ")");
  if (fd_ < 0)
    throw Error(path + ": cannot open the run's lock file: " + std::strerror(errno) + " (the directory comes from " +
                key + ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    // The holder writes its pid just after it takes the lock: two runs started at once may look before it has, or
    // see the pid of an earlier holder that has ended; so read until the file names a live process (up to 2 s).
    std::string holder;
    for (int tries = 0; tries < 100; ++tries) {
      {
        std::ifstream f(path);
        holder.clear();
        std::getline(f, holder, '\0');
      }
      const long pid = holder.rfind("pid ", 0) == 0 ? std::atol(holder.c_str() + 4) : 0;
      if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::close(fd_);
    fd_ = -1;
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    for (auto& c : holder)
      if (c == '\n') c = ',';
    if (e == EWOULDBLOCK)
      throw Error(dir + ": this run is in use by another kiln process (" +
                  (holder.empty() ? std::string("holder unknown") : holder) +
                  "); two processes must not write one run. Wait for it to end, stop it, or give this run another "
                  "[run] name or output directory (" +
                  key + ")");
    throw Error(path + ": cannot lock the run directory: " + std::strerror(e));
  }
  // Holding the lock, no other kiln process writes here: temporaries left by a killed writer (<file>.tmp.<pid> of the
  // files kiln train writes) go.
  std::error_code ec;
  static const std::regex tmp_re(
      R"((checkpoint[^/]*\.kiln|config\.toml|run\.json|metrics\.jsonl|vocab\.json)\.tmp\.[0-9]+)");
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code rm;
    if (it->is_regular_file(rm) && std::regex_match(it->path().filename().string(), tmp_re))
      std::filesystem::remove(it->path(), rm);
  }
  std::string who = "pid " + std::to_string(::getpid()) + "\nstarted " + now_utc() + "\ncommand " + command + "\n";
  // Written over the old text, then cut to length: a reader never finds the file empty.
  if (::pwrite(fd_, who.data(), who.size(), 0) == static_cast<ssize_t>(who.size())) {
    int r = ::ftruncate(fd_, static_cast<off_t>(who.size()));
    (void)r;  // the lock is what matters; the text only names the holder
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock; the file stays (removing it would race with a new holder)
}

PriorRun inspect_run_dir(const std::string& dir) {
  // The run's files are regular files Kiln wrote: a link (metrics.jsonl is appended to in place, so a link would be
  // written through) or a FIFO (a read would block) under one of their names is refused before anything reads them.
  for (const char* name : {"checkpoint.kiln", "metrics.jsonl", "config.toml", "run.json", "vocab.json"}) {
    const std::string f = dir + "/" + name;
    struct stat st {};
    if (::lstat(f.c_str(), &st) != 0) continue;
    if (S_ISLNK(st.st_mode))
      throw Error(f +
                  ": is a symbolic link; Kiln does not read or write a run's files through links. Remove it (or "
                  "replace it with the file itself)");
    if (!S_ISREG(st.st_mode))
      throw Error(f + ": " + regular_file_problem(f) + "; a run's " + name + " is a regular file. Move it away");
  }
  PriorRun p;
  p.checkpoint = !checkpoint_files(dir + "/checkpoint.kiln").empty();  // the newest, or an earlier one kept
  std::ifstream f(dir + "/metrics.jsonl");
  for (std::string l; std::getline(f, l);)
    if (!l.empty()) ++p.metric_lines;
  return p;
}

int64_t trim_metrics(const std::string& path, int64_t step) {
  std::ifstream f(path);
  if (!f) return 0;
  static const std::regex re("\"step\":([0-9]+)");
  std::string kept;
  int64_t dropped = 0;
  for (std::string l; std::getline(f, l);) {
    std::smatch m;
    // A line cut short by a kill (no closing brace) or past the checkpoint's step is dropped.
    if (l.empty() || l.back() != '}' || !std::regex_search(l, m, re) || std::stoll(m[1]) > step) {
      if (!l.empty()) ++dropped;
      continue;
    }
    kept += l + "\n";
  }
  f.close();
  if (dropped > 0) write_file_atomically(path, kept);
  return dropped;
}

void write_run_record(const std::string& dir, const std::string& resolved_config, const std::string& run_json) {
  write_file_atomically(
      dir + "/config.toml",
      "# The configuration of this run as resolved (--set overrides applied), written by kiln train.\n" +
          resolved_config + "\n");
  write_file_atomically(dir + "/run.json", run_json + "\n");
}

namespace {

void flatten(const toml::node& n, const std::string& key, std::map<std::string, std::string>& out) {
  if (const auto* t = n.as_table()) {
    for (const auto& [k, v] : *t)
      flatten(v, key.empty() ? std::string(k.str()) : key + "." + std::string(k.str()), out);
  } else if (const auto* a = n.as_array(); a && !a->empty() && a->is_array_of_tables()) {
    for (size_t i = 0; i < a->size(); ++i) flatten(*a->get(i), key + "[" + std::to_string(i) + "]", out);
  } else {
    std::ostringstream os;
    if (const auto* arr = n.as_array())
      os << *arr;
    else if (const auto* tb = n.as_table())
      os << *tb;
    else
      n.visit([&](const auto& v) { os << v; });
    out[key] = os.str();
  }
}

// Keys a resumed run may change: how long and how it runs, what it evaluates on and logs, where it runs.
bool may_change_on_resume(const std::string& key) {
  static const char* const prefixes[] = {
      "train.epochs", "train.max_steps", "train.resume", "train.overwrite", "train.progress", "train.checkpoint_every",
      "train.keep_checkpoints", "train.evaluate", "train.divergence_factor", "train.output_dir",
      "train.device_prefetch", "train.memory_policy", "log.", "device.", "memory.", "plugins.", "data.test", "run.name",
      // The checkpoint holds float32 master weights whatever the compute type: a run may continue in another.
      "precision.",
      // How data_parallel spreads the same global batch (the checkpoint does not depend on it): processes, devices,
      // buckets and where the optimizer state lives.
      "strategy.communicator", "strategy.process_group", "strategy.devices", "strategy.timeout_s", "strategy.reduction",
      "strategy.bucket_size", "strategy.overlap", "strategy.concurrent", "strategy.optimizer_state",
      // Decoded or streaming, a source gives the same elements, and its saved position restores in either mode.
      "data.decoded_budget"};
  for (const char* p : prefixes)
    if (key.rfind(p, 0) == 0) return true;
  return false;
}

}  // namespace

std::vector<std::string> resume_incompatible_keys(const std::string& saved, const std::string& now) {
  std::map<std::string, std::string> a, b;
  try {
    Config::load_string(saved, "config.toml");  // bounded first: a hand-edited file must not crash the parser
    flatten(toml::parse(saved), "", a);
  } catch (const ConfigError&) {
    return {"config.toml: the saved configuration does not parse, so it cannot be compared"};
  } catch (const toml::parse_error&) {
    return {"config.toml: the saved configuration does not parse, so it cannot be compared"};
  }
  flatten(toml::parse(now), "", b);
  std::vector<std::string> out;
  auto keys = a;
  for (const auto& [k, v] : b) keys.emplace(k, v);
  for (const auto& [k, unused] : keys) {
    (void)unused;
    if (may_change_on_resume(k)) continue;
    auto ia = a.find(k), ib = b.find(k);
    const std::string va = ia == a.end() ? "(absent)" : ia->second, vb = ib == b.end() ? "(absent)" : ib->second;
    if (va != vb) out.push_back(k + ": " + va + " -> " + vb);
  }
  return out;
}

std::string json_string(const std::string& v) {
  std::string o = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

}  // namespace kiln
