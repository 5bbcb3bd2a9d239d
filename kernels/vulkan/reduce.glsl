// Workgroup-wide reductions for kernels with local_size_x = WG_SIZE (a power of two). Every invocation of the
// workgroup must call them (they contain barriers). The tree order is fixed, so results are deterministic.
shared float kiln_red[WG_SIZE];

float wg_sum(float v) {
  const uint lid = gl_LocalInvocationID.x;
  kiln_red[lid] = v;
  barrier();
  for (uint s = WG_SIZE / 2u; s > 0u; s >>= 1u) {
    if (lid < s) kiln_red[lid] += kiln_red[lid + s];
    barrier();
  }
  const float r = kiln_red[0];
  barrier();
  return r;
}

float wg_max(float v) {
  const uint lid = gl_LocalInvocationID.x;
  kiln_red[lid] = v;
  barrier();
  for (uint s = WG_SIZE / 2u; s > 0u; s >>= 1u) {
    if (lid < s) kiln_red[lid] = max(kiln_red[lid], kiln_red[lid + s]);
    barrier();
  }
  const float r = kiln_red[0];
  barrier();
  return r;
}

float kiln_nan() { return uintBitsToFloat(0x7fc00000u); }
