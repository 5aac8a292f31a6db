#include "base/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

namespace dflash {

Result<std::string> read_text_file(const std::string& path, size_t max_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return io_error("cannot open '{}': {}", path, std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  while (true) {
    size_t n = std::fread(buf, 1, sizeof(buf), f);
    if (n > 0) {
      if (out.size() + n > max_bytes) {
        std::fclose(f);
        return invalid_argument("'{}' is larger than the {} byte limit for this file", path, max_bytes);
      }
      out.append(buf, n);
    }
    if (n < sizeof(buf)) break;
  }
  bool err = std::ferror(f) != 0;
  std::fclose(f);
  if (err) return io_error("cannot read '{}'", path);
  return out;
}

Status write_all(std::FILE* f, const void* data, size_t n) {
  if (n == 0) return Status();
  if (std::fwrite(data, 1, n, f) != n) return io_error("write failed: {}", std::strerror(errno));
  return Status();
}

Status write_file_atomic(const std::string& path, const std::function<Status(std::FILE*)>& writer,
                         unsigned mode) {
  std::random_device rd;
  std::string tmp = fmt::format("{}.tmp.{:08x}", path, rd());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return io_error("cannot create '{}': {}", tmp, std::strerror(errno));
  std::FILE* f = fdopen(fd, "wb");
  if (f == nullptr) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return io_error("cannot open '{}': {}", tmp, std::strerror(errno));
  }
  Status st = writer(f);
  if (st.ok() && std::fflush(f) != 0) st = io_error("cannot flush '{}': {}", tmp, std::strerror(errno));
  if (st.ok() && fsync(fileno(f)) != 0) st = io_error("cannot fsync '{}': {}", tmp, std::strerror(errno));
  if (std::fclose(f) != 0 && st.ok()) st = io_error("cannot close '{}': {}", tmp, std::strerror(errno));
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0)
    st = io_error("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno));
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st.with_context(fmt::format("writing '{}'", path));
  }
  return Status();
}

Status write_file_atomic(const std::string& path, std::span<const uint8_t> bytes, unsigned mode) {
  return write_file_atomic(
      path, [&](std::FILE* f) { return write_all(f, bytes.data(), bytes.size()); }, mode);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string path_join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (!b.empty() && b.front() == '/') return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

}  // namespace dflash
