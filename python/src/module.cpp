// The extension module kiln._kiln: RunCore and the app's devices / plugins / conformance for Python, Kiln's errors as
// Python exceptions, the GIL released while the devices work. The Python side (kiln/__init__.py) builds the API on it.
#include <pthread.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <signal.h>

#include <cstring>
#include <exception>
#include <iostream>
#include <streambuf>

#include "commands.hpp"
#include "generator_source.hpp"
#include "kiln/allocator.hpp"
#include "kiln/conformance.hpp"
#include "kiln/error.hpp"
#include "kiln/reservation.hpp"
#include "run_core.hpp"

namespace py = pybind11;
using namespace kiln;
using kiln::python::RunCore;

namespace {

// A streambuf writing to Python's sys.stdout (taking the GIL), so progress shows where Python's output goes (a
// notebook, pytest's capture) in order with it. Written a line (or a flush) at a time.
class PyStdout : public std::streambuf {
 public:
  ~PyStdout() override { flush(); }

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    buf_ += traits_type::to_char_type(c);
    if (buf_.back() == '\n') flush();
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    buf_.append(s, static_cast<size_t>(n));
    if (std::memchr(s, '\n', static_cast<size_t>(n))) flush();
    return n;
  }
  int sync() override {
    flush();
    return 0;
  }

 private:
  void flush() {
    if (buf_.empty()) return;
    py::gil_scoped_acquire g;
    try {
      py::object out = py::module_::import("sys").attr("stdout");
      if (!out.is_none()) {
        out.attr("write")(buf_);
        out.attr("flush")();
      }
    } catch (py::error_already_set&) {  // a closed or replaced sys.stdout: progress is not worth an error
      PyErr_Clear();
    }
    buf_.clear();
  }
  std::string buf_;
};

HostTensor to_host(const py::array_t<float, py::array::c_style | py::array::forcecast>& a) {
  HostTensor t;
  std::vector<int64_t> dims(a.shape(), a.shape() + a.ndim());
  t.shape = Shape(std::move(dims));
  t.data.assign(a.data(), a.data() + a.size());
  return t;
}

py::array_t<float> to_numpy(const HostTensor& t) {
  std::vector<py::ssize_t> dims(t.shape.dims().begin(), t.shape.dims().end());
  py::array_t<float> a(dims);
  if (!t.data.empty()) std::memcpy(a.mutable_data(), t.data.data(), t.bytes());
  return a;
}

// A weight as a NumPy array: a view of the runner's buffer, whose base (a capsule holding the loaded model) keeps
// the buffer, its allocator and its device alive as long as any array over it lives; else a copy.
py::array_t<float> weight_array(const python::Weight& w) {
  if (w.view.empty()) return to_numpy(w.copy);
  auto* keep = new std::shared_ptr<python::LoadedModel>(w.owner);
  py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<python::LoadedModel>*>(p); });
  std::vector<py::ssize_t> dims(w.shape.dims().begin(), w.shape.dims().end());
  return py::array_t<float>(dims, w.view.data(), base);  // writeable: it is the model's memory
}

py::dict epoch_dict(const EpochMetrics& e) {
  py::dict d;
  d["epoch"] = e.epoch;
  d["train_loss"] = e.train_loss;
  d["test_loss"] = e.test_loss >= 0 ? py::cast(e.test_loss) : py::none();
  d["test_accuracy"] = e.test_accuracy >= 0 ? py::cast(e.test_accuracy) : py::none();
  d["seconds"] = e.seconds;
  d["examples_per_s"] = e.examples_per_s;
  d["s_per_batch"] = e.s_per_batch;
  d["input_wait_fraction"] = e.input_wait_fraction;
  return d;
}

py::list plugin_dirs_list(const std::vector<std::string>& extra) {
  py::list l;
  for (const auto& d : PluginLoader::default_dirs()) l.append(d);
  for (const auto& d : extra) l.append(d);
  return l;
}

py::list devices(const std::vector<std::string>& plugin_dirs, const std::string& backend) {
  app::Options o;
  o.plugin_dirs = plugin_dirs;
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  app::load_plugins(o, loader, reg);
  const std::string root = reservation_root();
  py::list out;
  for (const auto& name : reg.backend_names()) {
    if (!backend.empty() && name != backend) continue;
    auto b = reg.backend(name)(BackendOptions{});
    auto list = b->enumerate();
    for (const auto& d : list) {
      py::dict e;
      e["label"] = d.label();
      e["backend"] = d.backend;
      e["index"] = d.index;
      e["name"] = d.name;
      e["type"] = std::string(device_type_name(d.type));
      e["host_addressable"] = d.host_addressable;
      e["hardware_id"] = d.hardware_id;
      e["total_memory"] = d.total_memory;
      e["free_memory"] = d.free_memory;
      e["processes"] = d.processes;
      e["reserved_by_kiln"] = total_bytes(live_reservations(d.hardware_id, root));
      out.append(e);
    }
    if (list.empty()) {
      py::dict e;
      e["backend"] = name;
      e["unavailable"] = b->unavailable_reason();
      out.append(e);
    }
  }
  return out;
}

py::list plugins(const std::vector<std::string>& plugin_dirs) {
  app::Options o;
  o.plugin_dirs = plugin_dirs;
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  app::load_plugins(o, loader, reg);
  py::list out;
  auto provides = [&](const std::string& n) {
    return reg.provided().count(n) ? reg.provided().at(n) : std::vector<std::string>{};
  };
  py::dict core;
  core["name"] = "core";
  core["version"] = KILN_VERSION_STRING;
  core["path"] = "(built in)";
  core["provides"] = provides("core");
  out.append(core);
  for (const auto& p : loader.plugins()) {
    py::dict e;
    e["path"] = p.path;
    if (!p.error.empty()) {
      e["error"] = p.error;
    } else {
      e["name"] = p.descriptor.name ? p.descriptor.name : "";
      e["version"] = p.descriptor.version ? p.descriptor.version : "";
      e["api_version"] = p.descriptor.api_version;
      e["description"] = p.descriptor.description ? p.descriptor.description : "";
      e["provides"] = provides(p.descriptor.name ? p.descriptor.name : "");
    }
    out.append(e);
  }
  return out;
}

int conformance(const std::vector<std::string>& plugin_dirs, const std::string& backend, int device,
                const std::string& op, const std::string& case_id, const std::string& report, const std::string& matrix,
                const std::string& tolerance_dir) {
  app::Options o;
  o.plugin_dirs = plugin_dirs;
  o.backend = backend;
  o.device_index = device;
  o.op_filter = op;
  o.case_id = case_id;
  o.report = report;
  o.matrix = matrix;
  o.tolerance_dir = tolerance_dir;
  PyStdout buf;
  auto* old = std::cout.rdbuf(&buf);
  int rc = 1;
  try {
    py::gil_scoped_release r;
    rc = app::cmd_conformance(o);
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  std::cout.rdbuf(old);
  return rc;
}

// Python's exception types, created in PYBIND11_MODULE; the translator raises them with Kiln's message.
struct Exceptions {
  PyObject *error, *config, *plugin, *data, *device, *oom, *numeric;
} exc;

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const Interrupted& e) {  // SIGINT / SIGTERM: the step finished and a checkpoint was written
    PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
  } catch (const OutOfMemory& e) {
    py::object err = py::reinterpret_borrow<py::object>(exc.oom)(e.what());
    err.attr("report") = e.what();
    err.attr("requested") = e.requested();
    PyErr_SetObject(exc.oom, err.ptr());
  } catch (const ConfigError& e) {
    PyErr_SetString(exc.config, e.what());
  } catch (const PluginError& e) {
    PyErr_SetString(exc.plugin, e.what());
  } catch (const DataError& e) {
    PyErr_SetString(exc.data, e.what());
  } catch (const DeviceError& e) {
    PyErr_SetString(exc.device, e.what());
  } catch (const NumericError& e) {
    PyErr_SetString(exc.numeric, e.what());
  } catch (const Error& e) {
    PyErr_SetString(exc.error, e.what());
  }
}

PyObject* new_exception(py::module_& m, const char* name, PyObject* base, const char* doc) {
  const std::string full = std::string("kiln.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(full.c_str(), doc, base, nullptr);
  if (!t) throw py::error_already_set();
  m.add_object(name, py::handle(t));
  return t;
}

// fit(): the trainer runs on this thread with the GIL released; each metrics.jsonl record is handed to `on_record`
// with the GIL taken. When the callback raises, the run is stopped as a Ctrl-C stops it (SIGINT to this thread: the
// step finishes, a checkpoint is written) and the callback's exception is raised instead of KeyboardInterrupt.
py::dict fit(RunCore& run, py::object on_record, bool resume, bool overwrite,
             const std::vector<std::string>& extra_overrides) {
  std::exception_ptr callback_error;
  std::function<void(const std::string&)> hook;
  // The SIGINT handler before the trainer installs its own: a record written while it is back (none is, today)
  // must not send Python a Ctrl-C.
  struct sigaction before {};
  sigaction(SIGINT, nullptr, &before);
  if (!on_record.is_none())
    hook = [&](const std::string& line) {
      py::gil_scoped_acquire g;
      if (callback_error) return;
      try {
        on_record(line);
      } catch (py::error_already_set&) {
        callback_error = std::current_exception();
        struct sigaction now {};
        sigaction(SIGINT, nullptr, &now);
        if (now.sa_handler != before.sa_handler) pthread_kill(pthread_self(), SIGINT);
      }
    };
  PyStdout buf;
  std::ostream out(&buf);
  TrainReport rep;
  try {
    py::gil_scoped_release r;
    rep = run.fit(out, hook, resume, overwrite, extra_overrides);
  } catch (const Interrupted&) {
    if (callback_error) std::rethrow_exception(callback_error);
    throw;
  }
  if (callback_error) std::rethrow_exception(callback_error);
  py::dict d;
  d["steps"] = rep.steps;
  d["seconds"] = rep.seconds;
  py::list epochs;
  for (const auto& e : rep.epochs) epochs.append(epoch_dict(e));
  d["epochs"] = epochs;
  d["final"] = rep.final_metrics    ? epoch_dict(*rep.final_metrics)
               : rep.epochs.empty() ? py::object(py::none())
                                    : epoch_dict(rep.epochs.back());
  d["restored"] = rep.final_metrics.has_value();
  return d;
}

py::dict plan(RunCore& run) {
  python::PlanResult r;
  {
    py::gil_scoped_release g;
    r = run.plan();
  }
  py::dict d;
  d["report"] = r.check.report;
  d["fits"] = r.check.fits;
  d["blocked"] = r.check.blocked;
  d["worst_need"] = r.check.worst_need;
  d["largest_batch"] = r.largest_batch;
  d["batch_size"] = r.batch_size;
  py::list devs;
  for (size_t i = 0; i < r.check.plans.size(); ++i) {
    const DevicePlan& p = r.check.plans[i];
    py::dict e;
    e["device"] = p.device;
    e["parameters"] = p.parameters;
    e["gradients"] = p.gradients;
    e["optimizer_state"] = p.optimizer_state;
    e["activations"] = p.activations;
    e["workspace"] = p.workspace;
    e["input_data"] = p.input_data;
    e["total"] = p.total();
    e["limit"] = i < r.check.limits.size() ? r.check.limits[i] : 0;
    e["notes"] = p.notes;
    devs.append(e);
  }
  d["devices"] = devs;
  return d;
}

py::dict py_evaluate(RunCore& run, const std::string& data) {
  Evaluation ev;
  std::string where;
  {
    py::gil_scoped_release g;
    ev = run.evaluate(data, where);
  }
  py::dict d;
  d["loss"] = ev.loss;
  d["accuracy"] = ev.accuracy >= 0 ? py::cast(ev.accuracy) : py::none();
  d["examples"] = ev.examples;
  d["losses"] = ev.losses;
  d["accuracies"] = ev.accuracies;
  d["data"] = where;
  return d;
}

py::array_t<float> predict(RunCore& run, const py::array_t<float, py::array::c_style | py::array::forcecast>& x) {
  HostTensor in = to_host(x);
  HostTensor out;
  {
    py::gil_scoped_release g;
    out = run.predict(std::move(in));
  }
  return to_numpy(out);
}

}  // namespace

PYBIND11_MODULE(_kiln, m) {
  m.doc() = "Kiln's C++ core (libkiln_train) for the kiln package; use kiln.Run, not this module.";
  exc.error = new_exception(m, "Error", PyExc_Exception, "Base of every error Kiln raises on purpose.");
  exc.config = new_exception(m, "ConfigError", exc.error, "A bad configuration value, key or file.");
  exc.plugin = new_exception(m, "PluginError", exc.error, "A plugin could not be loaded or registered.");
  exc.data = new_exception(m, "DataError", exc.error, "Input data is missing, truncated or malformed.");
  exc.device = new_exception(m, "DeviceError", exc.error, "A device or driver call failed.");
  exc.oom = new_exception(m, "OutOfMemory", exc.error,
                          "The step does not fit the device's memory limit; .report holds the memory report.");
  exc.numeric = new_exception(m, "NumericError", exc.error, "A non-finite loss or activation stopped the run.");
  py::register_exception_translator(translate);

  m.attr("__version__") = KILN_VERSION_STRING;
  m.attr("build") = KILN_BUILD_FINGERPRINT;
  m.attr("api_version") = kApiVersion;

  py::class_<RunCore>(m, "RunCore")
      .def(py::init([](std::string config, std::vector<std::string> overrides, std::vector<std::string> dirs,
                       py::dict arrays, py::dict generators) {
             std::map<std::string, python::ArrayData> a;
             for (auto [k, v] : arrays) {
               auto t = v.cast<py::tuple>();
               auto x = t[0].cast<py::array_t<float, py::array::c_style>>();
               auto y = t[1].cast<py::array_t<float, py::array::c_style>>();
               python::ArrayData d;
               d.x = x.data();
               d.x_shape.assign(x.shape(), x.shape() + x.ndim());
               d.y = y.data();
               d.y_shape.assign(y.shape(), y.shape() + y.ndim());
               a.emplace(k.cast<std::string>(), std::move(d));
             }
             std::function<void(Registry&)> more;
             if (!generators.empty()) {
               auto gens = std::make_shared<std::map<std::string, python::GeneratorSpec>>();
               for (auto [k, v] : generators) {
                 auto t = v.cast<py::tuple>();
                 gens->emplace(k.cast<std::string>(),
                               python::GeneratorSpec{t[0].cast<py::object>(), t[1].cast<bool>(), t[2].cast<bool>()});
               }
               StageFactory f = python::generator_stage_factory(std::move(gens));
               more = [f](Registry& reg) { reg.add_stage("generator", f); };
             }
             py::gil_scoped_release g;
             return std::make_unique<RunCore>(std::move(config), std::move(overrides), std::move(dirs), std::move(a),
                                              std::move(more));
           }),
           py::arg("config"), py::arg("overrides"), py::arg("plugin_dirs"), py::arg("arrays"), py::arg("generators"))
      .def_property_readonly("config", &RunCore::config)
      .def("output_dir", &RunCore::output_dir)
      .def("plan", &plan)
      .def("fit", &fit, py::arg("on_record"), py::arg("resume"), py::arg("overwrite"), py::arg("extra_overrides"))
      .def("evaluate", &py_evaluate, py::arg("data"))
      .def("predict", &predict, py::arg("x"))
      .def("predict_columns", &RunCore::predict_columns)
      .def("model_info",
           [](RunCore& r) {
             python::ModelInfo i;
             {
               py::gil_scoped_release g;
               i = r.model_info();
             }
             py::dict d;
             d["checkpoint"] = i.checkpoint;
             d["epoch"] = i.epoch;
             d["step"] = i.step;
             d["weights"] = i.ema ? "ema" : "raw";
             return d;
           })
      .def("weights",
           [](RunCore& r) {
             std::vector<python::Weight> w;
             {
               py::gil_scoped_release g;
               w = r.weights();
             }
             py::list out;
             for (const auto& x : w) out.append(py::make_tuple(x.name, weight_array(x), !x.view.empty()));
             return out;
           })
      .def(
          "weight",
          [](RunCore& r, const std::string& name) {
            python::Weight w;
            {
              py::gil_scoped_release g;
              w = r.weight(name);
            }
            return py::make_tuple(weight_array(w), !w.view.empty());
          },
          py::arg("name"))
      .def("set_weight",
           [](RunCore& r, const std::string& name,
              const py::array_t<float, py::array::c_style | py::array::forcecast>& a) {
             HostTensor t = to_host(a);
             py::gil_scoped_release g;
             r.set_weight(name, std::move(t));
           })
      .def("export",
           [](RunCore& r, const std::string& path, const std::string& format, const std::string& dtype, bool overwrite,
              const std::string& checkpoint) {
             PyStdout buf;
             std::ostream out(&buf);
             py::gil_scoped_release g;
             r.export_to(path, format, dtype, overwrite, checkpoint, out);
           })
      .def("close", [](RunCore& r) {
        py::gil_scoped_release g;
        r.close();
      });

  m.def("plugin_dirs", &plugin_dirs_list, py::arg("extra"));
  m.def("devices", &devices, py::arg("plugin_dirs"), py::arg("backend") = "");
  m.def("plugins", &plugins, py::arg("plugin_dirs"));
  m.def("conformance", &conformance, py::arg("plugin_dirs"), py::arg("backend"), py::arg("device") = 0,
        py::arg("op") = "", py::arg("case_id") = "", py::arg("report") = "", py::arg("matrix") = "",
        py::arg("tolerance_dir") = "");
}
