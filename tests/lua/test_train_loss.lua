-- The default recipe, shortened: the loss must fall by more than 1 nat and hooks must run.
local me = require "megaengine"
local recipe = dofile("recipes/gpt_tiny.lua")
me.apply_overrides(recipe, { "train.iters=150", "train.log_interval=10", "train.eval_interval=75",
                             "schedule.warmup_iters=20", "sample.tokens=40" })
local calls = 0
recipe.on_log = function(rec)
  calls = calls + 1
  assert(rec.iteration == calls * 10 and rec.loss > 0 and rec.lr > 0)
end
local trainer = me.trainer(recipe)
local first = trainer:step()
assert(first.iteration == 1 and first.loss > 4.5, "initial byte-level loss is near ln(256) = 5.5, got " .. first.loss)
local summary = trainer:run()
print(("first logged loss %.3f, last %.3f, validation %.3f"):format(summary.first_loss, summary.last_loss, summary.val_loss))
assert(calls == 15, "on_log ran " .. calls .. " times")
assert(summary.iterations == 150)
assert(summary.first_loss - summary.last_loss > 1.0, "loss did not fall by 1 nat")
assert(summary.val_loss < 3.0, "validation loss " .. summary.val_loss)
assert(#summary.sample > #recipe.sample.prompt, "a sample was produced")
print("test_train_loss: all checks passed")
