// Who may have written a plugin before its code runs in this process, and what happens when that code crashes:
// loading a plugin runs its static initializers with the user's rights, so, as ssh and sudo do with their files,
// Kiln refuses a library that another user could have written, and names the plugin that took the process down.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <vector>

#include "kiln/plugin_loader.hpp"
#include "plugin_loader_impl.hpp"

namespace kiln {

namespace {

std::string user_name(uid_t uid) {
  std::vector<char> buf(16384);
  passwd pw{}, *res = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &res) == 0 && res) return pw.pw_name;
  return "uid " + std::to_string(uid);
}

std::string group_name(gid_t gid) {
  std::vector<char> buf(16384);
  group gr{}, *res = nullptr;
  if (::getgrgid_r(gid, &gr, buf.data(), buf.size(), &res) == 0 && res) return gr.gr_name;
  return "gid " + std::to_string(gid);
}

// A user private group (the owner's primary group, no other member listed) is the owner alone: group write there is
// what umask 002 gives every file on distributions that make such groups, and no one else gains anything from it.
bool private_group(gid_t gid, uid_t owner) {
  std::vector<char> pbuf(16384), gbuf(65536);
  passwd pw{}, *pres = nullptr;
  group gr{}, *gres = nullptr;
  if (::getpwuid_r(owner, &pw, pbuf.data(), pbuf.size(), &pres) != 0 || !pres || pw.pw_gid != gid) return false;
  if (::getgrgid_r(gid, &gr, gbuf.data(), gbuf.size(), &gres) != 0 || !gres) return false;
  for (char** m = gr.gr_mem; m && *m; ++m)
    if (std::strcmp(*m, pw.pw_name) != 0) return false;
  return true;
}

std::string octal_mode(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", unsigned(m & 07777));
  return buf;
}

}  // namespace

std::string PluginLoader::untrusted_reason(const std::string& path, bool is_dir) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "cannot read the permissions of " + path + ": " + std::strerror(errno);
  const uid_t me = ::geteuid();
  const std::string what = is_dir ? "its directory " + path : std::string("the file");
  const std::string facts =
      " (mode " + octal_mode(st.st_mode) + ", owner " + user_name(st.st_uid) + ", group " + group_name(st.st_gid) + ")";
  const std::string harm = is_dir ? "add a library that kiln would run" : "replace the code kiln would run";
  if (st.st_uid != me && st.st_uid != 0) {
    std::string owner = user_name(st.st_uid);
    if (owner.rfind("uid ", 0) != 0) owner += " (uid " + std::to_string(st.st_uid) + ")";
    return what + " is owned by " + owner + ", not by you (" + user_name(me) + ") or root" + facts +
           ", so its owner could " + harm + "; fix: " +
           (is_dir ? "load plugins from a directory of your own, or chown " + user_name(me) + " " + path
                   : "chown " + user_name(me) + " " + path + ", or copy it into a plugin directory of your own");
  }
  const bool group_bad = (st.st_mode & S_IWGRP) && !private_group(st.st_gid, st.st_uid);
  const bool world = st.st_mode & S_IWOTH;
  const std::string fix = std::string("; fix: chmod ") + (group_bad ? "g" : "") + (world ? "o" : "") + "-w " + path;
  if (world)
    return what + " is writable by every user" + facts + ", so anyone could " + harm +
           (is_dir && (st.st_mode & S_ISVTX) ? " (the sticky bit does not stop anyone adding a file)" : "") + fix;
  if (group_bad)
    return what + " is writable by group " + group_name(st.st_gid) + facts + ", so its members could " + harm + fix;
  return {};
}

namespace detail {

namespace {

constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
char g_path[4096];  // the plugin being loaded; read by the handlers, which must not allocate
volatile sig_atomic_t g_active = 0;
volatile sig_atomic_t g_quiet = 0;
const char* const kAdvice = "; remove it from the plugin directory or check it with `kiln plugins --check`\n";

// Appends for an async-signal-safe message: no allocation, no locale, no stdio.
void append(char* buf, size_t cap, size_t& len, const char* s) {
  while (*s && len + 1 < cap) buf[len++] = *s++;
}
void append_int(char* buf, size_t cap, size_t& len, int v) {
  char digits[12];
  int n = 0;
  unsigned u = v < 0 ? 0u - unsigned(v) : unsigned(v);
  do digits[n++] = char('0' + u % 10);
  while ((u /= 10) && n < 11);
  if (v < 0 && len + 1 < cap) buf[len++] = '-';
  while (n > 0 && len + 1 < cap) buf[len++] = digits[--n];
}

const char* crash_signal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGILL:
      return "SIGILL";
    case SIGFPE:
      return "SIGFPE";
    case SIGABRT:
      return "SIGABRT";
    default:
      return "?";
  }
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= size_t(w);
  }
}

void on_crash(int sig) {
  if (g_active && !g_quiet) {
    char buf[4600];
    size_t len = 0;
    append(buf, sizeof buf, len, "kiln: plugin ");
    append(buf, sizeof buf, len, g_path);
    append(buf, sizeof buf, len, " crashed while loading (signal ");
    append_int(buf, sizeof buf, len, sig);
    append(buf, sizeof buf, len, ": ");
    append(buf, sizeof buf, len, crash_signal_name(sig));
    append(buf, sizeof buf, len, ")");
    append(buf, sizeof buf, len, kAdvice);
    write_all(STDERR_FILENO, buf, len);
  }
  // Die of the same signal, as without the handler (exit status, core dump): a fault re-executes and a raised
  // signal stays pending until the handler returns.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

void report_exit_during_load() {
  if (!g_active || g_quiet) return;
  char buf[4600];
  size_t len = 0;
  append(buf, sizeof buf, len, "kiln: plugin ");
  append(buf, sizeof buf, len, g_path);
  append(buf, sizeof buf, len, " called exit() while loading, which ended kiln");
  append(buf, sizeof buf, len, kAdvice);
  write_all(STDERR_FILENO, buf, len);
}

void set_path(const std::string& p) {
  size_t n = std::min(p.size(), sizeof g_path - 1);
  std::memcpy(g_path, p.data(), n);
  g_path[n] = 0;
}

}  // namespace

PluginLoadGuard::PluginLoadGuard(const std::string& path) : previous_(g_path), was_active_(g_active != 0) {
  static const bool registered = std::atexit(report_exit_during_load) == 0;
  (void)registered;
  g_active = 0;
  set_path(path);
  struct sigaction sa {};
  sa.sa_handler = on_crash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_ONSTACK;  // an initializer that overflowed the stack still gets its line (if an alt stack is set)
  for (int i = 0; i < kSignals; ++i) ::sigaction(kCrashSignals[i], &sa, &old_[i]);
  g_active = 1;
}

PluginLoadGuard::~PluginLoadGuard() {
  g_active = 0;
  for (int i = 0; i < kSignals; ++i) ::sigaction(kCrashSignals[i], &old_[i], nullptr);
  set_path(previous_);
  g_active = was_active_;
}

void PluginLoadGuard::quiet() { g_quiet = 1; }

std::string signal_name(int sig) {
  static const std::pair<int, const char*> names[] = {
      {SIGSEGV, "SIGSEGV"}, {SIGBUS, "SIGBUS"},   {SIGILL, "SIGILL"},   {SIGFPE, "SIGFPE"},   {SIGABRT, "SIGABRT"},
      {SIGKILL, "SIGKILL"}, {SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"},   {SIGPIPE, "SIGPIPE"}, {SIGTRAP, "SIGTRAP"},
      {SIGSYS, "SIGSYS"},   {SIGHUP, "SIGHUP"},   {SIGQUIT, "SIGQUIT"}, {SIGALRM, "SIGALRM"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"}, {SIGUSR1, "SIGUSR1"}, {SIGUSR2, "SIGUSR2"}};
  for (const auto& [n, name] : names)
    if (n == sig) return name;
  return "signal " + std::to_string(sig);
}

}  // namespace detail

namespace {

// Reads what is there without blocking; closes and forgets `fd` at end of file.
void drain(int& fd, std::string& into) {
  char buf[4096];
  while (fd >= 0) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, size_t(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        ::close(fd);
        fd = -1;
      }
      return;
    }
  }
}

[[noreturn]] void check_in_child(const std::string& path, int result_fd, int output_fd) {
  ::setpgid(0, 0);  // its own group: a timeout kills whatever the plugin started too
  int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
  ::dup2(output_fd, STDOUT_FILENO);
  ::dup2(output_fd, STDERR_FILENO);
  detail::PluginLoadGuard::quiet();
  std::string msg;
  try {
    PluginLoader loader;
    Registry reg = Registry::with_builtins();
    const LoadedPlugin& p = loader.load(path, reg);
    msg = std::string("OK ") + p.descriptor.name + " " + (p.descriptor.version ? p.descriptor.version : "?");
  } catch (const std::exception& e) {
    msg = std::string("FAILED ") + e.what();
  } catch (...) {
    msg = "FAILED an exception that is not a std::exception";
  }
  std::cout.flush();
  std::fflush(nullptr);
  detail::write_all(result_fd, msg.data(), msg.size());
  ::_exit(0);  // no destructors or atexit handlers: the plugin's code ran in this process
}

}  // namespace

PluginCheck PluginLoader::check(const std::string& path, std::chrono::milliseconds timeout) {
  PluginCheck c;
  int res[2], out[2];
  if (::pipe2(res, O_CLOEXEC) != 0) {
    c.result = PluginCheck::Result::failed;
    c.detail = path + ": cannot check it: pipe2: " + std::strerror(errno);
    return c;
  }
  if (::pipe2(out, O_CLOEXEC) != 0) {
    c.result = PluginCheck::Result::failed;
    c.detail = path + ": cannot check it: pipe2: " + std::strerror(errno);
    ::close(res[0]);
    ::close(res[1]);
    return c;
  }
  std::cout.flush();  // or the child's copy of unwritten output would come out twice
  std::cerr.flush();
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(res[0]);
    ::close(out[0]);
    check_in_child(path, res[1], out[1]);
  }
  ::close(res[1]);
  ::close(out[1]);
  if (pid < 0) {
    ::close(res[0]);
    ::close(out[0]);
    c.result = PluginCheck::Result::failed;
    c.detail = path + ": cannot check it: fork: " + std::strerror(errno);
    return c;
  }
  ::fcntl(res[0], F_SETFL, O_NONBLOCK);
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  int rfd = res[0], ofd = out[0], status = 0;
  std::string result;
  bool hung = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pollfd fds[2] = {{rfd, POLLIN, 0}, {ofd, POLLIN, 0}};
    ::poll(fds, 2, 20);
    drain(rfd, result);
    drain(ofd, c.output);
    if (c.output.size() > 8192) c.output.erase(0, c.output.size() - 2000);
    pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      hung = true;
      break;
    }
  }
  drain(rfd, result);
  drain(ofd, c.output);
  if (rfd >= 0) ::close(rfd);
  if (ofd >= 0) ::close(ofd);
  if (c.output.size() > 2000) c.output.erase(0, c.output.size() - 2000);

  std::ostringstream why;
  if (hung) {
    c.result = PluginCheck::Result::hung;
    why << "no answer within " << double(timeout.count()) / 1000 << " s; killed";
  } else if (WIFSIGNALED(status)) {
    c.result = PluginCheck::Result::crashed;
    why << "signal " << WTERMSIG(status) << ": " << detail::signal_name(WTERMSIG(status));
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && result.rfind("OK ", 0) == 0) {
    c.result = PluginCheck::Result::ok;
    why << result.substr(3);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && result.rfind("FAILED ", 0) == 0) {
    c.result = PluginCheck::Result::failed;
    why << result.substr(7);
  } else {
    c.result = PluginCheck::Result::exited;
    why << "exit code " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  c.detail = why.str();
  return c;
}

}  // namespace kiln
