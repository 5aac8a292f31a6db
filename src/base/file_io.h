// Whole-file reads and crash-safe writes (temp file, fsync, rename).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "base/status.h"

namespace dflash {

Result<std::string> read_text_file(const std::string& path, size_t max_bytes = size_t{1} << 30);

// Streams data into `path` atomically: the writer callback gets an open FILE*; the file appears
// under its name only if the callback and fsync succeed. `mode` is the permission of the new file.
Status write_file_atomic(const std::string& path, const std::function<Status(std::FILE*)>& writer,
                         unsigned mode = 0644);
Status write_file_atomic(const std::string& path, std::span<const uint8_t> bytes, unsigned mode = 0644);

// Writes all of `n` bytes or reports why not.
Status write_all(std::FILE* f, const void* data, size_t n);

bool file_exists(const std::string& path);
bool is_directory(const std::string& path);
std::string path_join(const std::string& a, const std::string& b);

}  // namespace dflash
