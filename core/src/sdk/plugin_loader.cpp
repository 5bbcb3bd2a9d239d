// Loads plugins with Boost.DLL. Libraries stay loaded until the process exits, so no object or factory from a
// plugin can outlive its code.
#include "kiln/plugin_loader.hpp"

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstdlib>
#include <filesystem>

#include "kiln/error.hpp"
#include "kiln/files.hpp"
#include "plugin_loader_impl.hpp"

namespace kiln {

namespace fs = std::filesystem;

struct PluginLoader::Impl {
  std::vector<LoadedPlugin> plugins;
};

namespace {
// Loaded libraries are never unloaded: factories and objects made by them may live anywhere in the host.
std::vector<boost::dll::shared_library>& keep_alive() {
  static auto* libs = new std::vector<boost::dll::shared_library>();
  return *libs;
}
}  // namespace

PluginLoader::PluginLoader() : impl_(std::make_unique<Impl>()) {}
PluginLoader::~PluginLoader() = default;

const std::vector<LoadedPlugin>& PluginLoader::plugins() const { return impl_->plugins; }

const LoadedPlugin& PluginLoader::load(const std::string& path, Registry& reg) {
  if (!fs::exists(path)) throw PluginError(path + ": plugin library not found");
  // dlopen of a FIFO blocks until a writer comes; a directory or device is no library either.
  if (std::string what = regular_file_problem(path); !what.empty())
    throw PluginError(path + ": " + what + "; a plugin is a shared library file (libkiln_<name>.so)");
  // Before any of its code runs: the file, and its directory as listed and, for a symlink, where it really lives.
  std::string why = untrusted_reason(path, false);
  std::error_code ec;
  const fs::path real_dir = fs::canonical(path, ec).parent_path();
  const fs::path listed_dir = fs::weakly_canonical(fs::absolute(path).parent_path(), ec);
  if (why.empty()) why = untrusted_reason(listed_dir.string(), true);
  if (why.empty() && !real_dir.empty() && real_dir != listed_dir) why = untrusted_reason(real_dir.string(), true);
  if (!why.empty()) throw PluginError(path + ": refused to load: " + why);
  detail::PluginLoadGuard guard(path);
  boost::dll::shared_library lib;
  try {
    lib.load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    throw PluginError(path + ": cannot load plugin library: " + e.what());
  }
  if (!lib.has("kiln_plugin"))
    throw PluginError(path + ": not a Kiln plugin (no exported 'kiln_plugin' entry; define it with KILN_PLUGIN)");
  // The exported symbol is a pointer to the entry (Boost.DLL alias); a null one must not be dereferenced.
  const void* entry_ptr = lib.get<const void*>("kiln_plugin");
  if (!entry_ptr)
    throw PluginError(path +
                      ": the exported 'kiln_plugin' entry is a null pointer, expected the address of a "
                      "PluginEntry; define it with KILN_PLUGIN(descriptor, register_all)");
  const PluginEntry& entry = *static_cast<const PluginEntry*>(entry_ptr);
  if (!entry.descriptor || !entry.register_all)
    throw PluginError(path + ": the plugin entry's " +
                      (!entry.descriptor ? std::string("descriptor()") : std::string("register_all()")) +
                      " function is null; KILN_PLUGIN(descriptor, register_all) needs both functions");
  const PluginDescriptor* d = entry.descriptor();
  if (!d) throw PluginError(path + ": the plugin's descriptor() returned null, expected its PluginDescriptor");
  if (!d->name || !*d->name || !d->version)
    throw PluginError(path + ": the plugin's descriptor has no " + (!d->version ? "version" : "name") +
                      " (a null or empty string); every plugin needs a name and a version");
  if (d->api_version != kApiVersion)
    throw PluginError(path + ": plugin '" + (d->name ? d->name : "?") + "' was built for Kiln plugin API version " +
                      std::to_string(d->api_version) + ", but this Kiln (" + KILN_VERSION_STRING +
                      ") provides API version " + std::to_string(kApiVersion) +
                      "; rebuild the plugin against this SDK");
  std::string fp = d->fingerprint ? d->fingerprint : "";
  if (fp != KILN_BUILD_FINGERPRINT)
    throw PluginError(path + ": plugin '" + d->name + "' was built with " + fp + " but Kiln with " +
                      KILN_BUILD_FINGERPRINT + " (C++ ABI mismatch); rebuild the plugin with the same toolchain");
  for (const auto& p : impl_->plugins)
    if (p.error.empty() && p.descriptor.name && std::string(p.descriptor.name) == d->name)
      throw PluginError(path + ": plugin '" + d->name + "' is already loaded from " + p.path);
  reg.set_current_plugin(d->name);
  try {
    entry.register_all(reg);
  } catch (const std::exception& e) {
    reg.set_current_plugin("core");
    throw PluginError(path + ": plugin '" + d->name + "' failed to register: " + e.what());
  }
  reg.set_current_plugin("core");
  keep_alive().push_back(std::move(lib));
  impl_->plugins.push_back(LoadedPlugin{path, *d, {}});
  return impl_->plugins.back();
}

std::vector<std::string> PluginLoader::candidates(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    auto name = e.path().filename().string();
    if (name.rfind("libkiln_", 0) == 0 && e.path().extension() == ".so") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

void PluginLoader::load_dir(const std::string& dir, Registry& reg) {
  if (!fs::is_directory(dir)) return;
  // Anyone who can add a file here can run code as the user: refuse every plugin of such a directory.
  const std::string dir_why = untrusted_reason(dir, true);
  for (const auto& f : candidates(dir)) {
    try {
      if (!dir_why.empty()) throw PluginError(f + ": refused to load: " + dir_why);
      load(f, reg);
    } catch (const PluginError& e) {
      LoadedPlugin p;
      p.path = f;
      p.error = e.what();
      impl_->plugins.push_back(p);
    }
  }
}

std::vector<std::string> PluginLoader::default_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("KILN_PLUGIN_PATH")) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      auto end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) {
        std::string d = s.substr(start, end - start);
        std::error_code ec;
        const bool exists = fs::exists(d, ec);
        if (!exists || !fs::is_directory(d, ec))
          throw PluginError("KILN_PLUGIN_PATH entry \"" + d + "\" " +
                            (exists ? "is not a directory" : "does not exist") + " (KILN_PLUGIN_PATH=" + s +
                            "); every entry must be a plugin directory: correct or remove it, or unset "
                            "KILN_PLUGIN_PATH to load the plugins next to the kiln binary");
        dirs.push_back(d);
      }
      start = end + 1;
    }
    return dirs;
  }
  auto exe_dir = boost::dll::program_location().parent_path();
  auto lib = exe_dir.parent_path() / "lib" / "kiln";
  if (fs::is_directory(lib.string())) dirs.push_back(lib.string());
  return dirs;
}

}  // namespace kiln
