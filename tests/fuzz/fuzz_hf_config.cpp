// libFuzzer target: HF config.json parsing and the ModelSpec built from it (and written to GGUF metadata).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "formats/hf_config.h"
#include "model/model_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = dflash::parse_hf_config_text(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!config.ok()) return 0;
  auto spec = dflash::model_spec_from_hf_config(*config);
  if (!spec.ok()) return 0;
  (void)spec->summary();
  dflash::GgufWriter w;
  (void)dflash::write_model_spec_to_gguf(*spec, w);
  dflash::TensorNameMap names(spec->name_layout());
  (void)names.entries().size();
  return 0;
}
