// The logging facade. Callers see only std::string; spdlog (built on fmt 9) stays inside
// log.cpp, whose target never sees LibTorch's include directory (torch 2.x ships fmt 12).
#pragma once
#include <string>

#include "engine/core/error.h"

namespace me::log {

enum class Level { trace = 0, debug, info, warn, error, off };

// Parses "trace|debug|info|warn|error|off"; throws me::Error naming the valid values.
Level parse_level(const std::string& name);
std::string level_name(Level level);

// The level comes from the recipe or ME_LOG_LEVEL (the environment wins: it is how a
// person turns on debug output for one run without editing the recipe).
void set_level(Level level);
Level level();
void init_from_env();

// One owner for a line's rank prefix: the `--nproc` launcher prefixes every line of its ranks
// ("[rank R] ", Lua's print and stderr included) and says so in ME_OUTPUT_PREFIXED=1; a rank
// started any other way (srun) prefixes its own log lines "[rank R/W]" once ranks exist.
void set_rank(int rank, int world);

void write(Level level, const std::string& message);

template <typename... Args> void trace(Args&&... a) { if (level() <= Level::trace) write(Level::trace, me::cat(std::forward<Args>(a)...)); }
template <typename... Args> void debug(Args&&... a) { if (level() <= Level::debug) write(Level::debug, me::cat(std::forward<Args>(a)...)); }
template <typename... Args> void info(Args&&... a) { if (level() <= Level::info) write(Level::info, me::cat(std::forward<Args>(a)...)); }
template <typename... Args> void warn(Args&&... a) { if (level() <= Level::warn) write(Level::warn, me::cat(std::forward<Args>(a)...)); }
template <typename... Args> void error(Args&&... a) { if (level() <= Level::error) write(Level::error, me::cat(std::forward<Args>(a)...)); }

}  // namespace me::log
