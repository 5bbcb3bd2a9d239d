// Max and average pooling: (n, c) planes in ranges over the device's thread pool (planes never share output).
#include <algorithm>
#include <bit>
#include <cstdint>

#include "kernels.hpp"

namespace kiln::cpu {
namespace {

struct Window {
  int64_t y0, y1, x0, x1;  // clipped to the image, [y0, y1) x [x0, x1)
  int64_t count() const { return std::max<int64_t>(y1 - y0, 0) * std::max<int64_t>(x1 - x0, 0); }
};

Window window(const PoolAttrs& a, int64_t oy, int64_t ox) {
  const int64_t ty = oy * a.stride_h - a.pad_h, tx = ox * a.stride_w - a.pad_w;
  return {std::max<int64_t>(ty, 0), std::min<int64_t>(ty + a.kh, a.h), std::max<int64_t>(tx, 0),
          std::min<int64_t>(tx + a.kw, a.w)};
}

// g where m == 1, +0 where m == 0, by masking bits (no branch even in the scalar remainder of a loop).
inline float keep_if(int m, float g) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(g) & (0u - static_cast<uint32_t>(m)));
}

bool is_2x2_s2(const PoolAttrs& a) {
  return a.kh == 2 && a.kw == 2 && a.stride_h == 2 && a.stride_w == 2 && a.pad_h == 0 && a.pad_w == 0 &&
         a.oh * 2 <= a.h && a.ow * 2 <= a.w;
}

}  // namespace

void max_pool_planes(const PoolAttrs& a, const float* x, float* y, int64_t pb, int64_t pe) {
  const int64_t in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  const bool fast = is_2x2_s2(a);
  for (int64_t p = pb; p < pe; ++p) {
    const float* xp = x + p * in_plane;
    float* yp = y + p * out_plane;
    for (int64_t oy = 0; oy < a.oh; ++oy) {
      if (fast) {  // first element wins ties and NaN, as in the general path
        const float* r0 = xp + 2 * oy * a.w;
        const float* r1 = r0 + a.w;
        for (int64_t ox = 0; ox < a.ow; ++ox) {
          float b = r0[2 * ox];
          b = r0[2 * ox + 1] > b ? r0[2 * ox + 1] : b;
          b = r1[2 * ox] > b ? r1[2 * ox] : b;
          b = r1[2 * ox + 1] > b ? r1[2 * ox + 1] : b;
          yp[oy * a.ow + ox] = b;
        }
        continue;
      }
      for (int64_t ox = 0; ox < a.ow; ++ox) {
        const Window w = window(a, oy, ox);
        float best = 0.f;
        bool found = false;
        for (int64_t iy = w.y0; iy < w.y1; ++iy)
          for (int64_t ix = w.x0; ix < w.x1; ++ix) {
            const float v = xp[iy * a.w + ix];
            if (!found || v > best) best = v;
            found = true;
          }
        yp[oy * a.ow + ox] = best;
      }
    }
  }
}

void max_pool_forward(const PoolAttrs& a, const float* x, float* y, ThreadPool& pool) {
  parallel_ranges(pool, a.n * a.c, parts_for(a.n * a.c * a.h * a.w, pool),
                  [&](int64_t pb, int64_t pe) { max_pool_planes(a, x, y, pb, pe); });
}

// With relu_grad a window whose maximum yv is not > 0 passes no gradient: its argmax is where x == yv, so
// x > 0 there exactly when yv > 0, and every other position gets 0 from both ops.
void max_pool_backward(const PoolAttrs& a, const float* x, const float* y, const float* dy, float* dx,
                       ThreadPool& pool, bool relu_grad) {
  const int64_t planes = a.n * a.c, in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  const bool fast = is_2x2_s2(a);
  parallel_ranges(pool, planes, parts_for(a.n * a.c * a.h * a.w, pool), [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      const float* xp = x + p * in_plane;
      float* dxp = dx + p * in_plane;
      if (fast) {  // disjoint windows: write each window's 4 gradients directly, first match wins, no branches
        for (int64_t oy = 0; oy < a.oh; ++oy) {
          const float* r0 = xp + 2 * oy * a.w;
          const float* r1 = r0 + a.w;
          float* d0 = dxp + 2 * oy * a.w;
          float* d1 = d0 + a.w;
          const float* yr = y + p * out_plane + oy * a.ow;
          const float* gr = dy + p * out_plane + oy * a.ow;
          for (int64_t ox = 0; ox < a.ow; ++ox) {
            // Bitwise, not &&: after a ReLU many windows tie at 0, and short-circuit branches mispredict.
            const float yv = yr[ox], g = gr[ox];
            const int live = !relu_grad | (yv > 0.f);
            const int e0 = r0[2 * ox] == yv, e1 = r0[2 * ox + 1] == yv, e2 = r1[2 * ox] == yv;
            const int e3 = r1[2 * ox + 1] == yv;
            const int m1 = e1 & ~e0 & live, m2 = e2 & ~(e0 | e1) & live, m3 = e3 & ~(e0 | e1 | e2) & live;
            d0[2 * ox] = keep_if(e0 & live, g);
            d0[2 * ox + 1] = keep_if(m1, g);
            d1[2 * ox] = keep_if(m2, g);
            d1[2 * ox + 1] = keep_if(m3, g);
          }
          std::fill(d0 + 2 * a.ow, d0 + a.w, 0.f);  // an odd last column is in no window
          std::fill(d1 + 2 * a.ow, d1 + a.w, 0.f);
        }
        std::fill(dxp + 2 * a.oh * a.w, dxp + in_plane, 0.f);  // likewise an odd last row
        continue;
      }
      std::fill(dxp, dxp + in_plane, 0.f);
      for (int64_t oy = 0; oy < a.oh; ++oy)
        for (int64_t ox = 0; ox < a.ow; ++ox) {
          const int64_t o = p * out_plane + oy * a.ow + ox;
          const float yv = y[o];
          const Window w = window(a, oy, ox);
          for (int64_t iy = w.y0; iy < w.y1; ++iy)
            for (int64_t ix = w.x0; ix < w.x1; ++ix)
              if (xp[iy * a.w + ix] == yv) {
                if (!relu_grad || yv > 0.f) dxp[iy * a.w + ix] += dy[o];
                goto next;  // only the first match gets the gradient
              }
        next:;
        }
    }
  });
}

void avg_pool_forward(const PoolAttrs& a, const float* x, float* y, ThreadPool& pool) {
  const int64_t planes = a.n * a.c, in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  parallel_ranges(pool, planes, parts_for(a.n * a.c * a.h * a.w, pool), [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      const float* xp = x + p * in_plane;
      for (int64_t oy = 0; oy < a.oh; ++oy)
        for (int64_t ox = 0; ox < a.ow; ++ox) {
          const Window w = window(a, oy, ox);
          const int64_t count = w.count();
          float sum = 0.f;
          for (int64_t iy = w.y0; iy < w.y1; ++iy)
            for (int64_t ix = w.x0; ix < w.x1; ++ix) sum += xp[iy * a.w + ix];
          y[p * out_plane + oy * a.ow + ox] = count > 0 ? sum / static_cast<float>(count) : 0.f;
        }
    }
  });
}

void avg_pool_backward(const PoolAttrs& a, const float* dy, float* dx, ThreadPool& pool) {
  const int64_t planes = a.n * a.c, in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  parallel_ranges(pool, planes, parts_for(a.n * a.c * a.h * a.w, pool), [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      float* dxp = dx + p * in_plane;
      std::fill(dxp, dxp + in_plane, 0.f);
      for (int64_t oy = 0; oy < a.oh; ++oy)
        for (int64_t ox = 0; ox < a.ow; ++ox) {
          const Window w = window(a, oy, ox);
          const int64_t count = w.count();
          if (count == 0) continue;
          const float g = dy[p * out_plane + oy * a.ow + ox] / static_cast<float>(count);
          for (int64_t iy = w.y0; iy < w.y1; ++iy)
            for (int64_t ix = w.x0; ix < w.x1; ++ix) dxp[iy * a.w + ix] += g;
        }
    }
  });
}

}  // namespace kiln::cpu
