// Where tests find fixtures, the oracle packages (npm) and scratch space.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace dflash::test {

// The repository root and the build directory.
std::string source_dir();
std::string binary_dir();
// tests/fixtures/<rel>
std::string fixture_path(const std::string& rel);
// tests/oracle/node_modules/<rel>, or "" when the oracle packages are not installed.
std::string oracle_path(const std::string& rel);
// A fresh empty directory under the build tree, unique to the running test.
std::string scratch_dir();

// A whole file's bytes (empty when it cannot be read), a file written from bytes (truncated first), and
// the names in a directory: what tests that damage or inspect files on disk need.
std::vector<uint8_t> read_bytes(const std::string& path);
void write_bytes(const std::string& path, std::span<const uint8_t> bytes);
inline void write_bytes(const std::string& path, std::initializer_list<uint8_t> bytes) {
  write_bytes(path, std::span<const uint8_t>(bytes.begin(), bytes.size()));
}
std::set<std::string> dir_entries(const std::string& dir);

}  // namespace dflash::test

// Skips the current test with a message that CI logs show (an oracle that is absent never passes silently).
#define DF_SKIP_LOUDLY(why)                                              \
  do {                                                                   \
    std::fprintf(stderr, "\n*** ORACLE SKIPPED: %s ***\n", std::string(why).c_str()); \
    GTEST_SKIP() << (why);                                               \
  } while (0)
