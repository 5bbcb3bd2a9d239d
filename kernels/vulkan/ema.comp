#version 450
// shadow = decay*shadow + (1-decay)*w.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, Wv)
BUF_RW(1, SH)
KILN_PUSH_BEGIN
  uint count; float decay;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) SH[pc.base1 + i] = pc.decay * SH[pc.base1 + i] + (1.0 - pc.decay) * Wv[pc.base0 + i];
}
