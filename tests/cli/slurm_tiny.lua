-- recipes/gpt_tiny_bytes.lua with a hook that prints the loss on every rank: the engine's own
-- progress line comes from rank 0 only, and tests/cli/slurm_job.sh checks that both Slurm tasks
-- trained (one data-parallel world, the same falling global-batch loss on each).
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local recipe = dofile(here .. "/../../recipes/gpt_tiny_bytes.lua")
local rank = os.getenv("SLURM_PROCID") or os.getenv("RANK") or "0"
local world = os.getenv("SLURM_NTASKS") or os.getenv("WORLD_SIZE") or "1"
recipe.on_log = function(r)
  io.write(("slurm_tiny: task %s of %s: iteration %d lm loss: %.6E\n"):format(rank, world, r.iteration, r.loss))
  io.flush()
end
return recipe
