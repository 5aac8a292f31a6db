// The current device's multiprocessor count and compute capability, which launch shapes and kernel choices
// follow (host code, for nvcc and the host compiler alike).
#pragma once

#include <cuda_runtime.h>

#include <map>

namespace dflash::cuda {

struct DeviceTraits {
  int sms = 132;  // multiprocessors (an H100's or H200's where the runtime cannot say)
  int cc = 0;     // compute capability, 10 major + minor (0 where the runtime cannot say)
};

// Cached per device and thread.
inline DeviceTraits current_device_traits() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return DeviceTraits{};
  }
  thread_local std::map<int, DeviceTraits> traits;
  if (const auto it = traits.find(dev); it != traits.end()) return it->second;
  DeviceTraits t;
  int n = 0, major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) cudaGetLastError();
  if (n >= 1) t.sms = n;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess)
    t.cc = 10 * major + minor;
  else
    cudaGetLastError();
  traits.emplace(dev, t);
  return t;
}

inline int current_sm_count() { return current_device_traits().sms; }
inline int current_compute_capability() { return current_device_traits().cc; }

}  // namespace dflash::cuda
