// A text source's vocabulary: the JSON a text source writes (Stage::vocabulary), saved with a run as vocab.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// A text source's vocabulary (the JSON Stage::vocabulary writes, saved with the run as vocab.json).
struct Vocabulary {
  bool bytes = false;               // ids are byte values 0..255
  std::vector<std::string> tokens;  // chars: the UTF-8 text of each id
  int64_t size() const { return bytes ? 256 : static_cast<int64_t>(tokens.size()); }
  // Ids of `text`; a character outside the vocabulary is a ConfigError naming it, its position and `what`.
  std::vector<int64_t> encode(const std::string& text, const std::string& what) const;
  std::string decode(int64_t id) const;
};
// Throws DataError naming `where` when `json` is not such a vocabulary.
Vocabulary parse_vocabulary(const std::string& json, const std::string& where);

}  // namespace kiln
