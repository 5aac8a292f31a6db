// The project's one logger (spdlog underneath): human-readable lines on stderr.
#pragma once

#include <spdlog/spdlog.h>

namespace dflash::log {

// Sends log lines to stderr (stdout carries program output such as generated text or JSON).
void init_stderr();

// Sets the level from a name ("trace", "debug", "info", "warn", "error", "off").
bool set_level(const std::string& name);

template <typename... Args>
void info(spdlog::format_string_t<Args...> f, Args&&... args) { spdlog::info(f, std::forward<Args>(args)...); }
template <typename... Args>
void warn(spdlog::format_string_t<Args...> f, Args&&... args) { spdlog::warn(f, std::forward<Args>(args)...); }
template <typename... Args>
void error(spdlog::format_string_t<Args...> f, Args&&... args) { spdlog::error(f, std::forward<Args>(args)...); }
template <typename... Args>
void debug(spdlog::format_string_t<Args...> f, Args&&... args) { spdlog::debug(f, std::forward<Args>(args)...); }

}  // namespace dflash::log
