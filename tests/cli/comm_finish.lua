-- A rank that is done must not tear down what its peers still use. Rank 0 serves the
-- rendezvous store and has nothing left to do; ranks 1..3 are still at work (slowed by a
-- second here, as a loaded machine does by chance): they make a group, through the store, and
-- use it. Rank 0 waits for them at the end (Communicator::leave), so they succeed; without
-- that wait they failed on the vanished store (what made cli.tp_matches_tp1 fail now and then).
local me = require "megaengine"
local w = me.comm.init { timeout_s = 60 }
local r, n = w:rank(), w:size()
assert(n == 4, "run me under --nproc 4")
local t = me.tensor.ones { 3 }
w:all_reduce(t)
if r > 0 then
  os.execute("sleep 1")
  local late = me.comm.new_group("late", { 1, 2, 3 })
  local x = me.tensor.ones { 5 }
  late:all_reduce(x)
  assert(x:sum():item() == 15, "the late group's all-reduce")
  print(("rank %d: the late group worked after rank 0 was done"):format(r))
end
