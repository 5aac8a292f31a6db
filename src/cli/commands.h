// The subcommands of the one `dflash` binary; each file cli/cmd_<name>.cpp adds one.
#pragma once

#include <CLI/CLI.hpp>

#include "base/status.h"

namespace dflash::cli {

// Each adder registers its subcommand on `app`; when it runs, it stores its exit code in `exit_code`.
void add_inspect_command(CLI::App& app, int& exit_code);
void add_convert_command(CLI::App& app, int& exit_code);
void add_quantize_command(CLI::App& app, int& exit_code);
void add_tokenize_command(CLI::App& app, int& exit_code);
void add_template_command(CLI::App& app, int& exit_code);
void add_logits_command(CLI::App& app, int& exit_code);
void add_run_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
void add_serve_command(CLI::App& app, int& exit_code);

// Prints a failed Status the way every subcommand reports errors, and returns the exit code (1).
int report(const Status& status);

}  // namespace dflash::cli
