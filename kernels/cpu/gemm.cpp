// GEMM through oneDNN's sgemm where the plugin is built with oneDNN (KILN_WITH_DNNL), else OpenBLAS's. Either is
// kept single-threaded and the product is split across the device's thread pool: their own threads would otherwise
// fight ours for the same cores (measured in bench/results/cpu_ops.md), and one thread model keeps the `threads`
// option exact. oneDNN's: single-threaded on an AVX-512 host it ran these shapes at 109-117 GFLOP/s against
// OpenBLAS's 88-106, and it has no counterpart of OpenBLAS's slow state (cpu_ops.md), which a process can enter
// for good despite the warm-up below. KILN_CPU_GEMM=openblas keeps OpenBLAS (to measure it, or rule it out).
#include <cblas.h>

#ifdef KILN_WITH_DNNL
#include <oneapi/dnnl/dnnl.h>

#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>

#include "blocked16.hpp"
#include "one_omp_thread.hpp"
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "cpu_kernel.hpp"
#include "gemm.hpp"
#include "kiln/error.hpp"

namespace kiln::cpu {

namespace {

bool use_dnnl_gemm() {
#ifdef KILN_WITH_DNNL
  static const bool on = [] {
    const char* e = std::getenv("KILN_CPU_GEMM");
    return !(e && std::strcmp(e, "openblas") == 0);
  }();
  return on;
#else
  return false;
#endif
}

}  // namespace

void blas_init() { openblas_set_num_threads(1); }

void blas_warm_up(ThreadPool& pool) {
  if (use_dnnl_gemm()) return;  // OpenBLAS runs no GEMM then
  if (const char* e = std::getenv("KILN_OPENBLAS_WARMUP"); e && std::strcmp(e, "0") == 0) return;
  pool.run(4 * static_cast<int64_t>(pool.size()), [](int64_t, int) {
    constexpr int64_t m = 256, n = 512, k = 200;
    std::vector<float> a(m * k, 1.f), b(k * n, 1.f), c(m * n);
    sgemm_1t(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n);
  });
}

void sgemm_1t(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // BLAS rejects lda = 0; y = beta * y without reading y when beta == 0
    for (int64_t i = 0; i < m; ++i) {
      float* row = C + i * ldc;
      if (beta == 0.f)
        std::fill(row, row + n, 0.f);
      else
        for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
    return;
  }
#ifdef KILN_WITH_DNNL
  if (use_dnnl_gemm()) {
    const OneOmpThread one;
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success)
      return;  // else (never seen): OpenBLAS computes it
  }
#endif
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}

void gemm(const GemmAttrs& a, const float* A, const float* B, float* y, ThreadPool& pool) {
  const int64_t m = a.m, n = a.n, k = a.k;
  const int64_t lda = a.trans_a ? m : k, ldb = a.trans_b ? k : n;
  // Below ~1 MFLOP waking a worker costs more than the second core gives.
  const double flops = 2.0 * double(m) * double(n) * double(k);
  if (pool.size() <= 1 || flops < 1.0e6 || k == 0) {
    sgemm_1t(a.trans_a, a.trans_b, m, n, k, a.alpha, A, lda, B, ldb, a.beta, y, n);
    return;
  }
  // Split the larger output dimension into one contiguous slab per thread, rounded to the micro-kernel tile.
  const bool split_rows = m >= n;
  const int64_t dim = split_rows ? m : n;
  const int64_t tile = split_rows ? 8 : 16;
  const int64_t parts = std::min<int64_t>(pool.size(), std::max<int64_t>(1, dim / tile));
  const int64_t chunk = ((dim + parts - 1) / parts + tile - 1) / tile * tile;
  pool.run(parts, [&](int64_t p, int) {
    const int64_t b = p * chunk, e = std::min(dim, b + chunk);
    if (b >= e) return;
    if (split_rows) {
      const float* As = a.trans_a ? A + b : A + b * k;
      sgemm_1t(a.trans_a, a.trans_b, e - b, n, k, a.alpha, As, lda, B, ldb, a.beta, y + b * n, n);
    } else {
      const float* Bs = a.trans_b ? B + b * k : B + b;
      sgemm_1t(a.trans_a, a.trans_b, m, e - b, k, a.alpha, A, lda, Bs, ldb, a.beta, y + b, n);
    }
  });
}

// ---- registration ---------------------------------------------------------------------------------------------

namespace {
// BLAS takes 32-bit dimensions.
Support blas_dims(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims)
    if (d > std::numeric_limits<int>::max())
      return {false, "a dimension of " + std::to_string(d) + " exceeds what BLAS can index (2^31 - 1)"};
  return {};
}
}  // namespace

Support gemm_supports(OpKind, const OpAttrs& a) {
  const auto& g = std::get<GemmAttrs>(a);
  return blas_dims({g.m, g.n, g.k});
}
Support conv_supports(OpKind, const OpAttrs& a) {
  const auto& c = std::get<ConvAttrs>(a);
  return blas_dims({c.k, c.c * c.r * c.s, c.oh * c.ow});
}

#ifdef KILN_WITH_DNNL
// ---- bf16 products: oneDNN's matmul with bf16 inputs and float32 accumulation ----------------------------------
// One primitive per (rows, shape, transposes, alpha, beta, output type), created once; each pool thread runs it on
// its own slab of rows (OneOmpThread), like sgemm_1t above, with its scratchpad in the call's workspace (a primitive
// with a user scratchpad may run on several threads at once). oneDNN picks avx512_core_bf16 (vdpbf16ps) where the
// CPU has AVX512_BF16 and an emulation on plain AVX-512; where it has no bf16 matmul at all gemm_takes says no and
// the backend converts the call to float32 instead (dispatch.cpp).
namespace {

using MatmulKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, float, float, int>;
struct Matmul {
  dnnl::matmul prim;
  size_t scratch = 0;
};

dnnl::engine& bf16_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// The (batch, rows, k) . (batch, k, n) descriptors of `bb` matrices of a batched product (rows = a.m, trans flags of
// a), or of a slab of m rows of a plain one (bb == 0: 2-D).
struct MatmulDescs {
  dnnl::memory::desc a, b, c;
};
MatmulDescs matmul_descs(int64_t bb, int64_t m, const GemmAttrs& a, DType out) {
  using dt = dnnl::memory::data_type;
  const dt ct = out == DType::f32 ? dt::f32 : dt::bf16;
  if (bb == 0) {
    // A slab of m of A's a.m rows: with trans_a, A is stored (k, a.m) and the slab's rows are columns of it.
    const dnnl::memory::dims as = a.trans_a ? dnnl::memory::dims{1, a.m} : dnnl::memory::dims{a.k, 1};
    const dnnl::memory::dims bs = a.trans_b ? dnnl::memory::dims{1, a.k} : dnnl::memory::dims{a.n, 1};
    return {{{m, a.k}, dt::bf16, as}, {{a.k, a.n}, dt::bf16, bs}, {{m, a.n}, ct, dnnl::memory::dims{a.n, 1}}};
  }
  const int64_t sa = a.m * a.k, sb = a.k * a.n, sc = a.m * a.n;
  const dnnl::memory::dims as = a.trans_a ? dnnl::memory::dims{sa, 1, a.m} : dnnl::memory::dims{sa, a.k, 1};
  const dnnl::memory::dims bs = a.trans_b ? dnnl::memory::dims{sb, 1, a.k} : dnnl::memory::dims{sb, a.n, 1};
  return {{{bb, a.m, a.k}, dt::bf16, as},
          {{bb, a.k, a.n}, dt::bf16, bs},
          {{bb, a.m, a.n}, ct, dnnl::memory::dims{sc, a.n, 1}}};
}

const Matmul* bf16_matmul(int64_t bb, int64_t m, const GemmAttrs& a, DType out) {
  static std::mutex mu;
  static std::map<MatmulKey, std::unique_ptr<Matmul>> cache;
  dnnl::engine& eng = bf16_engine();
  const MatmulKey key{bb, m, a.m, a.n, a.k, a.trans_a, a.trans_b, a.alpha, a.beta, static_cast<int>(out)};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  std::unique_ptr<Matmul> mm;
  try {
    const MatmulDescs md = matmul_descs(bb, m, a, out);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (a.alpha != 1.f) attr.set_output_scales(0, {a.alpha});
    if (a.beta != 0.f) {
      dnnl::post_ops po;
      po.append_sum(a.beta);
      attr.set_post_ops(po);
    }
    const OneOmpThread one;
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md.a, md.b, md.c), attr, eng);
    mm = std::make_unique<Matmul>(Matmul{dnnl::matmul(pd), pd.scratchpad_desc().get_size()});
  } catch (const dnnl::error&) {
    mm = nullptr;  // no implementation here: the caller converts
  }
  return (cache[key] = std::move(mm)).get();
}

// Row slabs: one per pool thread (whole 16-row tiles), or one for a small product.
struct Slabs {
  int64_t parts = 1, chunk = 0, last = 0;
};
Slabs slabs(const GemmAttrs& a, int threads) {
  const int64_t m = a.m;
  const double flops = 2.0 * double(m) * double(a.n) * double(a.k);
  Slabs s;
  s.parts = threads <= 1 || flops < 1.0e6 ? 1 : std::min<int64_t>(threads, std::max<int64_t>(1, m / 16));
  s.chunk = ((m + s.parts - 1) / s.parts + 15) / 16 * 16;
  while (s.parts > 1 && m - (s.parts - 1) * s.chunk <= 0)
    --s.parts, s.chunk = ((m + s.parts - 1) / s.parts + 15) / 16 * 16;
  if (s.parts == 1) s.chunk = m;
  s.last = m - (s.parts - 1) * s.chunk;
  return s;
}

constexpr size_t kScratchAlign = 4096;
size_t scratch_per_thread(const Matmul* full, const Matmul* tail) {
  return (std::max(full->scratch, tail->scratch) + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

// A transposed A (trans_a: stored (k, m), as a weight gradient's x^T) is copied to (m, k) in the workspace first:
// oneDNN 2.6 runs a bf16 matmul whose source is transposed with its gemm:jit kernel, at 50-140 GFLOP/s on the GPT
// sample's weight gradients (ONEDNN_VERBOSE) against brgemm's 160-200 on the same shapes untransposed, and the copy
// costs a pass over A. The product then runs untransposed.
size_t transposed_bytes(const GemmAttrs& a) {
  return a.trans_a ? (static_cast<size_t>(a.m * a.k) * 2 + kScratchAlign - 1) / kScratchAlign * kScratchAlign : 0;
}
GemmAttrs untransposed(const GemmAttrs& a) {
  GemmAttrs u = a;
  u.trans_a = false;
  return u;
}

// x (rows, cols) -> y (cols, rows), 16-bit values, column blocks of 16 (y's rows) spread over the pool.
void transpose16(const uint16_t* x, int64_t rows, int64_t cols, uint16_t* y, ThreadPool& pool) {
  constexpr int64_t kB = 16;
  const int64_t cblocks = (cols + kB - 1) / kB;
  parallel_ranges(pool, cblocks, parts_for(rows * cols, pool), [&](int64_t cb, int64_t ce) {
    transpose16_cols(x, rows, cols, y, cb * kB, std::min(cols, ce * kB));
  });
}

bool gemm_bf16(const GemmAttrs& a_in, const uint16_t* A, const uint16_t* B, void* y, DType out, char* ws,
               size_t ws_bytes, ThreadPool& pool) {
  const GemmAttrs a = untransposed(a_in);
  if (a_in.trans_a) {
    const size_t tb = transposed_bytes(a_in);
    if (!ws || tb > ws_bytes) return false;
    auto* At = reinterpret_cast<uint16_t*>(ws);
    transpose16(A, a.k, a.m, At, pool);
    A = At;
    ws += tb;
    ws_bytes -= tb;
  }
  const int64_t m = a.m, n = a.n, k = a.k;
  const Slabs sl = slabs(a, pool.size());
  const Matmul* full = bf16_matmul(0, sl.chunk, a, out);
  const Matmul* tail = sl.last == sl.chunk ? full : bf16_matmul(0, sl.last, a, out);
  if (!full || !tail) return false;
  const size_t per = scratch_per_thread(full, tail);
  if (per * static_cast<size_t>(pool.size()) > ws_bytes) return false;
  dnnl::engine& eng = bf16_engine();
  const size_t ysize = dtype_size(out);
  pool.run(sl.parts, [&](int64_t p, int slot) {
    const int64_t b = p * sl.chunk, rows = std::min(sl.chunk, m - b);
    if (rows <= 0) return;
    const Matmul* mm = rows == sl.chunk ? full : tail;
    const OneOmpThread one;
    dnnl::stream st(eng);
    using dt = dnnl::memory::data_type;
    const dnnl::memory::dims as = a.trans_a ? dnnl::memory::dims{1, m} : dnnl::memory::dims{k, 1};
    const dnnl::memory::dims bs = a.trans_b ? dnnl::memory::dims{1, k} : dnnl::memory::dims{n, 1};
    dnnl::memory am({{rows, k}, dt::bf16, as}, eng, const_cast<uint16_t*>(a.trans_a ? A + b : A + b * k));
    dnnl::memory bm({{k, n}, dt::bf16, bs}, eng, const_cast<uint16_t*>(B));
    dnnl::memory cm({{rows, n}, out == DType::f32 ? dt::f32 : dt::bf16, dnnl::memory::dims{n, 1}}, eng,
                    static_cast<char*>(y) + static_cast<size_t>(b * n) * ysize);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (mm->scratch)
      args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory({{static_cast<int64_t>(mm->scratch)}, dt::u8, {1}}, eng,
                                                     ws + per * static_cast<size_t>(slot)));
    mm->prim.execute(st, args);
    st.wait();
  });
  return true;
}

bool is_bf16_product(const OpCall& c) {
  return c.in[0].dtype == DType::bf16 && c.in[1].dtype == DType::bf16 && c.out[0].dtype != DType::f16;
}

bool gemm_takes(const OpCall& c) {
  const auto& a = std::get<GemmAttrs>(c.attrs);
  if (c.in[0].dtype == DType::f32 && c.in[1].dtype == DType::f32 && c.out[0].dtype == DType::f32) return true;
  if (!is_bf16_product(c) || a.m <= 0 || a.n <= 0 || a.k <= 0) return false;
  const GemmAttrs u = untransposed(a);
  return bf16_matmul(0, slabs(u, 1).chunk, u, c.out[0].dtype) != nullptr;
}

// gemm_bf16's workspace: A's transposed copy, then a scratchpad per pool thread.
size_t gemm_bf16_workspace(const GemmAttrs& a, DType out, int threads) {
  const GemmAttrs u = untransposed(a);
  const Slabs sl = slabs(u, threads);
  const Matmul* full = bf16_matmul(0, sl.chunk, u, out);
  const Matmul* tail = bf16_matmul(0, sl.last, u, out);
  if (!full || !tail) return 0;
  return transposed_bytes(a) + scratch_per_thread(full, tail) * static_cast<size_t>(threads);
}

size_t gemm_workspace(const CpuDevice& d, const OpCall& c) {
  if (!is_bf16_product(c) || !gemm_takes(c)) return 0;
  return gemm_bf16_workspace(std::get<GemmAttrs>(c.attrs), c.out[0].dtype, const_cast<CpuDevice&>(d).pool().size());
}

// Batched products: whole matrices per pool thread, one slab of consecutive matrices each (a full and a tail
// primitive), as the float32 kernel (attention.cpp) does; fewer matrices than threads: each split by rows as gemm.
struct BatchSlabs {
  int64_t parts = 1, chunk = 0, last = 0;
};
BatchSlabs batch_slabs(const GemmAttrs& a, int threads) {
  BatchSlabs s;
  const double flops = 2.0 * double(a.batch) * double(a.m) * double(a.n) * double(a.k);
  s.parts = flops < 1.0e6 ? 1 : std::min<int64_t>(a.batch, threads);
  s.chunk = (a.batch + s.parts - 1) / s.parts;
  s.parts = (a.batch + s.chunk - 1) / s.chunk;
  s.last = a.batch - (s.parts - 1) * s.chunk;
  return s;
}
bool per_matrix(const GemmAttrs& a, int threads) { return a.batch < threads; }

GemmAttrs one_matrix(const GemmAttrs& a) {
  GemmAttrs one = a;
  one.batch = 1;
  return one;
}

}  // namespace

bool batched_gemm_bf16_takes(const OpCall& c) {
  const auto& a = std::get<GemmAttrs>(c.attrs);
  if (!is_bf16_product(c) || a.batch <= 0 || a.m <= 0 || a.n <= 0 || a.k <= 0) return false;
  const GemmAttrs u = untransposed(one_matrix(a));
  return bf16_matmul(0, slabs(u, 1).chunk, u, c.out[0].dtype) && bf16_matmul(a.batch, a.m, a, c.out[0].dtype);
}

size_t batched_gemm_bf16_workspace(const CpuDevice& d, const OpCall& c) {
  if (!batched_gemm_bf16_takes(c)) return 0;
  const auto& a = std::get<GemmAttrs>(c.attrs);
  const int threads = const_cast<CpuDevice&>(d).pool().size();
  const DType out = c.out[0].dtype;
  if (per_matrix(a, threads)) return gemm_bf16_workspace(one_matrix(a), out, threads);
  const BatchSlabs bs = batch_slabs(a, threads);
  const Matmul* full = bf16_matmul(bs.chunk, a.m, a, out);
  const Matmul* tail = bf16_matmul(bs.last, a.m, a, out);
  return full && tail ? scratch_per_thread(full, tail) * static_cast<size_t>(threads) : 0;
}

void batched_gemm_bf16(CpuDevice& d, const OpCall& c) {
  const auto& a = attrs<GemmAttrs>(c);
  ThreadPool& pool = d.pool();
  const DType out = c.out[0].dtype;
  const auto* A = static_cast<const uint16_t*>(c.in[0].raw());
  const auto* B = static_cast<const uint16_t*>(c.in[1].raw());
  char* y = static_cast<char*>(c.out[0].raw());
  char* ws = c.workspace.block ? static_cast<char*>(c.workspace.raw()) : nullptr;
  const size_t ws_bytes = ws ? c.workspace.bytes : 0;
  const int64_t sa = a.m * a.k, sb = a.k * a.n, sy = a.m * a.n;
  const size_t ysize = dtype_size(out);
  auto fail = [&] {
    throw DeviceError("batched_gemm: oneDNN created no bf16 matmul for " + std::to_string(a.batch) + "x" +
                      std::to_string(a.m) + "x" + std::to_string(a.n) + "x" + std::to_string(a.k) +
                      " or the workspace is too small for it");
  };
  if (per_matrix(a, pool.size())) {
    const GemmAttrs one = one_matrix(a);
    for (int64_t b = 0; b < a.batch; ++b)
      if (!gemm_bf16(one, A + b * sa, B + b * sb, y + static_cast<size_t>(b * sy) * ysize, out, ws, ws_bytes, pool))
        fail();
    return;
  }
  const BatchSlabs bs = batch_slabs(a, pool.size());
  const Matmul* full = bf16_matmul(bs.chunk, a.m, a, out);
  const Matmul* tail = bs.last == bs.chunk ? full : bf16_matmul(bs.last, a.m, a, out);
  if (!full || !tail) fail();
  const size_t per = scratch_per_thread(full, tail);
  if (per * static_cast<size_t>(pool.size()) > ws_bytes) fail();
  dnnl::engine& eng = bf16_engine();
  pool.run(bs.parts, [&](int64_t p, int slot) {
    const int64_t b0 = p * bs.chunk, count = std::min(bs.chunk, a.batch - b0);
    if (count <= 0) return;
    const Matmul* mm = count == bs.chunk ? full : tail;
    const MatmulDescs md = matmul_descs(count, a.m, a, out);
    const OneOmpThread one;
    dnnl::stream st(eng);
    dnnl::memory am(md.a, eng, const_cast<uint16_t*>(A + b0 * sa));
    dnnl::memory bm(md.b, eng, const_cast<uint16_t*>(B + b0 * sb));
    dnnl::memory cm(md.c, eng, y + static_cast<size_t>(b0 * sy) * ysize);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (mm->scratch)
      args.emplace(DNNL_ARG_SCRATCHPAD,
                   dnnl::memory({{static_cast<int64_t>(mm->scratch)}, dnnl::memory::data_type::u8, {1}}, eng,
                                ws + per * static_cast<size_t>(slot)));
    mm->prim.execute(st, args);
    st.wait();
  });
}
#else
bool batched_gemm_bf16_takes(const OpCall&) { return false; }
size_t batched_gemm_bf16_workspace(const CpuDevice&, const OpCall&) { return 0; }
void batched_gemm_bf16(CpuDevice&, const OpCall&) { throw DeviceError("batched_gemm: built without oneDNN"); }
#endif

KILN_CPU_KERNEL("gemm", {[](CpuDevice& d, const OpCall& c) {
                           const auto& a = attrs<GemmAttrs>(c);
#ifdef KILN_WITH_DNNL
                           // A call the backend converted keeps its empty views' types (nothing to convert):
                           // with k, m and n positive every buffer here is float32 unless the call is native.
                           if (c.in[0].dtype == DType::bf16 && a.k > 0 && a.m > 0 && a.n > 0) {
                             char* w = c.workspace.block ? static_cast<char*>(c.workspace.raw()) : nullptr;
                             if (!gemm_bf16(a, static_cast<const uint16_t*>(c.in[0].raw()),
                                            static_cast<const uint16_t*>(c.in[1].raw()), c.out[0].raw(), c.out[0].dtype,
                                            w, w ? c.workspace.bytes : 0, d.pool()))
                               throw DeviceError("gemm: oneDNN created no bf16 matmul for " + std::to_string(a.m) +
                                                 "x" + std::to_string(a.n) + "x" + std::to_string(a.k) +
                                                 " or the workspace is too small for it");
                             return;
                           }
#endif
                           cpu::gemm(a, in(c, 0), in(c, 1), out(c, 0), d.pool());
                         },
                         gemm_supports,
#ifdef KILN_WITH_DNNL
                         gemm_workspace, gemm_takes
#else
                         nullptr, nullptr
#endif
                        });

}  // namespace kiln::cpu
