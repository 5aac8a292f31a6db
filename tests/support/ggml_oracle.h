// llama.cpp's prebuilt CPU libggml-base.so (npm @node-llama-cpp/linux-x64), opened with dlopen as an oracle.
#pragma once

#include <string>

namespace dflash::test {

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

}  // namespace dflash::test
