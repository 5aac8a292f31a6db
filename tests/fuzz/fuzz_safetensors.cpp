// libFuzzer target: SafetensorsFile::parse over arbitrary bytes returns a file or an error, never crashes,
// and every tensor it accepts lies inside the input (ASan checks the touched bytes).
#include <cstddef>
#include <cstdint>

#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = dflash::SafetensorsFile::parse(std::span<const uint8_t>(data, size));
  if (!f.ok()) return 0;
  volatile uint8_t sink = 0;
  for (const auto& t : f->tensors()) {
    if (!t.data.empty()) sink = static_cast<uint8_t>(sink ^ t.data.front() ^ t.data.back());
    (void)f->find(t.name);
    (void)t.n_elements();
    (void)dflash::safetensors_to_dtype(t.dtype);
  }
  (void)f->metadata().size();
  return 0;
}
