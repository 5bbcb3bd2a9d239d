// The stop signals of a training run (stop_signals.hpp).
#include "stop_signals.hpp"

#include <unistd.h>

#include <atomic>

namespace kiln {

namespace {
std::atomic<int> g_stop_signal{0};
}  // namespace

int stop_signal_received() { return g_stop_signal.load(); }

// SIGUSR1 and SIGUSR2 are stop requests that mpirun passes to every rank without killing them afterwards (as it
// does on SIGTERM and SIGINT): `kiln launch` sends them, and a user of plain mpirun can. They stand for SIGTERM and
// SIGINT, so the message and the exit code are those of a single process.
extern "C" void kiln_stop_signal(int sig) {
  const int as = sig == SIGUSR1 ? SIGTERM : sig == SIGUSR2 ? SIGINT : sig;
  if (g_stop_signal.exchange(as) != 0) {  // the second signal stops at once
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  static const char msg[] =
      "\nkiln: stopping after the current step and writing a checkpoint (press Ctrl-C again to stop at once)\n";
  ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)n;
}

StopSignals::StopSignals() {
  g_stop_signal = 0;
  stack_t ss{};
  ss.ss_sp = alt_stack_;
  ss.ss_size = sizeof alt_stack_;
  on_alt_stack_ = ::sigaltstack(&ss, &old_stack_) == 0;
  struct sigaction sa {};
  sa.sa_handler = kiln_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | (on_alt_stack_ ? SA_ONSTACK : 0);
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
  ::sigaction(SIGUSR1, &sa, &old_usr1_);
  ::sigaction(SIGUSR2, &sa, &old_usr2_);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  ::sigaction(SIGUSR1, &old_usr1_, nullptr);
  ::sigaction(SIGUSR2, &old_usr2_, nullptr);
  if (on_alt_stack_) ::sigaltstack(&old_stack_, nullptr);
}

}  // namespace kiln
