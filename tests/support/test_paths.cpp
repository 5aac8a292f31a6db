#include "support/test_paths.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace dflash::test {

// The compiled-in paths, unless the environment moves them (tests built here and run on the GPU machine,
// where the tree lives elsewhere: tests/gpu/run_gpu_tests.sh sets both).
std::string source_dir() {
  const char* e = std::getenv("DFLASH_SOURCE_DIR");
  return e && *e ? e : DFLASH_SOURCE_DIR;
}
std::string binary_dir() {
  const char* e = std::getenv("DFLASH_BINARY_DIR");
  return e && *e ? e : DFLASH_BINARY_DIR;
}

std::string fixture_path(const std::string& rel) { return source_dir() + "/tests/fixtures/" + rel; }

std::string oracle_path(const std::string& rel) {
  std::string p = source_dir() + "/tests/oracle/node_modules/" + rel;
  return std::filesystem::exists(p) ? p : std::string();
}

std::string scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "scratch";
  std::filesystem::path p = std::filesystem::path(binary_dir()) / "test-scratch" / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, std::span<const uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::set<std::string> dir_entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

}  // namespace dflash::test
