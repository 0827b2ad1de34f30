-- help(x) in the REPL: what a constructor takes (its fields.lua section: each field with its
-- type, default and help), a recipe section by name, the methods of an object, or what a table
-- of the `me` module holds. Text only; me.help prints it. The constructor -> section map is
-- megaengine.lua's (filled where each constructor is made), so it cannot drift from them.
local fields = require "megaengine.fields"

local H = {}

local function sorted(list)
  table.sort(list)
  return list
end

-- Names wrapped into indented lines of at most `width` characters.
local function columns(names, width)
  local lines, line = {}, " "
  for _, n in ipairs(names) do
    if #line + #n + 2 > width and line ~= " " then
      lines[#lines + 1] = line
      line = " "
    end
    line = line .. " " .. n
  end
  if line ~= " " then lines[#lines + 1] = line end
  return table.concat(lines, "\n")
end

-- "me.model.gpt" for a value reachable from `me` in up to three steps (found breadth-first).
local function name_in(me, x)
  local queue, seen = { { me, "me", 0 } }, { [me] = true }
  local i = 1
  while queue[i] do
    local t, path, depth = table.unpack(queue[i])
    i = i + 1
    local keys = {}
    for k in pairs(t) do if type(k) == "string" then keys[#keys + 1] = k end end
    for _, k in ipairs(sorted(keys)) do
      local v = rawget(t, k)
      local p = k:match("^[%a_][%w_]*$") and (path .. "." .. k) or ("%s[%q]"):format(path, k)
      if rawequal(v, x) then return p end
      if type(v) == "table" and not seen[v] and depth < 2 then
        seen[v] = true
        queue[#queue + 1] = { v, p, depth + 1 }
      end
    end
  end
  return nil
end

-- The table holding the methods of `x`: its metatable's __index when a table, else `methods`.
local function method_table(x)
  local mt = getmetatable(x)
  if type(mt) ~= "table" then return nil end
  if type(rawget(mt, "__index")) == "table" then return rawget(mt, "__index") end
  if type(rawget(mt, "methods")) == "table" then return rawget(mt, "methods") end
  return nil
end

local function method_names(x)
  local t, names = method_table(x), {}
  for k, v in pairs(t or {}) do
    if type(k) == "string" and type(v) == "function" and k:sub(1, 1) ~= "_" then names[#names + 1] = k end
  end
  return sorted(names)
end

local function section_help(name)
  local text = fields.reference(name)
  if not text then
    local ok, all = pcall(fields.describe, name)  -- a group: "optimizer", "tokenizer", ...
    return ok and all:gsub("%s+$", "") or tostring(all)
  end
  local below = {}
  for _, s in ipairs(fields.sections) do
    if s.name:sub(1, #name + 1) == name .. "." then below[#below + 1] = s.name end
  end
  if #below > 0 then text = text .. ("\nvariants: %s (help(\"%s\"))"):format(table.concat(below, ", "), below[1]) end
  if name == "recipe" then
    text = text .. ("\nand the sections recipe.<name> = { ... }: %s -- help(\"parallel\") lists one")
      :format(table.concat(fields.recipe_sections, ", "))
  end
  return text
end

local function overview()
  local names = {}
  for _, s in ipairs(fields.sections) do names[#names + 1] = s.name end
  return table.concat({
    "help(x) explains x:",
    "  help(me.model.gpt)   a constructor's fields with their defaults and help (me.recipe, me.data.gpt,",
    "                       me.optim.adamw, me.schedule.cosine, me.tokenizer.gpt2, ...)",
    "  help(\"parallel\")     a recipe section by name",
    "  help(trainer)        the methods of an object (a trainer, a model, a tensor, ...)",
    "  help(me.model)       what a table of the me module holds",
    "sections:",
    columns(names, 96),
    "Tab completes names (me.mo<Tab>, trainer:<Tab>); `megaengine --fields [section]` prints the fields too.",
  }, "\n")
end

-- What a table holds: constructors (with their section), functions, tables and values.
local function table_help(me, sections, t, name)
  local groups = { constructor = {}, ["function"] = {}, table = {}, value = {} }
  local entries = {}  -- its own fields and those its metatable's __index table lends it
  for k, v in pairs(method_table(t) or {}) do entries[k] = v end
  for k, v in pairs(t) do entries[k] = v end
  for k, v in pairs(entries) do
    if type(k) == "string" and k:sub(1, 1) ~= "_" then
      if sections[v] then
        local doc = fields[sections[v]].doc or ""
        groups.constructor[#groups.constructor + 1] = ("  %-16s %s"):format(k, doc)
      elseif type(v) == "function" then groups["function"][#groups["function"] + 1] = k
      elseif type(v) == "table" then groups.table[#groups.table + 1] = k
      else groups.value[#groups.value + 1] = ("%s = %s"):format(k, tostring(v)) end
    end
  end
  local out = { (name or tostring(t)) .. ":" }
  if #groups.constructor > 0 then
    out[#out + 1] = "constructors (help(" .. (name or "t") .. ".<name>) lists the fields of one):"
    out[#out + 1] = table.concat(sorted(groups.constructor), "\n")
  end
  for _, kind in ipairs({ "function", "table", "value" }) do
    if #groups[kind] > 0 then
      out[#out + 1] = (kind == "function" and "functions" or kind == "table" and "tables" or "values") .. ":"
      out[#out + 1] = columns(sorted(groups[kind]), 96)
    end
  end
  return table.concat(out, "\n")
end

-- The help text for `x`. `sections` maps each constructor and each spec metatable to its
-- fields.lua section name.
function H.text(me, sections, x, given)
  if not given then return overview() end
  if x == nil then return "help(nil): nothing to explain (a name not defined yet?). help() lists what help knows." end
  if type(x) == "string" then return section_help(x) end
  local name = name_in(me, x)
  for k, v in pairs(_G) do
    if name == nil and rawequal(v, x) and type(k) == "string" then name = k end
  end
  if sections[x] then return section_help(sections[x]) end
  local mt = getmetatable(x)
  if sections[mt] then  -- a spec made by a constructor: its fields, and its methods
    local methods = method_names(x)
    return section_help(sections[mt]) .. (#methods > 0 and ("\nmethods: " .. table.concat(methods, ", ")) or "")
  end
  if type(x) == "table" and (mt == nil or method_table(x) ~= nil) then return table_help(me, sections, x, name) end
  local methods = method_names(x)
  if #methods > 0 then
    local kind = type(mt) == "table" and rawget(mt, "__name") or type(x)
    local head = name and ("%s (%s)"):format(name, kind) or kind
    return ("%s: methods, called as %s:<name>(...)\n%s"):format(head, name or "obj", columns(methods, 96))
  end
  if type(x) == "function" then
    return ("%s: a function without help of its own. help() lists what help knows."):format(name or "this")
  end
  return ("%s: a %s value, nothing to explain. help() lists what help knows."):format(tostring(x), type(x))
end

return H
