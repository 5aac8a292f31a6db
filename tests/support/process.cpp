#include "support/process.h"

#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "support/test_paths.h"

namespace dflash::test {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

CommandResult run_command(const std::string& command) {
  static std::atomic<int> counter{0};
  std::filesystem::path dir = std::filesystem::path(binary_dir()) / "test-scratch" / "commands";
  std::filesystem::create_directories(dir);
  std::string base = (dir / (std::to_string(getpid()) + "-" + std::to_string(counter++))).string();
  std::string full = "(" + command + ") >" + shell_quote(base + ".out") + " 2>" + shell_quote(base + ".err");
  int status = std::system(full.c_str());
  CommandResult r;
  r.exit_code = (status != -1 && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::filesystem::remove(base + ".out");
  std::filesystem::remove(base + ".err");
  return r;
}

}  // namespace dflash::test
