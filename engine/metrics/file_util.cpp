#include "engine/metrics/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/core/error.h"

namespace me::metrics::detail {

void make_dirs(const std::string& dir, const char* what) {
  ME_CHECK(!dir.empty(), what, ": empty directory name");
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0777) == 0 || errno == EEXIST) continue;
    fail(what, ": cannot create directory '", part, "': ", std::strerror(errno));
  }
  struct stat st {};
  ME_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), what, ": '", dir, "' exists but is not a directory");
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
