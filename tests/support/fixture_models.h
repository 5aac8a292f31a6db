// The fixture models of tests/fixtures/models/, loaded once per test process and shared by its tests.
#pragma once

#include <string>

#include "model/weights.h"

namespace dflash::test {

// tests/fixtures/models/<name> (e.g. "tiny-qwen35"); a fixture that does not load aborts the test process.
const Weights& fixture_model(const std::string& name);

}  // namespace dflash::test
