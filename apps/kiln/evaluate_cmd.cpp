// kiln evaluate CONFIG [--checkpoint F] [--data NAME]: the trainer's evaluation (same function, same weights) of a
// checkpoint, printed and written to <output_dir>/evaluate_<NAME>.json.
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "kiln/error.hpp"
#include "kiln/evaluation.hpp"
#include "model_io.hpp"

namespace kiln::app {

int cmd_evaluate(const Options& o) {
  auto m = load_trained_model(o);
  Session& s = *m->session;
  std::unique_ptr<Stage> data = s.make_pipeline(o.data);
  if (!data) throw ConfigError(o.config + ": has no [data." + o.data + "] pipeline to evaluate on (--data)");
  // The label shape the trainer built its graphs with (the train pipeline's), else this pipeline's.
  std::unique_ptr<Stage> train = o.data == "train" ? nullptr : s.make_pipeline("train");
  auto runner = make_inference_runner(*m, (train ? *train : *data).label_shape());
  Evaluation ev = evaluate(*runner, *data, s.model(), /*use_ema=*/false);  // the EMA values are loaded as the weights

  const std::string weights = m->ema ? "ema" : "raw";
  std::cout << "evaluated " << m->checkpoint_path << " (epoch " << m->checkpoint.epoch << ", step "
            << m->checkpoint.step << ", " << weights << " weights) on " << describe_source(s.config(), o.data) << ": "
            << ev.examples << " examples, loss " << std::setprecision(6) << ev.loss;
  if (ev.accuracy >= 0) std::cout << ", accuracy " << std::setprecision(4) << ev.accuracy;
  std::cout << "\n";

  std::ostringstream js;
  js << "{\"event\":\"evaluate\",\"checkpoint\":" << json_str(m->checkpoint_path)
     << ",\"epoch\":" << m->checkpoint.epoch << ",\"step\":" << m->checkpoint.step << ",\"data\":" << json_str(o.data)
     << ",\"weights\":" << json_str(weights) << ",\"examples\":" << ev.examples << ",\"loss\":" << json_double(ev.loss)
     << ",\"accuracy\":" << (ev.accuracy >= 0 ? json_double(ev.accuracy) : "null") << "}\n";
  const std::string dir = s.train().output_dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = dir + "/evaluate_" + o.data + ".json";  // Kiln's own file in the run directory
  write_file_atomic(path, js.str());
  std::cout << "wrote " << path << "\n";
  return 0;
}

}  // namespace kiln::app
