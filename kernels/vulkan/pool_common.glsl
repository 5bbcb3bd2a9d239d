// Push constants and window helpers shared by the pooling kernels. Windows are clipped to the image.
KILN_PUSH_BEGIN
  uint N; uint C; uint H; uint W; uint KH; uint KW; uint SH; uint SW; uint PH; uint PW; uint OH; uint OW; uint mode;
  uint i0; uint i1;  // this dispatch's range of outputs (forward) or inputs (backward)
KILN_PUSH_END

// The clipped window [y0, y1) x [x0, x1) of output (oy, ox).
void pool_window(uint oy, uint ox, out int y0, out int y1, out int x0, out int x1) {
  const int sy = int(oy * pc.SH) - int(pc.PH), sx = int(ox * pc.SW) - int(pc.PW);
  y0 = max(sy, 0);
  y1 = min(sy + int(pc.KH), int(pc.H));
  x0 = max(sx, 0);
  x1 = min(sx + int(pc.KW), int(pc.W));
}

// The outputs whose windows contain input row `i` (stride s, padding p, kernel k, n outputs): [lo, hi).
void covering(uint i, uint s, uint p, uint k, uint n, out uint lo, out uint hi) {
  const int first = int(i + p) - int(k) + 1;  // smallest oy*s with oy*s - p + k - 1 >= i
  lo = first <= 0 ? 0u : (uint(first) + s - 1u) / s;
  hi = min((i + p) / s + 1u, n);
}
