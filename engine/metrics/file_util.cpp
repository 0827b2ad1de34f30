#include "engine/metrics/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/core/error.h"
#include "engine/core/files.h"

namespace me::metrics::detail {

void make_dirs(const std::string& dir, const char* what) {
  ME_CHECK(!dir.empty(), what, ": empty directory name");
  try {
    files::make_directories(dir);
  } catch (const Error& e) {
    fail(what, ": ", e.what());
  }
}

std::FILE* open_new(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return nullptr;
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) ::close(fd);
  return f;
}

void write_and_flush(std::FILE* f, const std::string& bytes, const std::string& path) {
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fflush(f) == 0;
  if (!ok) fail("cannot write metrics to '", path, "': ", std::strerror(errno), " (is the disk full?)");
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "localhost";
  return buf;
}

}  // namespace me::metrics::detail
