// Runs a shell command from a test and captures what it printed.
#pragma once

#include <string>

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

}  // namespace dflash::test
