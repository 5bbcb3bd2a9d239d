// Loads plugin libraries with Boost.DLL and keeps them loaded for the life of the loader.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kiln/plugin.hpp"

namespace kiln {

struct LoadedPlugin {
  std::string path;
  PluginDescriptor descriptor{};
  std::string error;  // non-empty when it failed to load
};

class PluginLoader {
 public:
  PluginLoader();
  ~PluginLoader();
  PluginLoader(const PluginLoader&) = delete;
  PluginLoader& operator=(const PluginLoader&) = delete;

  // Loads one library and registers its factories. Throws PluginError naming the file and, for an API
  // mismatch, both versions.
  const LoadedPlugin& load(const std::string& path, Registry& reg);
  // Loads every libkiln_*.so in `dir`; failures are recorded (see plugins()), not thrown.
  void load_dir(const std::string& dir, Registry& reg);
  const std::vector<LoadedPlugin>& plugins() const;
  // The default plugin directories: those of $KILN_PLUGIN_PATH (colon-separated) when it is set; otherwise
  // <exe dir>/../lib/kiln if it exists (the build tree and the install both lay plugins out there), else none.
  static std::vector<std::string> default_dirs();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
