-- help(x) (bindings/lua/help.lua): each constructor lists its fields.lua section with defaults and
-- help, sections by name, objects' methods; every constructor in the me module has a section.
local me = require "megaengine"

local function has(text, pattern, what)
  assert(text:find(pattern), ("%s: no match for %q in:\n%s"):format(what, pattern, text))
end

-- A constructor: every field of its section with its default, variants in full.
local gpt = me.help_text(me.model.gpt)
has(gpt, "^model%.gpt %-%- me%.model%.gpt{...}", "help(me.model.gpt)")
has(gpt, "\n  hidden +integer +128 +hidden size\n", "help(me.model.gpt)")
has(me.help_text(me.model.llama), "\n  vocab +integer +32000 ", "help(me.model.llama)")
has(me.help_text(me.model.llama), "\n  hidden +integer +128 +hidden size\n", "help(me.model.llama)")
has(me.help_text(me.optim.adamw), "\n  betas +table +{ 0%.9, 0%.95 } ", "help(me.optim.adamw)")
has(me.help_text(me.schedule.wsd), "\n  kind +string +\"wsd\" ", "help(me.schedule.wsd)")
has(me.help_text(me.recipe), "batch, parallel, comm, train, sample, checkpoint, log", "help(me.recipe)")
-- A spec made by a constructor: its section and its methods.
local spec = me.help_text(me.model.gpt { layers = 2 })
has(spec, "^model%.gpt ", "help(spec)")
has(spec, "methods: build, parameter_count", "help(spec)")
-- Sections by name, groups of sections, and a wrong name.
has(me.help_text("parallel"), "\n  tp +integer +1 +tensor%-parallel size", "help('parallel')")
has(me.help_text("model"), "variants: model%.gpt, model%.llama", "help('model')")
has(me.help_text("optimizer"), "optimizer%.sgd %-%- ", "help('optimizer')")
has(me.help_text("paralel"), "no recipe section 'paralel'; sections: recipe, model", "help('paralel')")
-- Objects: their methods; tables of the module: what they hold; anything else: a hint.
local t = me.tensor.ones { 2 }
has(me.help_text(t), "me%.Tensor: methods, called as obj:<name>%(%.%.%.%)\n.* matmul ", "help(tensor)")
has(me.help_text(me.model), "constructors.*\n  gpt +me%.model%.gpt{...}", "help(me.model)")
has(me.help_text(me.presets.gpt["39b"]), "hidden = 8192", "help(preset)")
has(me.help_text(me.train), "^me%.train: a function without help of its own", "help(me.train)")
has(me.help_text(42), "a number value", "help(42)")
has(me.help_text(), "^help%(x%) explains x:", "help()")
has(me.help_text(nil), "help%(nil%)", "help(nil)")

-- Every function in the constructor tables is a constructor with a section, except these.
local not_constructors = { [me.data.preprocess] = true, [me.data.loader] = true, [me.tokenizer.load] = true }
local checked = 0
for _, group in ipairs({ "model", "data", "tokenizer", "optim", "schedule" }) do
  for name, f in pairs(me[group]) do
    if type(f) == "function" and not not_constructors[f] then
      local text = me.help_text(f)
      assert(not text:find("without help"), ("me.%s.%s has no fields.lua section for help()"):format(group, name))
      checked = checked + 1
    end
  end
end
assert(checked >= 12, "expected at least 12 constructors, checked " .. checked)
print(("test_help passed (%d constructors)"):format(checked))
