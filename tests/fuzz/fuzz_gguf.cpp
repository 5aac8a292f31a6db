// libFuzzer target: GGUF parsing of arbitrary bytes, then every accessor a loader uses.
#include <cstddef>
#include <cstdint>

#include "formats/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = dflash::GgufFile::parse(std::span<const uint8_t>(data, size));
  if (!f.ok()) return 0;
  volatile size_t sink = 0;
  for (const auto& [key, value] : f->metadata()) {
    sink += value.summary().size();
    if (auto* s = value.as_string_array()) sink += s->size();
    if (auto fa = value.as_float_array()) sink += fa->size();
    (void)f->get_int(key);
    (void)f->get_string(key);
  }
  for (const auto& t : f->tensors()) {
    auto bytes = f->tensor_data(t);
    if (!bytes.empty()) sink += bytes[bytes.size() - 1];  // touches the last byte: must be in bounds
  }
  (void)sink;
  return 0;
}
