// The current device's multiprocessor count, which launch shapes are chosen by (host code, for nvcc and the host
// compiler alike).
#pragma once

#include <cuda_runtime.h>

#include <map>

namespace dflash::cuda {

// Cached per device and thread; 132 (an H100's or H200's) when the runtime cannot say.
inline int current_sm_count() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 132;
  }
  thread_local std::map<int, int> sms;
  if (const auto it = sms.find(dev); it != sms.end()) return it->second;
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
    cudaGetLastError();
    n = 132;
  }
  sms.emplace(dev, n);
  return n;
}

}  // namespace dflash::cuda
