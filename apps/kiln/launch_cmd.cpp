// kiln launch: `mpirun -np N [--host ...] <this kiln> train run.toml ...`, so one command starts every rank.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "kiln/error.hpp"

namespace kiln::app {

std::vector<std::string> launch_argv(const Options& o, const LaunchOptions& lo, const std::string& self) {
  if (lo.ranks < 1) throw ConfigError("kiln launch -n " + std::to_string(lo.ranks) + ": expected at least 1 rank");
  std::vector<std::string> a{lo.mpirun, "-np", std::to_string(lo.ranks)};
  if (!lo.hosts.empty()) a.insert(a.end(), {"--host", lo.hosts});
  if (::geteuid() == 0) a.push_back("--allow-run-as-root");  // OpenMPI refuses root without it (containers, CI)
  for (const auto& m : lo.mpirun_args) a.push_back(m);
  a.push_back(self);
  for (const auto& d : o.plugin_dirs) a.insert(a.end(), {"--plugin-dir", d});
  a.insert(a.end(), {"train", o.config});
  for (const auto& s : o.overrides) a.insert(a.end(), {"--set", s});
  if (o.resume) a.push_back("--resume");
  if (o.overwrite) a.push_back("--overwrite");
  return a;
}

namespace {

// Open MPI's mpirun answers SIGTERM and SIGINT by sending the ranks SIGTERM and, one second later, SIGKILL: a rank
// whose step and checkpoint take longer is killed during them. It passes SIGUSR1 and SIGUSR2 on to every rank and
// nothing more, and the trainer takes those as SIGTERM and SIGINT: so the first stop signal is passed on as one of
// them (the ranks finish the step and rank 0 writes the checkpoint), a second one as SIGTERM (mpirun's own quick
// shutdown), any further one as SIGKILL.
volatile sig_atomic_t g_mpirun = 0;
volatile sig_atomic_t g_stops = 0;

void say(const char* msg) {
  ssize_t n = ::write(STDERR_FILENO, msg, std::strlen(msg));
  (void)n;
}

extern "C" void kiln_launch_forward(int sig) {
  const pid_t child = static_cast<pid_t>(g_mpirun);
  if (child <= 0) return;
  const int n = g_stops = g_stops + 1;
  if (n == 1) {
    ::kill(child, sig == SIGINT ? SIGUSR2 : SIGUSR1);
    say("\nkiln launch: asking every rank to stop after the current step and write a checkpoint (press Ctrl-C again "
        "to stop at once)\n");
  } else if (n == 2) {
    ::kill(child, SIGTERM);
    say("\nkiln launch: stopping mpirun and its ranks now (without a new checkpoint)\n");
  } else {
    ::kill(child, SIGKILL);
  }
}

}  // namespace

int cmd_launch(const Options& o, const LaunchOptions& lo) {
  std::error_code ec;
  const std::string self = std::filesystem::canonical("/proc/self/exe", ec).string();
  auto a = launch_argv(o, lo, self.empty() ? "kiln" : self);
  if (lo.dry_run) {
    for (size_t i = 0; i < a.size(); ++i) std::cout << (i ? " " : "") << a[i];
    std::cout << "\n";
    return 0;
  }
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::cout << std::flush;

  // The stop signals wait (blocked) until mpirun's pid is known; the child gets the mask back before exec.
  struct sigaction sa {};
  sa.sa_handler = kiln_launch_forward;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  sigset_t stops, old;
  sigemptyset(&stops);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &stops, &old);
  int report[2];  // exec's errno from the child; closed by a successful exec
  if (::pipe2(report, O_CLOEXEC) != 0) throw Error(std::string("kiln launch: pipe: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("kiln launch: cannot start mpirun: fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Its own process group: Ctrl-C at a terminal reaches this process alone, not mpirun (which would end the ranks
    // itself). Should this process die, mpirun gets SIGTERM and ends the ranks as it does for a plain mpirun.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(128 + SIGTERM);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    ::close(report[0]);
    ::execvp(argv[0], argv.data());
    const int err = errno;
    ssize_t n = ::write(report[1], &err, sizeof err);
    (void)n;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: whichever of the two runs first
  g_mpirun = pid;
  ::close(report[1]);
  int err = 0;
  ssize_t got;
  while ((got = ::read(report[0], &err, sizeof err)) < 0 && errno == EINTR) {
  }
  ::close(report[0]);
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_mpirun = 0;
  if (got == static_cast<ssize_t>(sizeof err))
    throw Error("kiln launch: cannot run '" + lo.mpirun + "' (" + std::string(std::strerror(err)) +
                "); install OpenMPI (Debian: apt-get install openmpi-bin libopenmpi-dev) or pass --mpirun PATH");
  // mpirun's own exit code: with the ranks stopped by a signal, the one a single kiln train gives (128 + signal).
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace kiln::app
