// llama.cpp's prebuilt CPU libggml-base.so (npm @node-llama-cpp/linux-x64), opened with dlopen as an oracle.
#pragma once

#include <cstdint>
#include <string>

namespace dflash::test {

// Row signatures shared by ggml's converters (ggml_fp16_t and ggml_bf16_t are 16-bit PODs).
using GgmlToFloat = void (*)(const void* src, float* dst, int64_t n);
using GgmlFromFloat = void (*)(const float* src, void* dst, int64_t n);

class GgmlOracle {
 public:
  // Opens the library once per process; nullptr (with `why` set) when it is not installed.
  static GgmlOracle* get(std::string* why);

  // A symbol of the library, or nullptr.
  void* symbol(const char* name) const;
  template <typename Fn>
  Fn fn(const char* name) const { return reinterpret_cast<Fn>(symbol(name)); }

 private:
  void* handle_ = nullptr;
};

// A symbol of the oracle library, or nullptr when the library or the symbol is absent.
template <typename Fn>
Fn ggml_symbol(const char* name) {
  GgmlOracle* o = GgmlOracle::get(nullptr);
  return o ? o->fn<Fn>(name) : nullptr;
}

}  // namespace dflash::test

// In a test body: skip loudly when the oracle library is absent (never pass silently).
#define DF_REQUIRE_GGML_ORACLE()                                      \
  do {                                                                \
    std::string df_oracle_error_;                                     \
    if (!::dflash::test::GgmlOracle::get(&df_oracle_error_))          \
      DF_SKIP_LOUDLY(df_oracle_error_);                               \
  } while (0)
