// The Lua host from C++: chunks, errors with positions and tracebacks, argument checks.
#include <catch2/catch.hpp>

#include "bindings/lua/lua_host.h"

using me::lua::LuaHost;

namespace {
std::string run_error(LuaHost& host, const std::string& code) {
  std::string error;
  const bool ok = host.run_chunk(code, "=test", &error);
  return ok ? std::string("<no error>") : error;
}
}  // namespace

TEST_CASE("the megaengine module loads and tensors round-trip values", "[bindings]") {
  LuaHost host;
  std::string error;
  REQUIRE(host.run_chunk("me = require 'megaengine'; t = me.tensor{{1,2},{3,4}}; assert(t:sum():item() == 10)",
                         "=test", &error));
  REQUIRE(host.run_chunk("assert(tostring(me.tensor.zeros{2,3}):find('CPUFloatType{2,3}'))", "=test", &error));
}

TEST_CASE("wrong argument types name the argument and what was expected", "[bindings]") {
  LuaHost host;
  CHECK_THAT(run_error(host, "local me = require 'megaengine'; me.tensor.randn('x')"),
             Catch::Contains("bad argument #1 to 'randn'"));
  CHECK_THAT(run_error(host, "local me = require 'megaengine'; me.tensor.ones{2}:matmul({})"),
             Catch::Contains("bad argument #1 to 'matmul' (tensor expected, got table)"));
  CHECK_THAT(run_error(host, "local me = require 'megaengine'; me.manual_seed('x')"),
             Catch::Contains("bad argument #1 to 'manual_seed' (integer expected, got string)"));
}

TEST_CASE("LibTorch errors reach Lua as one line, without a C++ backtrace", "[bindings]") {
  LuaHost host;
  const auto msg = run_error(host, "local me = require 'megaengine'; me.tensor.ones{2,3}:matmul(me.tensor.ones{2,3})");
  CHECK_THAT(msg, Catch::Contains("cannot be multiplied") || Catch::Contains("size mismatch") ||
                      Catch::Contains("shapes cannot"));
  CHECK_THAT(msg, !Catch::Contains("Exception raised from"));
  CHECK_THAT(msg, !Catch::Contains("frame #"));
}

TEST_CASE("runtime errors carry the chunk's line and a traceback", "[bindings]") {
  LuaHost host;
  const auto msg = run_error(host, "local function f(x)\n  return x.y\nend\nf(nil)");
  CHECK_THAT(msg, Catch::StartsWith("test:2: attempt to index a nil value"));
  CHECK_THAT(msg, Catch::Contains("stack traceback:") && Catch::Contains("test:4"));
}

TEST_CASE("overrides: typed values and clear errors", "[bindings]") {
  LuaHost host;
  std::string error;
  REQUIRE(host.run_chunk(R"(
    me = require 'megaengine'
    r = me.recipe { model = me.model.gpt{}, data = me.data.text{ path = 'x' } }
    me.apply_overrides(r, { 'train.iters=7', 'optimizer.lr=0.5', 'model.tie_embeddings=false', 'device=cuda' })
    assert(r.train.iters == 7 and math.type(r.train.iters) == 'integer')
    assert(r.optimizer.lr == 0.5 and r.model.tie_embeddings == false and r.device == 'cuda')
  )", "=test", &error));
  CHECK_THAT(run_error(host, "me.apply_overrides(r, {'train.iterz=1'})"),
             Catch::Contains("unknown override key 'train.iterz': recipe.train has no field 'iterz'; valid keys there: "
                             "cuda_graphs, deterministic, eval_interval, eval_iters, exit_interval, iters, log_interval, max_consecutive_nan, nan_policy, peak_tflops, profile_at, profile_phases, profile_steps, profile_trace, samples, straggler_factor"));
  CHECK_THAT(run_error(host, "me.apply_overrides(r, {'train.iters=ten'})"),
             Catch::Contains("recipe.train.iters expects an integer, got 'ten'"));
  CHECK_THAT(run_error(host, "me.apply_overrides(r, {'model.tie_embeddings=2'})"),
             Catch::Contains("expects true or false, got '2'"));
  CHECK_THAT(run_error(host, "me.apply_overrides(r, {'=3'})"), Catch::Contains("is not of the form key=value"));
}
