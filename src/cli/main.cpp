// dflash: one binary, git-style subcommands.
#include <cstdio>

#include "base/log.h"
#include "cli/commands.h"

namespace dflash::cli {

int report(const Status& status) {
  std::fprintf(stderr, "dflash: %s\n", status.to_string().c_str());
  return 1;
}

}  // namespace dflash::cli

int main(int argc, char** argv) {
  dflash::log::init_stderr();
  CLI::App app{"dflash: a fast local inference server for Qwen3.5/3.6-class models", "dflash"};
  app.set_version_flag("--version", std::string("dflash ") + DFLASH_VERSION);
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")->capture_default_str();
  int exit_code = 0;
  dflash::cli::add_inspect_command(app, exit_code);
  dflash::cli::add_convert_command(app, exit_code);
  dflash::cli::add_quantize_command(app, exit_code);
  dflash::cli::add_tokenize_command(app, exit_code);
  dflash::cli::add_template_command(app, exit_code);
  dflash::cli::add_logits_command(app, exit_code);
  dflash::cli::add_run_command(app, exit_code);
  dflash::cli::add_bench_command(app, exit_code);
  dflash::cli::add_serve_command(app, exit_code);
  app.parse_complete_callback([&] {
    if (!dflash::log::set_level(log_level)) throw CLI::ValidationError("--log-level", "unknown level " + log_level);
  });
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
