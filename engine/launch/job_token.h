// The job token: the secret every connection to the job's rendezvous store presents before
// anything else (store_server.h), so only processes of the job can join or read it.
//
// Where it comes from, first match wins:
//  1. ME_JOB_TOKEN. `megaengine --nproc` sets a fresh random one per launch; slurm/train.sbatch
//     generates one per job and exports it (srun passes the environment on); any launcher may.
//  2. Otherwise (plain srun, torchrun): HMAC-SHA-256 of the job's identity (Slurm job and step
//     id, or torchrun's run id, and the rendezvous address) keyed with a per-user secret,
//     $HOME/.megaengine/job_secret (32 random bytes, mode 0600, created on first use). Every
//     rank of the job computes the same token, provided $HOME is shared by the nodes (it is on
//     Slurm clusters; if not, set ME_JOB_TOKEN). The job id alone is not secret (squeue shows
//     it), which is why the secret is mixed in; the secret itself never leaves the node.
//
// What it protects against: other users of the cluster and their processes (a port scan, a
// stray client, another job's ranks that happen to reach our port: all are refused and logged),
// and the same user's other jobs (each job's token differs). What it does not protect against:
// anyone who can read the job's environment or the user's files (the same user, root), and
// anyone who can sniff the network between the nodes: the token and the store's traffic travel
// in clear text (it authenticates, it does not encrypt). It guards the rendezvous store only;
// NCCL's and Gloo's own connections are not authenticated (as in PyTorch).
#pragma once
#include <cstddef>
#include <string>

#include "engine/launch/bootstrap.h"

namespace me::launch {

struct JobToken {
  std::string value;
  std::string origin;  // for messages: "ME_JOB_TOKEN", or how it was derived
};

// Tokens shorter than this are refused: they could be guessed.
constexpr std::size_t kMinTokenLength = 16;
constexpr std::size_t kMaxTokenLength = 1024;

// The token of this job (see above). Throws me::Error when ME_JOB_TOKEN is malformed, or when
// none is set and the secret file cannot be read or created (naming the file and the fix).
JobToken job_token(const LaunchEnv& env, const GetEnv& getenv);
JobToken job_token(const LaunchEnv& env);

// 32 bytes from the kernel's random source, as 64 hex digits.
std::string random_token();

// The per-user secret kept in `path`, created (with its directory, owner-only) when missing.
// Refuses a file that others can read or that another user owns.
std::string read_or_create_secret(const std::string& path);

}  // namespace me::launch
