// Runs a shell command from a test and captures what it printed.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dflash::test {

struct CommandResult {
  int exit_code = -1;   // the command's exit status (-1 if it did not exit normally)
  std::string out;      // stdout
  std::string err;      // stderr
};

// Runs `command` with /bin/sh; stdout and stderr are captured separately (through files in a scratch dir).
CommandResult run_command(const std::string& command);

// Quotes a string for /bin/sh.
std::string shell_quote(const std::string& s);

// A program started in the background (servers under test); stdout and stderr go to `log_path`. The
// destructor stops it (SIGTERM, then SIGKILL after 5 s) and reaps it.
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  bool started() const { return pid_ > 0; }
  int pid() const { return pid_; }
  // True while the process has not exited.
  bool running();
  // Sends SIGTERM and waits up to `seconds`; returns the exit code (-1 if killed or still running).
  int stop(double seconds = 5.0);

 private:
  int pid_ = -1;
  int exit_code_ = -1;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

// Starts `dflash serve` as argv_for(port) on a free port, output in `log`, and waits until the log says it
// listens there ("listening on http://HOST:PORT", written once the port is bound). A server that exits first
// (another test took the port between free_port() and its bind: parallel tests) is started again on another
// port, five times at most. Returns the port (the process in *proc), or 0 with *why set.
int start_listening(const std::function<std::vector<std::string>(int)>& argv_for, const std::string& log,
                    std::unique_ptr<ChildProcess>* proc, std::string* why);

}  // namespace dflash::test
