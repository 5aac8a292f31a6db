#include "support/fixture_models.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "support/test_paths.h"

namespace dflash::test {

const Weights& fixture_model(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Weights>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = loaded[name];
  if (slot == nullptr) {
    auto w = Weights::load(fixture_path("models/" + name), 2);
    if (!w.ok()) {
      ADD_FAILURE() << name << ": " << w.status().to_string();
      std::abort();
    }
    slot = std::make_unique<Weights>(std::move(w).value());
  }
  return *slot;
}

}  // namespace dflash::test
