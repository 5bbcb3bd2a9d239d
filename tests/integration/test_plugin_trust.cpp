// Who may have written a plugin before kiln runs its code, and what kiln says when a plugin's code takes it down while
// loading: the trust checks (owner, group- and world-writable file or directory), KILN_PLUGIN_PATH entries, crash and
// exit() reports, and `kiln plugins --check`. The misbehaving plugins are tests/plugins/load_faults.
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kLoadPlugins = fs::path(KILN_BINARY_DIR) / "test-plugins-load";
const char* const kRan = "static initializer ran";  // what every load_faults plugin prints when its code runs

// Runs kiln with `env` assignments before it (run_app has none). With KILN_PLUGIN_PATH empty only --plugin-dir
// directories are loaded.
kiln::test::AppResult kiln_with(const std::string& env, const std::string& args) {
  kiln::test::AppResult r;
  FILE* pipe = ::popen((env + " " + KILN_APP + " " + args + " 2>&1").c_str(), "r");
  if (!pipe) return {127, "popen failed"};
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// A plugin directory of its own holding a copy of libkiln_load_<kind>.so; returns the copy.
fs::path copy_plugin(const fs::path& dir, const std::string& kind) {
  fs::create_directories(dir);
  const fs::path to = dir / ("libkiln_load_" + kind + ".so");
  fs::copy_file(kLoadPlugins / to.filename(), to, fs::copy_options::overwrite_existing);
  ::chmod(dir.c_str(), 0755);
  ::chmod(to.c_str(), 0755);
  return to;
}

std::string plugins_in(const fs::path& dir) { return "--plugin-dir " + dir.string() + " plugins"; }

}  // namespace

TEST_CASE("kiln plugins refuses the plugins of a world-writable directory without running them", "[plugins]") {
  const fs::path dir = kiln::test::temp_dir("trust-dir") / "plugins";
  const fs::path lib = copy_plugin(dir, "probe");
  auto r = kiln_with("KILN_PLUGIN_PATH=", plugins_in(dir));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);  // the copy itself is fine: it loads and its code runs
  REQUIRE_THAT(r.output, Catch::Contains("load_probe 0.1.0 (API") && Catch::Contains(kRan));

  for (mode_t mode : {0777, 01777}) {  // the sticky bit stops no one from adding a file
    REQUIRE(::chmod(dir.c_str(), mode) == 0);
    r = kiln_with("KILN_PLUGIN_PATH=", plugins_in(dir));
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Catch::Contains("FAILED " + lib.string()) &&
                             Catch::Contains("its directory " + dir.string() + " is writable by every user") &&
                             Catch::Contains(mode == 0777 ? "(mode 0777, owner " : "(mode 1777, owner ") &&
                             Catch::Contains("chmod o-w " + dir.string()));
    CHECK_THAT(r.output, !Catch::Contains(kRan) && !Catch::Contains("load_probe 0.1.0 (API"));
  }
  ::chmod(dir.c_str(), 0755);
}

TEST_CASE("kiln plugins refuses a world- or group-writable plugin file without running it", "[plugins]") {
  const fs::path dir = kiln::test::temp_dir("trust-file") / "plugins";
  const fs::path lib = copy_plugin(dir, "probe");
  REQUIRE(::chmod(lib.c_str(), 0666) == 0);
  auto r = kiln_with("KILN_PLUGIN_PATH=", plugins_in(dir));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("FAILED " + lib.string()) &&
                           Catch::Contains(lib.string() + ": refused to load: the file is writable by every user") &&
                           Catch::Contains("mode 0666") && Catch::Contains("chmod o-w " + lib.string()));
  CHECK_THAT(r.output, !Catch::Contains(kRan));

  // Group-writable by the owner's private group (umask 002 makes every file so): that group is the owner alone.
  const group* own = ::getgrgid(::getegid());
  const passwd* me = ::getpwuid(::geteuid());
  if (own && me && me->pw_gid == own->gr_gid && (!own->gr_mem || !own->gr_mem[0])) {
    REQUIRE(::chown(lib.c_str(), ::geteuid(), ::getegid()) == 0);
    REQUIRE(::chmod(lib.c_str(), 0664) == 0);
    r = kiln_with("KILN_PLUGIN_PATH=", plugins_in(dir));
    INFO(r.output);
    CHECK_THAT(r.output, Catch::Contains("load_probe 0.1.0 (API") && Catch::Contains(kRan));
  }

  if (::geteuid() != 0) KILN_SKIP("group-writable case: needs root to give the file another group");
  // Group-writable by a group that is not the owner's private one (root's is gid 0): its members could replace it.
  REQUIRE(::chown(lib.c_str(), 0, 65534) == 0);
  REQUIRE(::chmod(lib.c_str(), 0664) == 0);
  r = kiln_with("KILN_PLUGIN_PATH=", plugins_in(dir));
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Contains("FAILED " + lib.string()) && Catch::Contains("is writable by group") &&
                           Catch::Contains("mode 0664") && Catch::Contains("chmod g-w " + lib.string()));
  CHECK_THAT(r.output, !Catch::Contains(kRan));
}

TEST_CASE("kiln plugins refuses a plugin file or directory owned by another user", "[plugins]") {
  if (::geteuid() != 0) KILN_SKIP("needs root to give a copy of a plugin to another user");
  const fs::path dir = kiln::test::temp_dir("trust-owner") / "plugins";
  const fs::path lib = copy_plugin(dir, "probe");
  REQUIRE(::chown(lib.c_str(), 65534, 0) == 0);  // nobody
  auto r = kiln_with("KILN_PLUGIN_PATH=", plugins_in(dir));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("FAILED " + lib.string()) && Catch::Contains("the file is owned by") &&
                           Catch::Contains("uid 65534") && Catch::Contains("not by you (root) or root") &&
                           Catch::Contains("mode 0755") && Catch::Contains("chown root " + lib.string()));
  CHECK_THAT(r.output, !Catch::Contains(kRan));

  REQUIRE(::chown(lib.c_str(), 0, 0) == 0);
  REQUIRE(::chown(dir.c_str(), 65534, 0) == 0);
  r = kiln_with("KILN_PLUGIN_PATH=", plugins_in(dir));
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Contains("FAILED " + lib.string()) &&
                           Catch::Contains("its directory " + dir.string() + " is owned by") &&
                           Catch::Contains("uid 65534"));
  CHECK_THAT(r.output, !Catch::Contains(kRan));
  ::chown(dir.c_str(), 0, 0);
}

TEST_CASE("a refused plugin that a run loads or requires is a plugin error with the reason", "[plugins]") {
  const fs::path base = kiln::test::temp_dir("trust-config");
  const fs::path lib = copy_plugin(base / "plugins", "probe");
  const std::string model = "[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"dense\"\nunits = 2\n";
  REQUIRE(::chmod(lib.c_str(), 0666) == 0);
  std::ofstream(base / "load.toml") << "[plugins]\nload = [\"" << lib.string() << "\"]\n" << model;
  auto r = kiln_with("", "train " + (base / "load.toml").string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output,
             Catch::Contains("plugin error: " + lib.string() + ": refused to load") && Catch::Contains("mode 0666"));
  CHECK_THAT(r.output, !Catch::Contains(kRan));

  REQUIRE(::chmod(lib.c_str(), 0755) == 0);
  REQUIRE(::chmod((base / "plugins").c_str(), 0777) == 0);
  std::ofstream(base / "require.toml") << "[plugins]\ndirs = [\"plugins\"]\nrequire = [\"load_probe\"]\n" << model;
  r = kiln_with("", "train " + (base / "require.toml").string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("require lists \"load_probe\" but it is not loaded") &&
                           Catch::Contains("is writable by every user (mode 0777"));
  CHECK_THAT(r.output, !Catch::Contains(kRan));
  ::chmod((base / "plugins").c_str(), 0755);
}

TEST_CASE("a KILN_PLUGIN_PATH entry that is missing or not a directory is a plugin error naming it", "[plugins]") {
  const std::string good = KILN_PLUGIN_DIR;
  auto r = kiln_with("KILN_PLUGIN_PATH=" + good + ":/nonexistent/kiln-plugins", "plugins");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("plugin error: KILN_PLUGIN_PATH entry \"/nonexistent/kiln-plugins\" does "
                                       "not exist (KILN_PLUGIN_PATH=" +
                                       good + ":/nonexistent/kiln-plugins)"));

  const fs::path file = kiln::test::temp_dir("trust-path") / "not-a-dir";
  std::ofstream(file) << "x";
  r = kiln_with("KILN_PLUGIN_PATH=" + file.string(), "plugins");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("KILN_PLUGIN_PATH entry \"" + file.string() + "\" is not a directory"));

  r = kiln_with("KILN_PLUGIN_PATH=:" + good + "::", "plugins");  // empty entries stay ignored
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("cpu 0.1.0 (API"));
}

TEST_CASE("a plugin that crashes in a static initializer is named with the signal", "[plugins]") {
  const fs::path lib = copy_plugin(kiln::test::temp_dir("trust-crash") / "plugins", "crash");
  auto r = kiln_with("KILN_PLUGIN_PATH=", plugins_in(lib.parent_path()));
  INFO(r.output);
  CHECK(r.exit_code == 128 + SIGSEGV);  // it still dies of the signal, as without the report
  CHECK_THAT(r.output, Catch::Contains("kiln: plugin " + lib.string() + " crashed while loading (signal " +
                                       std::to_string(SIGSEGV) + ": SIGSEGV)") &&
                           Catch::Contains("kiln plugins --check"));
}

TEST_CASE("a plugin that calls exit() in a static initializer is named", "[plugins]") {
  const fs::path lib = copy_plugin(kiln::test::temp_dir("trust-exit") / "plugins", "exit");
  auto r = kiln_with("KILN_PLUGIN_PATH=", plugins_in(lib.parent_path()));
  INFO(r.output);
  CHECK(r.exit_code == 3);  // the plugin's exit code
  CHECK_THAT(r.output, Catch::Contains("kiln: plugin " + lib.string() + " called exit() while loading"));
}

TEST_CASE("kiln plugins --check loads each plugin alone and reports OK FAILED CRASHED EXITED and HUNG", "[plugins]") {
  const fs::path base = kiln::test::temp_dir("trust-check");
  const fs::path probe = copy_plugin(base / "faults", "probe"), crash = copy_plugin(base / "faults", "crash"),
                 exits = copy_plugin(base / "faults", "exit"), open = copy_plugin(base / "open", "probe");
  REQUIRE(::chmod((base / "open").c_str(), 0777) == 0);
  auto r = kiln_with(
      "KILN_PLUGIN_PATH=" + std::string(KILN_PLUGIN_DIR),
      "--plugin-dir " + (base / "faults").string() + " --plugin-dir " + (base / "open").string() + " plugins --check");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output,
             Catch::Contains("OK       " + std::string(KILN_PLUGIN_DIR) + "/libkiln_cpu.so (cpu 0.1.0)") &&
                 Catch::Contains("OK       " + probe.string() + " (load_probe 0.1.0)") &&
                 Catch::Contains("CRASHED  " + crash.string() + " (signal " + std::to_string(SIGSEGV) + ": SIGSEGV)") &&
                 Catch::Contains("EXITED   " + exits.string() + " (exit code 3)") &&
                 Catch::Contains("FAILED   " + open.string()) && Catch::Contains("(mode 0777"));
  ::chmod((base / "open").c_str(), 0755);

  const fs::path hang = copy_plugin(base / "hang", "hang");
  r = kiln_with("KILN_PLUGIN_PATH=", plugins_in(hang.parent_path()) + " --check --check-timeout 1");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("HUNG     " + hang.string() + " (no answer within 1 s; killed)"));

  r = kiln_with("KILN_PLUGIN_PATH=" + std::string(KILN_PLUGIN_DIR), "plugins --check");  // this build's own: all OK
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains(" OK, 0 not"));
}
