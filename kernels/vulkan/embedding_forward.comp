#version 450
// y(r, j) = table(ids[r], j); an id that is not an integer in [0, vocab) gives NaN. One invocation per element.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, IDS)
BUF_RO(1, TABLE)
BUF_WO(2, Y)
KILN_PUSH_BEGIN
  uint rows; uint vocab; uint dim;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(idx, pc.rows * pc.dim) {
    const uint r = idx / pc.dim, j = idx % pc.dim;
    const float id = IDS[pc.base0 + r];
    const bool valid = id >= 0.0 && id == floor(id) && id < float(pc.vocab);
    Y[pc.base2 + idx] = valid ? TABLE[pc.base1 + uint(id) * pc.dim + j] : uintBitsToFloat(0x7fc00000u);
  }
}
