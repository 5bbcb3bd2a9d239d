#version 450
// Copies rows of (outer, rows, inner) between tensors with different row counts (Concat and Split pieces):
// dst(o, dst_row0 + r, i) = src(o, src_row0 + r, i).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, SRC)
BUF_WO(1, DST)
KILN_PUSH_BEGIN
  uint outer; uint rows; uint inner; uint src_rows; uint src_row0; uint dst_rows; uint dst_row0;
KILN_PUSH_END
void main() {
  const uint plane = pc.rows * pc.inner;
  FOR_EACH_INDEX(idx, pc.outer * plane) {
    const uint o = idx / plane, rem = idx % plane;
    DST[pc.base1 + (o * pc.dst_rows + pc.dst_row0) * pc.inner + rem] =
        SRC[pc.base0 + (o * pc.src_rows + pc.src_row0) * pc.inner + rem];
  }
}
