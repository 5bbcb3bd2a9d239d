// Holds the calling thread's OpenMP setting at one thread for a scope and gives the caller's setting back. oneDNN
// (Debian's build threads with libgomp) sizes a primitive's thread partition when the primitive is created and runs
// its own OpenMP team in dnnl_sgemm and in primitives: Kiln keeps its own threads (one slice or part per pool thread),
// so every call into oneDNN is made inside one of these (conv_dnnl.cpp, gemm.cpp).
#pragma once

extern "C" void omp_set_num_threads(int);  // libgomp
extern "C" int omp_get_max_threads();

namespace kiln::cpu {

class OneOmpThread {
 public:
  OneOmpThread() : prev_(omp_get_max_threads()) {
    if (prev_ != 1) omp_set_num_threads(1);
  }
  ~OneOmpThread() {
    if (prev_ != 1) omp_set_num_threads(prev_);
  }
  OneOmpThread(const OneOmpThread&) = delete;
  OneOmpThread& operator=(const OneOmpThread&) = delete;

 private:
  int prev_;
};

}  // namespace kiln::cpu
