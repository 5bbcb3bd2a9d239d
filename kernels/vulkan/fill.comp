#version 450
// y = value.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_WO(0, Y)
KILN_PUSH_BEGIN
  uint count; float value;
KILN_PUSH_END
void main() { FOR_EACH_INDEX(i, pc.count) Y[pc.base0 + i] = pc.value; }
