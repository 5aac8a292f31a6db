#include "support/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <csignal>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>
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

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  pid_ = pid;
}

bool ChildProcess::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    pid_ = -1;
    return false;
  }
  return r == 0;
}

int ChildProcess::stop(double seconds) {
  if (pid_ <= 0) return exit_code_;
  kill(pid_, SIGTERM);
  for (int i = 0; i < static_cast<int>(seconds * 100); ++i) {
    if (!running()) return exit_code_;
    usleep(10000);
  }
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  exit_code_ = -1;
  return -1;
}

ChildProcess::~ChildProcess() { stop(); }

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

int start_listening(const std::function<std::vector<std::string>(int)>& argv_for, const std::string& log,
                    std::unique_ptr<ChildProcess>* proc, std::string* why) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    const int port = free_port();
    if (port <= 0) {
      *why = "no free port";
      return 0;
    }
    *proc = std::make_unique<ChildProcess>(argv_for(port), log);
    if (!(*proc)->started()) {
      *why = "the server did not start";
      return 0;
    }
    const std::string listening = ":" + std::to_string(port) + " ";
    for (int i = 0; i < 600; ++i) {  // up to 60 s
      std::ifstream in(log);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const size_t at = text.find("listening on http://");
      if (at != std::string::npos && text.find(listening, at) != std::string::npos) return port;
      if (!(*proc)->running()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if ((*proc)->running()) {
      *why = "the server did not say it listens within 60 s; see " + log;
      return 0;
    }
    // Exited before listening: the port was taken, or a real failure (then every attempt fails the same way).
    *why = "the server exited; see " + log;
  }
  return 0;
}

}  // namespace dflash::test
