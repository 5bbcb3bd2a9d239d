// Shared by the activation kernels: the normal CDF through erfc (Numerical Recipes' Chebyshev fit, fractional
// error < 1.2e-7) without cancellation in either tail, and the sigmoids behind silu and gelu_tanh
// (1 + tanh(u) = 2 sigmoid(2u)). The same formulas as the CPU kernels (kernels/cpu/vec_math.hpp).
float kiln_sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }
float kiln_erfc_abs(float ax) {
  const float t = 1.0 / (1.0 + 0.5 * ax);
  float p = t * 0.17087277 - 0.82215223;
  p = p * t + 1.48851587;
  p = p * t - 1.13520398;
  p = p * t + 0.27886807;
  p = p * t - 0.18628806;
  p = p * t + 0.09678418;
  p = p * t + 0.37409196;
  p = p * t + 1.00002368;
  p = p * t - 1.26551223;
  return t * exp(p - ax * ax);
}
float kiln_normal_cdf(float x) {
  const float e = 0.5 * kiln_erfc_abs(abs(x) * 0.70710678118654752);
  return x < 0.0 ? e : 1.0 - e;
}
float kiln_gelu_tanh_sig(float x) { return kiln_sigmoid(2.0 * 0.79788456080286536 * (x + 0.044715 * x * x * x)); }
