// megaengine's exit statuses, as an sbatch script sees them (docs/cluster.md; slurm/train.sbatch
// requeues the job on kExitRequeue).
#pragma once

namespace me {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;   // an error, named on stderr
inline constexpr int kExitUsage = 2;   // bad command-line usage
// Stopped by SIGTERM or SIGUSR1 (Slurm's --signal=USR1@300, preemption, scancel) after saving
// a checkpoint at the step boundary: running the same command again resumes (EX_TEMPFAIL).
inline constexpr int kExitRequeue = 75;
// Stopped after train.max_consecutive_nan steps in a row had a non-finite gradient
// (train.nan_policy = "stop"; a checkpoint saved first when checkpoint.dir is set). Running it
// again repeats it: lower the learning rate, clip harder or warm up longer first.
inline constexpr int kExitNonFinite = 65;

}  // namespace me
