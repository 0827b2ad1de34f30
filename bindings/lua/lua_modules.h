// The Lua modules embedded into the binary at build time (bindings/lua/*.lua; CMake writes
// the table into generated/embedded_lua.cpp), ended by {nullptr, nullptr}.
#pragma once

namespace me::lua {

struct EmbeddedModule {
  const char* name;    // "megaengine" or "megaengine.NAME"
  const char* source;
};
extern const EmbeddedModule kEmbeddedModules[];

}  // namespace me::lua
