// Validated access to TOML configuration: every error names the file, line, key, what was given and what
// was expected; keys nobody read are reported as unknown.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/error.hpp"

namespace kiln {

class ConfigDocument;

// A view of one TOML table. Reading a key marks it used; finish() throws ConfigError for any key left unread.
class ConfigNode {
 public:
  ConfigNode(std::shared_ptr<ConfigDocument> doc, const void* table, std::string path);

  bool has(const std::string& key) const;
  bool is_list(const std::string& key) const;  // the key is present and holds an array (does not mark it read)
  std::string path() const { return path_; }   // dotted path of this table, "model.layers[2]"
  std::string where(const std::string& key = {}) const;  // "run.toml:12: key 'model.layers[2].units'"

  // The key is present and holds a table; this table's keys, for tables keyed by names. Neither marks a key read.
  bool is_table(const std::string& key) const;
  std::vector<std::string> keys() const;

  // Typed getters; a missing required key or a wrong type throws ConfigError.
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_float(const std::string& key) const;  // integers are accepted
  double get_float(const std::string& key, double dflt) const;
  bool get_bool(const std::string& key, bool dflt) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;
  // One of `choices`; anything else is an error listing them.
  std::string get_choice(const std::string& key, const std::vector<std::string>& choices,
                         const std::string& dflt) const;
  std::vector<int64_t> get_int_list(const std::string& key) const;
  std::vector<int64_t> get_int_list(const std::string& key, std::vector<int64_t> dflt) const;
  std::vector<std::string> get_string_list(const std::string& key, std::vector<std::string> dflt) const;
  // A list of numbers (integers are accepted), e.g. "mean = [0.4914, 0.4822, 0.4465]".
  std::vector<double> get_float_list(const std::string& key) const;
  std::vector<double> get_float_list(const std::string& key, std::vector<double> dflt) const;
  // An int or a list of two ints ("kernel = 3" or "kernel = [3, 5]").
  std::pair<int64_t, int64_t> get_pair(const std::string& key, std::pair<int64_t, int64_t> dflt) const;
  // Either a string or an integer, returned as text ("1200MiB", "60%", 1048576).
  std::string get_size_text(const std::string& key, const std::string& dflt) const;
  std::optional<ConfigNode> table(const std::string& key) const;      // a sub-table, if present
  std::vector<ConfigNode> table_array(const std::string& key) const;  // [[key]] or key = [{...}, ...]
  // Throws ConfigError naming every key of this table that no getter read.
  void finish() const;
  // A copy of this table whose every string value (inside lists and sub-tables too) is `rewrite(key, value)`, key
  // being this table's key the value sits under; `rewrite` may throw. The copy lives as long as the document, has its
  // own read keys (finish()), and names this table's path, file and lines in its errors: a [[model.layers]] block
  // written once and repeated is read as one table per repetition.
  ConfigNode rewritten(const std::function<std::string(const std::string&, const std::string&)>& rewrite) const;
  // Marks a key as read without reading it (for keys handled elsewhere).
  void ignore(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

 private:
  std::shared_ptr<ConfigDocument> doc_;
  const void* table_;  // toml::table*, hidden so plugins need no toml++ headers
  std::string path_;
};

// A parsed TOML file with --set overrides applied. Throws ConfigError (with file:line) on parse errors, and before
// parsing on text the parser cannot take safely: over 16 MiB, a dotted key or table header of more than 64 parts,
// arrays and inline tables nested more than 64 deep. Each --set is one line "key=value" (a line break is refused).
class Config {
 public:
  static Config load_file(const std::string& path, const std::vector<std::string>& overrides = {});
  static Config load_string(const std::string& text, const std::string& name = "<string>",
                            const std::vector<std::string>& overrides = {});
  ConfigNode root() const;
  const std::string& file() const;
  // Directory of the config file; relative data paths resolve against it.
  std::string base_dir() const;
  // The configuration as resolved (the file with every --set override applied), as TOML text.
  std::string resolved_text() const;

 private:
  std::shared_ptr<ConfigDocument> doc_;
};

}  // namespace kiln
