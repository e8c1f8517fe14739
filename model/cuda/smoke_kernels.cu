#include <cuda_runtime.h>

#include "model/cuda/smoke_kernels.h"

namespace mmserve::cuda {
namespace {

__global__ void SaxpyKernel(float alpha, const float* x, float* y, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = alpha * x[i] + y[i];
}

}  // namespace

int Saxpy(float alpha, const float* x, float* y, size_t n) {
  float* dx = nullptr;
  float* dy = nullptr;
  cudaError_t err = cudaMalloc(&dx, n * sizeof(float));
  if (err == cudaSuccess) err = cudaMalloc(&dy, n * sizeof(float));
  if (err == cudaSuccess) err = cudaMemcpy(dx, x, n * sizeof(float), cudaMemcpyHostToDevice);
  if (err == cudaSuccess) err = cudaMemcpy(dy, y, n * sizeof(float), cudaMemcpyHostToDevice);
  if (err == cudaSuccess) {
    constexpr int kThreads = 256;
    SaxpyKernel<<<(n + kThreads - 1) / kThreads, kThreads>>>(alpha, dx, dy, n);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(y, dy, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dy);
  return static_cast<int>(err);
}

}  // namespace mmserve::cuda
