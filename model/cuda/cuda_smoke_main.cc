// Runs the smoke kernel once: exit 0 when the GPU computed the right answer,
// 1 on a wrong answer, 2 when no usable GPU is present.
#include <cmath>
#include <cstdio>
#include <vector>

#include "model/cuda/smoke_kernels.h"

int main() {
  constexpr size_t kN = 1 << 20;
  std::vector<float> x(kN, 1.5f), y(kN, 2.0f);
  int err = mmserve::cuda::Saxpy(2.0f, x.data(), y.data(), kN);
  if (err != 0) {
    std::fprintf(stderr, "cuda_smoke: CUDA error %d (no GPU?)\n", err);
    return 2;
  }
  for (size_t i = 0; i < kN; ++i) {
    if (std::fabs(y[i] - 5.0f) > 1e-6f) {
      std::fprintf(stderr, "cuda_smoke: y[%zu] = %f, want 5\n", i, y[i]);
      return 1;
    }
  }
  std::printf("cuda_smoke: ok (%zu elements)\n", kN);
  return 0;
}
