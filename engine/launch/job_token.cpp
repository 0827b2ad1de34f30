#include "engine/launch/job_token.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/launch/sha256.h"
#include "engine/core/error.h"

namespace me::launch {
namespace {

std::string errno_text() { return std::strerror(errno); }

// The whole of a small file; throws naming it.
std::string read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot read '", path, "': ", errno_text());
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || out.size() > 4096) {
      ::close(fd);
      fail("cannot read '", path, "': ", n < 0 ? errno_text() : "it is not a job secret (too long)");
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out;
}

void check_private(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("cannot read '", path, "': ", errno_text());
  ME_CHECK(st.st_uid == ::getuid(), "the job secret '", path, "' belongs to another user (uid ", st.st_uid,
           "): remove it, or set ME_JOB_TOKEN");
  char mode[8];
  std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
  ME_CHECK((st.st_mode & 077) == 0, "the job secret '", path, "' can be read by other users (mode ", mode,
           "): run chmod 600 '", path, "'");
}

// Writes a fresh secret next to `path` and links it into place: link() fails with EEXIST when
// another rank (on this node or another one sharing $HOME) won the race, and its secret is used.
void create_secret(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/'));
  if (!dir.empty() && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    fail("cannot create '", dir, "' for the job secret: ", errno_text(), " (or set ME_JOB_TOKEN)");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + random_token().substr(0, 8);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) fail("cannot create the job secret '", tmp, "': ", errno_text(), " (or set ME_JOB_TOKEN)");
  const std::string secret = random_token() + "\n";
  const bool written = ::write(fd, secret.data(), secret.size()) == static_cast<ssize_t>(secret.size());
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!written || !synced) {
    ::unlink(tmp.c_str());
    fail("cannot write the job secret '", tmp, "': ", errno_text());
  }
  const bool linked = ::link(tmp.c_str(), path.c_str()) == 0;
  const int link_errno = errno;
  ::unlink(tmp.c_str());
  if (!linked && link_errno != EEXIST)
    fail("cannot create the job secret '", path, "': ", std::strerror(link_errno), " (or set ME_JOB_TOKEN)");
}

// Who the job is, the same string on every rank.
std::string job_identity(const LaunchEnv& env, const GetEnv& getenv) {
  const std::string where = cat("@", env.master_addr, ":", env.master_port);
  if (const char* job = getenv("SLURM_JOB_ID"); job && *job) {
    const char* step = getenv("SLURM_STEP_ID");
    return cat("slurm job ", job, " step ", step && *step ? step : "?", where);
  }
  if (const char* run = getenv("TORCHELASTIC_RUN_ID"); run && *run) return cat("torchrun ", run, where);
  return cat("rendezvous", where);
}

}  // namespace

std::string random_token() {
  uint8_t bytes[32];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read random bytes for a job token: ", errno_text());
    got += static_cast<std::size_t>(n);
  }
  return to_hex(bytes, sizeof bytes);
}

std::string read_or_create_secret(const std::string& path) {
  if (::access(path.c_str(), F_OK) != 0) create_secret(path);
  check_private(path);
  std::string secret = read_small_file(path);
  ME_CHECK(secret.size() >= 32, "the job secret '", path, "' holds ", secret.size(),
           " characters, fewer than 32: remove it (a new one is made) or set ME_JOB_TOKEN");
  return secret;
}

JobToken job_token(const LaunchEnv& env, const GetEnv& getenv) {
  if (const char* t = getenv("ME_JOB_TOKEN"); t && *t) {
    const std::string token = t;
    ME_CHECK(token.size() >= kMinTokenLength && token.size() <= kMaxTokenLength, "ME_JOB_TOKEN has ", token.size(),
             " characters: use ", kMinTokenLength, " to ", kMaxTokenLength,
             " random ones, e.g. export ME_JOB_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')");
    return {token, "ME_JOB_TOKEN"};
  }
  const char* home = getenv("HOME");
  ME_CHECK(home && *home, "no job token: ME_JOB_TOKEN is not set and neither is HOME (where the per-user secret "
                          ".megaengine/job_secret would be); set ME_JOB_TOKEN to the same random value on every rank");
  const std::string path = std::string(home) + "/.megaengine/job_secret";
  const std::string identity = job_identity(env, getenv);
  return {to_hex(hmac_sha256(read_or_create_secret(path), identity)),
          cat("derived from ", path, " and ", identity)};
}

JobToken job_token(const LaunchEnv& env) {
  return job_token(env, [](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

}  // namespace me::launch
