// CUDA devices this process can use: enumeration and memory figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace dflash::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

// Every visible device; an empty list (not an error) when the driver reports none.
Result<std::vector<DeviceInfo>> list_devices();

}  // namespace dflash::cuda
