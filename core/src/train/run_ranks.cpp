// Cross-rank checks of the trainer: the same config everywhere, one decision to stop or checkpoint.
#include "run_ranks.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
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

uint64_t fnv1a(uint64_t h, const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 1099511628211ull;
  return h;
}

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// A file's size and a hash of its first and last MiB: cheap for any size, and blind to times and names.
std::string file_fingerprint(const std::filesystem::path& f) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(f, ec)) {
    // A directory of files: their names and sizes (reading every file would cost as much as an epoch).
    std::map<std::string, uintmax_t> entries;
    for (const auto& e : fs::directory_iterator(f, ec))
      entries[e.path().filename().string()] = e.is_regular_file(ec) ? e.file_size(ec) : 0;
    uint64_t h = 1469598103934665603ull;
    for (const auto& [name, size] : entries) {
      h = fnv1a(h, name.data(), name.size());
      h = fnv1a(h, reinterpret_cast<const char*>(&size), sizeof size);
    }
    return "a directory of " + std::to_string(entries.size()) + " entries, names and sizes hash " + hex(h);
  }
  const uintmax_t size = fs::file_size(f, ec);
  if (ec) return "not readable (" + ec.message() + ")";
  constexpr uintmax_t kMiB = 1 << 20;
  std::ifstream in(f, std::ios::binary);
  std::vector<char> buf(kMiB);
  uint64_t h = 1469598103934665603ull;
  in.read(buf.data(), static_cast<std::streamsize>(std::min(size, kMiB)));
  h = fnv1a(h, buf.data(), static_cast<size_t>(in.gcount()));
  if (size > kMiB) {
    in.seekg(static_cast<std::streamoff>(size - std::min(size - kMiB, kMiB)));
    in.read(buf.data(), static_cast<std::streamsize>(std::min(size - kMiB, kMiB)));
    h = fnv1a(h, buf.data(), static_cast<size_t>(in.gcount()));
  }
  return std::to_string(size) + " bytes, first and last MiB hash " + hex(h);
}

// One compared fact of describe_data: "what<TAB>value<TAB>note" (the note, e.g. the resolved path, is only shown).
struct DataFact {
  std::string what, value, note;
};

std::vector<DataFact> parse_facts(const std::string& text) {
  std::vector<DataFact> out;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) {
    DataFact f;
    const auto a = line.find('\t'), b = a == std::string::npos ? a : line.find('\t', a + 1);
    f.what = line.substr(0, a);
    if (a != std::string::npos) f.value = line.substr(a + 1, b == std::string::npos ? b : b - a - 1);
    if (b != std::string::npos) f.note = line.substr(b + 1);
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace

std::string describe_data(const Config& cfg, const std::string& split, const Stage& pipeline) {
  const std::string at = "[data." + split + "]";
  std::ostringstream os;
  const int64_t n = pipeline.size_hint();
  os << at << " examples\t" << (n >= 0 ? std::to_string(n) : "unknown") << "\t\n";
  os << at << " example shape\t" << pipeline.example_shape().str() << "\t\n";
  os << at << " label shape\t" << pipeline.label_shape().str() << "\t\n";
  std::string names;
  for (const auto& l : pipeline.label_names()) names += (names.empty() ? "" : ", ") + l;
  if (!names.empty()) os << at << " label names\t" << names << "\t\n";
  if (const std::string v = pipeline.vocabulary(); !v.empty())
    os << at << " vocabulary\t" << v.size() << " bytes of JSON, hash "
       << hex(fnv1a(1469598103934665603ull, v.data(), v.size())) << "\t\n";
  // The files the source names, resolved as the source resolves them.
  try {
    auto d = cfg.root().table("data");
    auto p = d ? d->table(split) : std::nullopt;
    auto stages = p ? p->table_array("stages") : std::vector<ConfigNode>{};
    if (stages.empty()) return os.str();
    auto resolve = [&](std::filesystem::path f) {
      if (f.is_relative() && !cfg.base_dir().empty()) f = std::filesystem::path(cfg.base_dir()) / f;
      std::error_code ec;
      const auto abs = std::filesystem::absolute(f, ec);  // the message shows where each rank looked
      return (ec ? f : abs).lexically_normal();
    };
    for (const char* key : {"images", "labels", "path", "dir"})
      if (stages[0].has(key)) {
        const auto f = resolve(stages[0].get_string(key));
        os << at << " " << key << "\t" << file_fingerprint(f) << "\t" << f.string() << "\n";
      }
    if (stages[0].has("files")) {
      const auto files = stages[0].get_string_list("files", {});
      for (size_t i = 0; i < files.size(); ++i) {
        const auto f = resolve(files[i]);
        os << at << " files[" << i << "]\t" << file_fingerprint(f) << "\t" << f.string() << "\n";
      }
    }
  } catch (const ConfigError&) {  // a key of another type: the pipeline was built, the sizes above still compare
  }
  return os.str();
}

void check_same_data(ProcessGroup& pg, const std::string& mine, const std::string& file) {
  const std::string payload = pg.host() + "\n" + mine;
  auto all = pg.all_gather({reinterpret_cast<const uint8_t*>(payload.data()), payload.size()});
  std::vector<std::string> hosts;
  std::vector<std::vector<DataFact>> facts;
  for (const auto& b : all) {
    const std::string text(b.begin(), b.end());
    const auto nl = text.find('\n');
    hosts.push_back(text.substr(0, nl));
    facts.push_back(parse_facts(nl == std::string::npos ? "" : text.substr(nl + 1)));
  }
  std::string report;
  for (size_t r = 1; r < all.size(); ++r) {
    const std::string who = "rank " + std::to_string(r) + " (host " + hosts[r] + ")";
    for (size_t i = 0; i < std::max(facts[0].size(), facts[r].size()); ++i) {
      const DataFact none{"", "(nothing)", ""};
      const DataFact& a = i < facts[0].size() ? facts[0][i] : none;
      const DataFact& b = i < facts[r].size() ? facts[r][i] : none;
      if (a.what == b.what && a.value == b.value) continue;
      const auto side = [](const DataFact& f) {
        return "'" + f.value + "'" + (f.note.empty() ? "" : " (" + f.note + ")");
      };
      report += "\n  " + who + ": " + (a.what.empty() ? b.what : a.what) + ": rank 0 (host " + hosts[0] + ") reads " +
                side(a) + ", " + who + " reads " + side(b);
    }
  }
  if (!report.empty())
    throw DataError(file +
                    ": the ranks of this run would train on different data (every rank must read the same examples; "
                    "a relative path resolves against each rank's config file, and a file can differ from host to "
                    "host):" +
                    report +
                    "\nGive every rank the same files (a shared filesystem, or identical copies on each host)");
}

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

RowShare train_rows(const Config& cfg, const Strategy& strategy, int64_t batch) {
  ProcessGroup* pg = strategy.process_group();
  if (!pg || pg->size() < 2 || strategy.name() != "data_parallel" || batch < 1) return {};
  const int64_t procs = pg->size();
  if (batch % procs != 0) return {};
  if (auto st = cfg.root().table("strategy"); st && st->has("uneven") && st->get_bool("uneven", false)) return {};
  // A cache after the batch stage would record this rank's partial batches: a file cache may be read by another
  // rank or a later run, so such a pipeline reads every row.
  if (auto d = cfg.root().table("data"); d && d->has("train"))
    if (auto train = d->table("train"); train && train->has("stages")) {
      bool batched = false;
      for (const auto& st : train->table_array("stages")) {
        const std::string type = st.has("type") ? st.get_string("type") : "";
        if (batched && type == "cache") return {};
        batched = batched || type == "batch";
      }
    }
  const int64_t share = batch / procs;
  return {pg->rank() * share, (pg->rank() + 1) * share};
}

Element gather_rows(ProcessGroup& pg, const Element& b, RowShare mine, int64_t batch) {
  if (mine.all() || b.batch != batch) return b;
  const auto xn = static_cast<size_t>(b.x.shape.numel() / b.batch),
             yn = static_cast<size_t>(b.y.shape.numel() / b.batch);
  std::vector<uint8_t> out(2 * sizeof(int64_t));
  std::memcpy(out.data(), &mine.begin, sizeof(int64_t));
  std::memcpy(out.data() + sizeof(int64_t), &mine.end, sizeof(int64_t));
  auto put = [&](const float* p, size_t n) {
    const auto* c = reinterpret_cast<const uint8_t*>(p);
    out.insert(out.end(), c, c + n * sizeof(float));
  };
  const auto rows = static_cast<size_t>(mine.end - mine.begin), first = static_cast<size_t>(mine.begin);
  put(b.x.data.data() + first * xn, rows * xn);
  put(b.y.data.data() + first * yn, rows * yn);
  Element whole = b;
  int64_t covered = 0;
  for (const auto& bytes : pg.all_gather(out)) {
    int64_t begin = 0, end = 0;
    if (bytes.size() >= 2 * sizeof(int64_t)) {
      std::memcpy(&begin, bytes.data(), sizeof(int64_t));
      std::memcpy(&end, bytes.data() + sizeof(int64_t), sizeof(int64_t));
    }
    const auto n = static_cast<size_t>(std::max<int64_t>(end - begin, 0));
    if (begin < 0 || end > batch || bytes.size() != 2 * sizeof(int64_t) + n * (xn + yn) * sizeof(float))
      throw Error("data_parallel: a process sent a damaged share of the pending batch (rows " + std::to_string(begin) +
                  ".." + std::to_string(end) + " of " + std::to_string(batch) + ", " + std::to_string(bytes.size()) +
                  " bytes)");
    const uint8_t* p = bytes.data() + 2 * sizeof(int64_t);
    std::memcpy(whole.x.data.data() + static_cast<size_t>(begin) * xn, p, n * xn * sizeof(float));
    std::memcpy(whole.y.data.data() + static_cast<size_t>(begin) * yn, p + n * xn * sizeof(float),
                n * yn * sizeof(float));
    covered += end - begin;
  }
  if (covered != batch)
    throw Error("data_parallel: the processes' shares of the pending batch cover " + std::to_string(covered) +
                " of its " + std::to_string(batch) + " rows");
  return whole;
}

std::vector<uint64_t> gather_counts(ProcessGroup& pg, uint64_t mine) {
  std::vector<uint8_t> bytes(sizeof mine);
  std::memcpy(bytes.data(), &mine, sizeof mine);
  std::vector<uint64_t> out;
  for (const auto& b : pg.all_gather(bytes)) {
    uint64_t v = 0;
    if (b.size() == sizeof v) std::memcpy(&v, b.data(), sizeof v);
    out.push_back(v);
  }
  return out;
}

}  // namespace kiln
