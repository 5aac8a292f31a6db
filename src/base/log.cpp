#include "base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace dflash::log {

void init_stderr() {
  auto logger = spdlog::stderr_color_mt("dflash");
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  spdlog::set_default_logger(logger);
}

bool set_level(const std::string& name) {
  auto level = spdlog::level::from_str(name);
  if (level == spdlog::level::off && name != "off") return false;
  spdlog::set_level(level);
  return true;
}

}  // namespace dflash::log
