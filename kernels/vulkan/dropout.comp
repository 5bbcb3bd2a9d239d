#version 450
// y_i = dropout_uniform(seed, counter, i) >= rate ? x_i / (1 - rate) : 0, with the integer hash of
// core/include/kiln/reference.hpp (same bits on every backend). y may alias x.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_WO(1, Y)
KILN_PUSH_BEGIN
  uint count; float rate; uint seed; uint counter;
KILN_PUSH_END
uint kiln_hash32(uint x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
void main() {
  const uint key = kiln_hash32(pc.counter ^ kiln_hash32(pc.seed));
  FOR_EACH_INDEX(i, pc.count) {
    const float u = float(kiln_hash32(i ^ key) >> 8) * (1.0 / 16777216.0);
    const float x = X[pc.base0 + i];
    Y[pc.base1 + i] = u >= pc.rate ? x / (1.0 - pc.rate) : 0.0;
  }
}
