// SIGINT / SIGTERM (and SIGUSR1 / SIGUSR2 from mpirun) while a run trains: the first finishes the step and writes a
// checkpoint, the second stops at once (the trainer).
#pragma once
#include <signal.h>

namespace kiln {

// The stop signal received since the last StopSignals was installed: SIGINT or SIGTERM (SIGUSR2 and SIGUSR1 count as
// those), 0 when none.
int stop_signal_received();

// Installs the handlers for the duration of a run and puts the previous ones back. The handler runs on an alternate
// signal stack of the installing thread (the main thread, which is also a CPU device's first pool thread). With
// GEMMs through oneDNN's sgemm, a stop signal delivered on the threads' own stacks corrupted the heap in 4 of 30
// runs of the SIGTERM test (presumably its JIT kernels use stack below their stack pointer, where the signal frame
// goes); with the handler on this stack and the CPU backend's workers blocking these signals, 0 of 40.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{}, old_usr1_{}, old_usr2_{};
  stack_t old_stack_{};
  bool on_alt_stack_ = false;
  alignas(16) char alt_stack_[65536];
};

}  // namespace kiln
