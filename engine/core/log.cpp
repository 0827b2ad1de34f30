#include "engine/core/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>

namespace me::log {
namespace {

std::atomic<Level> g_level{Level::info};

spdlog::level::level_enum to_spdlog(Level l) {
  switch (l) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

// Progress lines go to stdout (what `tail -f logs/train.out` shows); warnings and errors
// go to stderr so Slurm's split logs keep them apart.
std::shared_ptr<spdlog::logger>& logger() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto out = std::make_shared<spdlog::sinks::stdout_sink_mt>();
    out->set_level(spdlog::level::trace);
    auto lg = std::make_shared<spdlog::logger>("megaengine", out);
    lg->set_level(spdlog::level::trace);
    lg->set_pattern("%v");
    return lg;
  }();
  return l;
}

const char* const kLevelNames[] = {"trace", "debug", "info", "warn", "error", "off"};

std::string& prefix() {
  static std::string p;
  return p;
}

}  // namespace

Level parse_level(const std::string& name) {
  for (int i = 0; i < 6; ++i)
    if (name == kLevelNames[i]) return static_cast<Level>(i);
  fail("unknown log level '", name, "': expected one of trace, debug, info, warn, error, off");
}

std::string level_name(Level level) {
  return kLevelNames[static_cast<int>(level)];
}

void set_level(Level l) { g_level = l; }
Level level() { return g_level; }

void init_from_env() {
  if (const char* env = std::getenv("ME_LOG_LEVEL"); env && *env) {
    try {
      set_level(parse_level(env));
    } catch (const Error& e) {
      throw Error(std::string("ME_LOG_LEVEL: ") + e.what());
    }
  }
}

void set_rank(int rank, int world) {
  const char* prefixed = std::getenv("ME_OUTPUT_PREFIXED");
  if (prefixed && std::string(prefixed) == "1") return;
  prefix() = "[rank " + std::to_string(rank) + "/" + std::to_string(world) + "] ";
}

void write(Level l, const std::string& message) {
  static const char* tags[] = {"trace: ", "debug: ", "", "warning: ", "error: ", ""};
  const std::string line = prefix() + tags[static_cast<int>(l)] + message;
  if (l >= Level::warn) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  } else {
    logger()->log(to_spdlog(l), line);
    logger()->flush();
  }
}

}  // namespace me::log
