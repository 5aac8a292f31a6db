#include "support/ggml_oracle.h"

#include <dlfcn.h>

#include "support/test_paths.h"

namespace dflash::test {

GgmlOracle* GgmlOracle::get(std::string* why) {
  static GgmlOracle oracle;
  static std::string error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    std::string path = oracle_path("@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so");
    if (path.empty()) {
      error = "llama.cpp's libggml-base.so is not installed (npm install in tests/oracle)";
    } else {
      oracle.handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!oracle.handle_) error = std::string("dlopen failed: ") + dlerror();
    }
  }
  if (!oracle.handle_) {
    if (why) *why = error;
    return nullptr;
  }
  return &oracle;
}

void* GgmlOracle::symbol(const char* name) const { return handle_ ? dlsym(handle_, name) : nullptr; }

}  // namespace dflash::test
