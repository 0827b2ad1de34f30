// checkpoint.load = "hf:DIR": the conversion a run loads from, made once (hf_convert.h).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <mutex>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/hf/convert.h"
#include "engine/core/error.h"
#include "engine/core/files.h"
#include "engine/core/log.h"

namespace me::hf {

namespace {

// What identifies a source: its path, its config and its weight files' names, sizes and times.
std::string source_hash(const std::string& hf_dir) {
  std::string key = files::real_path(hf_dir);
  key += "\n" + checkpoint::read_file(files::join(hf_dir, "config.json"));
  for (const auto& name : files::list(hf_dir)) {
    struct stat st {};
    if (name.find(".safetensors") == std::string::npos || ::stat(files::join(hf_dir, name).c_str(), &st) != 0) continue;
    key += cat("\n", name, " ", st.st_size, " ", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
  }
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (const unsigned char ch : key) h = (h ^ ch) * 1099511628211ULL;
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

// Temporary conversions of single-process runs, removed when the process exits.
std::mutex g_temp_mutex;
std::vector<std::string>& temp_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}
void remove_temp_dirs() {
  std::lock_guard<std::mutex> lock(g_temp_mutex);
  for (const auto& d : temp_dirs()) files::remove_tree(d);
}

// Conversions whose process died before removing them (SIGKILL, a second Ctrl-C during the
// conversion): their names carry the pid.
void remove_orphans(const std::string& base) {
  const std::string prefix = "megaengine-hf-";
  for (const auto& name : files::list(base)) {
    if (name.rfind(prefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    files::remove_tree(files::join(base, name));
    log::info("removed ", files::join(base, name), ", a conversion left by process ", pid, ", which has ended");
  }
}

std::string make_temp_dir() {
  const char* env = std::getenv("TMPDIR");
  const std::string base = env && *env ? env : "/tmp";
  remove_orphans(base);
  std::string pattern = files::join(base, cat("megaengine-hf-", ::getpid(), "-XXXXXX"));
  ME_CHECK(::mkdtemp(pattern.data()), "checkpoint.load = 'hf:...': cannot create a temporary directory '", pattern,
           "' (set TMPDIR, or checkpoint.dir to convert there)");
  std::lock_guard<std::mutex> lock(g_temp_mutex);
  if (temp_dirs().empty()) std::atexit(remove_temp_dirs);
  temp_dirs().push_back(pattern);
  return pattern;
}

}  // namespace

void release_temp_conversion(const std::string& iteration_dir) {
  std::lock_guard<std::mutex> lock(g_temp_mutex);
  auto& dirs = temp_dirs();
  for (auto it = dirs.begin(); it != dirs.end(); ++it)
    if (iteration_dir.rfind(*it + "/", 0) == 0) {
      files::remove_tree(*it);
      dirs.erase(it);
      return;
    }
}

std::string import_hf_for_run(const std::string& hf_dir, const model::TransformerConfig& expected,
                              const std::string& checkpoint_dir, int rank, int world,
                              const std::function<void()>& barrier) {
  const std::string what = "checkpoint.load = 'hf:" + hf_dir + "'";
  const auto config_path = files::join(hf_dir, "config.json");
  ME_CHECK(files::exists(config_path), what, ": there is no config.json there: it is not a Hugging Face model directory");
  // Every rank checks the config, so that a mismatch stops them all alike before anyone waits.
  check_matches(config_from_json(checkpoint::read_file(config_path), config_path), expected, config_path);
  if (checkpoint_dir.empty()) {
    ME_CHECK(world == 1, what, " with ", world, " ranks needs checkpoint.dir, a directory every rank reads, to ",
             "convert the weights into once");
    const auto tmp = make_temp_dir();
    log::info(what, ": converting into ", tmp, " (removed at exit; set checkpoint.dir to keep the conversion)");
    return import_hf(hf_dir, expected, tmp);
  }
  const checkpoint::CheckpointDir target(files::join(checkpoint_dir, "hf_import-" + source_hash(hf_dir)));
  // Rank 0 reaches the barrier even when its conversion fails (a missing tensor, a damaged
  // file), so that the others stop with an error instead of waiting for it. Its reason goes
  // into a file beside the conversion first: whichever rank's error ends the job, it says why.
  const std::string reason_path = target.path() + ".error";
  std::exception_ptr failed;
  if (rank == 0) {
    try {
      files::remove_tree(reason_path);
      if (files::exists(target.path()) && target.latest()) {
        log::info(what, ": reusing its conversion ", target.path());
      } else {
        files::remove_tree(target.path());  // an interrupted conversion
        log::info(what, ": converting into ", target.path());
        import_hf(hf_dir, expected, target.path());
      }
    } catch (const std::exception& e) {
      failed = std::current_exception();
      try {
        checkpoint::write_file_atomic(reason_path, e.what());
      } catch (...) {  // the reason is then only in rank 0's own error
      }
    } catch (...) {  // whatever it was, rank 0 still reaches the barrier
      failed = std::current_exception();
    }
  }
  if (barrier && world > 1) barrier();
  if (failed) std::rethrow_exception(failed);
  const auto latest = target.latest();
  ME_CHECK(!files::exists(reason_path), what, ": rank 0 failed to convert the weights: ",
           checkpoint::read_file(reason_path));
  ME_CHECK(latest, what, ": rank ", rank, " finds no conversion in ", target.path(),
           ": rank 0 failed to convert the weights (its error says why), or checkpoint.dir is not on a file ",
           "system every rank shares");
  return target.iteration_path(*latest);
}

}  // namespace me::hf
