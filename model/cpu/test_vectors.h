// Random inputs for the kernel tests of model/cpu (tests only).
#ifndef MMSERVE_MODEL_CPU_TEST_VECTORS_H_
#define MMSERVE_MODEL_CPU_TEST_VECTORS_H_

#include <cstdint>
#include <random>
#include <vector>

namespace mmserve::model::cpu::testing {

// n floats from N(0, scale^2), the same for the same seed.
inline std::vector<float> NormalVector(int64_t n, float scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

}  // namespace mmserve::model::cpu::testing

#endif  // MMSERVE_MODEL_CPU_TEST_VECTORS_H_
