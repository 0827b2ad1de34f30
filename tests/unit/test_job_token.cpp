// SHA-256 / HMAC against the published test vectors, and where a job's token comes from.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string>

#include "engine/launch/job_token.h"
#include "engine/launch/sha256.h"
#include "engine/core/error.h"
#include "temp_dir.h"

using namespace me::launch;
using Catch::Matchers::Contains;

TEST_CASE("sha256 matches the FIPS 180-4 examples", "[token]") {
  CHECK(to_hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(to_hex(sha256(std::string(1000000, 'a'))) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("hmac_sha256 matches RFC 4231", "[token]") {
  CHECK(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // A key longer than a block is hashed first.
  CHECK(to_hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

namespace {
GetEnv env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST_CASE("random tokens are 64 hex digits and differ", "[token]") {
  const auto a = random_token(), b = random_token();
  CHECK(a.size() == 64);
  CHECK(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(a != b);
}

TEST_CASE("ME_JOB_TOKEN wins, and a short one is refused", "[token]") {
  LaunchEnv env;
  const auto t = job_token(env, env_of({{"ME_JOB_TOKEN", "0123456789abcdef0123"}, {"HOME", "/nonexistent"}}));
  CHECK(t.value == "0123456789abcdef0123");
  CHECK(t.origin == "ME_JOB_TOKEN");
  CHECK_THROWS_WITH(job_token(env, env_of({{"ME_JOB_TOKEN", "short"}})), Contains("ME_JOB_TOKEN has 5 characters"));
}

TEST_CASE("without ME_JOB_TOKEN the token is derived from a private per-user secret", "[token]") {
  TempDir home;
  LaunchEnv env;
  env.master_addr = "node1";
  env.master_port = 29500;
  const auto vars = std::map<std::string, std::string>{{"HOME", home.path}, {"SLURM_JOB_ID", "42"}, {"SLURM_STEP_ID", "0"}};
  const auto a = job_token(env, env_of(vars));
  CHECK(a.value.size() == 64);
  CHECK_THAT(a.origin, Contains("slurm job 42 step 0@node1:29500"));
  // The secret was created owner-only, and every rank (same file, same job) gets the same token.
  struct stat st {};
  REQUIRE(::stat((home / ".megaengine/job_secret").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(job_token(env, env_of(vars)).value == a.value);
  // Another job of the same user: another token.
  auto other = vars;
  other["SLURM_JOB_ID"] = "43";
  CHECK(job_token(env, env_of(other)).value != a.value);
  // Someone who knows the job id but not the secret (another user's HOME) gets another token.
  TempDir stranger;
  auto theirs = vars;
  theirs["HOME"] = stranger.path;
  CHECK(job_token(env, env_of(theirs)).value != a.value);
  // A secret others can read is refused, naming the fix.
  ::chmod((home / ".megaengine/job_secret").c_str(), 0644);
  CHECK_THROWS_WITH(job_token(env, env_of(vars)), Contains("can be read by other users (mode 644): run chmod 600"));
}

TEST_CASE("no ME_JOB_TOKEN and no HOME: a clear error", "[token]") {
  CHECK_THROWS_WITH(job_token(LaunchEnv{}, env_of({})), Contains("set ME_JOB_TOKEN"));
}
