#include "ops/cuda/device.h"

#include <cuda_runtime.h>

namespace dflash::cuda {

Result<std::vector<DeviceInfo>> list_devices() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();  // clear the sticky error for later calls
    return std::vector<DeviceInfo>{};
  }
  if (err != cudaSuccess) return io_error("cudaGetDeviceCount: {}", cudaGetErrorString(err));
  std::vector<DeviceInfo> out;
  // cudaMemGetInfo reports on the current device: each is made current in turn, and the caller's restored
  // (CudaBackend remembers which device it made current).
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) current = -1;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    err = cudaGetDeviceProperties(&prop, i);
    if (err != cudaSuccess) return io_error("cudaGetDeviceProperties({}): {}", i, cudaGetErrorString(err));
    DeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.sm_major = prop.major;
    d.sm_minor = prop.minor;
    d.multiprocessors = prop.multiProcessorCount;
    d.total_bytes = prop.totalGlobalMem;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) d.free_bytes = free_b;
    out.push_back(std::move(d));
  }
  if (current >= 0) cudaSetDevice(current);
  return out;
}

}  // namespace dflash::cuda
