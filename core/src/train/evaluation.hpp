// What the model's losses accept as labels, and the stage that checks every batch against it before it reaches a
// device (trainer.cpp wraps the train and test pipelines in it). evaluate() itself is declared in kiln/evaluation.hpp.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/data.hpp"
#include "kiln/model.hpp"

namespace kiln {

// What the model's losses accept as labels, checked on every batch before it reaches a device: a bad label
// would otherwise become a NaN loss (training) or a meaningless accuracy (evaluation) far from its cause.
struct LabelRules {
  int64_t classes = 0;  // softmax_cross_entropy: integer class index in [0, classes)
  std::string ce_output;
  bool soft = false;  // softmax_cross_entropy with (classes) labels: probabilities in [0, 1] summing to 1
  bool unit = false;  // binary_cross_entropy: target in [0, 1]
  std::string bce_output;
  // Named labels: each output's own column of the (names) label values, checked against that output's loss.
  struct Field {
    size_t col = 0;
    int64_t classes = 0;  // softmax_cross_entropy
    bool unit = false;    // binary_cross_entropy
    std::string output, label;
  };
  std::vector<Field> fields;
  size_t names = 0;
};

LabelRules label_rules(const ModelSpec& m);

// `up` with every batch checked against `rules`; a bad input or label is a DataError naming `source` (describe_source).
// With `rows_end` > 0, only rows [rows_begin, rows_end) of each batch of `batch` examples are checked: the rows an
// MPI rank's pipeline fills (the others are zero and never read).
std::unique_ptr<Stage> checked_stage(std::unique_ptr<Stage> up, LabelRules rules, std::string source,
                                     int64_t rows_begin = 0, int64_t rows_end = 0, int64_t batch = 0);

}  // namespace kiln
