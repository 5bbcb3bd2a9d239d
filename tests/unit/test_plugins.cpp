// Plugin loading: the real Boost.DLL path, including the failures users hit: a plugin with a null entry, null
// functions or a null descriptor is a PluginError naming the file, never a segfault.
#include <catch2/catch.hpp>
#include <filesystem>

#include "kiln/error.hpp"
#include "kiln/plugin_loader.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

TEST_CASE("the build's plugins load and register their factories", "[plugins]") {
  auto& reg = kiln::test::registry();
  CHECK(reg.has_backend("cpu"));
  CHECK(reg.has_stage("idx"));
  CHECK(reg.has_layer("dense"));
  CHECK(reg.has_strategy("single"));
  for (const auto& p : kiln::test::loader().plugins()) {
    INFO(p.path << ": " << p.error);
    CHECK(p.error.empty());
  }
}

TEST_CASE("a plugin built for another API version is refused naming the file and both versions", "[plugins]") {
  kiln::PluginLoader loader;
  kiln::Registry reg;
  std::string path = std::string(KILN_TEST_PLUGIN_DIR) + "/libkiln_bad_api.so";
  REQUIRE(std::filesystem::exists(path));
  try {
    loader.load(path, reg);
    FAIL("the mismatched plugin was accepted");
  } catch (const kiln::PluginError& e) {
    std::string m = e.what();
    CHECK_THAT(m, Catch::Contains(path));
    CHECK_THAT(m, Catch::Contains("API version " + std::to_string(kiln::kApiVersion + 1)));
    CHECK_THAT(m, Catch::Contains("API version " + std::to_string(kiln::kApiVersion)));
  }
  CHECK_FALSE(reg.has_stage("never_registered"));
}

TEST_CASE("a library without the Kiln entry is refused", "[plugins]") {
  kiln::PluginLoader loader;
  kiln::Registry reg;
  std::string path = std::string(KILN_TEST_PLUGIN_DIR) + "/libkiln_no_entry.so";
  REQUIRE(std::filesystem::exists(path));
  CHECK_THROWS_WITH(loader.load(path, reg), Catch::Contains("not a Kiln plugin") && Catch::Contains(path));
}

TEST_CASE("plugins with a null entry, null functions, a null descriptor or no name are refused naming the file",
          "[hardening][plugins]") {
  struct Case {
    const char* lib;
    const char* says;
  };
  const Case cases[] = {
      {"libkiln_null_entry.so", "'kiln_plugin' entry is a null pointer"},
      {"libkiln_null_descriptor_fn.so", "descriptor() function is null"},
      {"libkiln_null_register_fn.so", "register_all() function is null"},
      {"libkiln_null_descriptor.so", "descriptor() returned null"},
      {"libkiln_null_name.so", "has no name"},
  };
  for (const auto& c : cases) {
    const std::string path = std::string(KILN_TEST_PLUGIN_DIR) + "/" + c.lib;
    INFO(path);
    REQUIRE(fs::exists(path));
    kiln::PluginLoader loader;
    kiln::Registry reg;
    CHECK_THROWS_MATCHES(loader.load(path, reg), kiln::PluginError,
                         Catch::Matchers::Predicate<kiln::PluginError>([&](const kiln::PluginError& e) {
                           const std::string m = e.what();
                           return m.find(path) != std::string::npos && m.find(c.says) != std::string::npos;
                         }));
    CHECK_FALSE(reg.has_stage("never_registered"));
  }
}

TEST_CASE("a missing plugin library is an error naming the path", "[plugins]") {
  kiln::PluginLoader loader;
  kiln::Registry reg;
  CHECK_THROWS_WITH(loader.load("/nowhere/libkiln_ghost.so", reg),
                    Catch::Contains("/nowhere/libkiln_ghost.so") && Catch::Contains("not found"));
}

TEST_CASE("load_dir records failures instead of throwing", "[plugins]") {
  kiln::PluginLoader loader;
  kiln::Registry reg;
  loader.load_dir(KILN_TEST_PLUGIN_DIR, reg);
  int failed = 0, libs = 0;
  for (const auto& p : loader.plugins()) failed += !p.error.empty();
  for (const auto& e : std::filesystem::directory_iterator(KILN_TEST_PLUGIN_DIR))
    libs += e.path().filename().string().rfind("libkiln_", 0) == 0 && e.path().extension() == ".so";
  CHECK(failed == libs);  // every test plugin is broken on purpose (bad_api, no_entry, null_*)
  CHECK(failed >= 7);
}

TEST_CASE("registry lookups of unknown names list what is registered", "[plugins]") {
  auto& reg = kiln::test::registry();
  CHECK_THROWS_WITH(reg.backend("tpu"), Catch::Contains("unknown backend 'tpu'") && Catch::Contains("cpu"));
}
