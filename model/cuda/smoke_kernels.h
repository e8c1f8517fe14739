// A minimal CUDA kernel that proves the --config=cuda toolchain compiles and
// links .cu files. The model's real kernels will live beside it.
#ifndef MMSERVE_MODEL_CUDA_SMOKE_KERNELS_H_
#define MMSERVE_MODEL_CUDA_SMOKE_KERNELS_H_

#include <cstddef>

namespace mmserve::cuda {

// y[i] = alpha * x[i] + y[i] on the default device. Returns the CUDA error code
// (0 on success) so that callers without a GPU can report why it failed.
int Saxpy(float alpha, const float* x, float* y, size_t n);

}  // namespace mmserve::cuda

#endif  // MMSERVE_MODEL_CUDA_SMOKE_KERNELS_H_
