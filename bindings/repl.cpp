#include "bindings/repl.h"

extern "C" {
#include <lauxlib.h>
#include <lua.h>
}
#if ME_HAVE_EDITLINE
#include <editline/readline.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bindings/lua_util.h"

namespace me::lua {
namespace {

#if !ME_HAVE_EDITLINE
// Without libedit: plain lines from stdin, no editing, no history.
char* readline(const char* prompt) {
  std::fputs(prompt, stdout);
  std::fflush(stdout);
  std::string line;
  int c;
  while ((c = std::fgetc(stdin)) != EOF && c != '\n') line.push_back(static_cast<char>(c));
  if (c == EOF && line.empty()) return nullptr;
  return strdup(line.c_str());
}
void add_history(const char*) {}
void using_history() {}
int read_history(const char*) { return 0; }
int write_history(const char*) { return 0; }
#endif

std::string history_path() {
  if (const char* p = std::getenv("ME_HISTORY")) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.megaengine_history";
}

// A syntax error at <eof> means the statement is not finished yet: read another line.
bool incomplete(lua_State* L, int status) {
  if (status != LUA_ERRSYNTAX) return false;
  size_t n = 0;
  const char* msg = lua_tolstring(L, -1, &n);
  const char* eof = "<eof>";
  const size_t k = std::strlen(eof);
  return n >= k && std::strcmp(msg + n - k, eof) == 0;
}

// Compiles `line`, first as an expression (so `1+1` prints 2), then as a statement.
int compile(lua_State* L, const std::string& line) {
  const std::string expr = "return " + (line[0] == '=' ? line.substr(1) : line);
  if (luaL_loadbuffer(L, expr.c_str(), expr.size(), "=stdin") == LUA_OK) return LUA_OK;
  lua_pop(L, 1);
  return luaL_loadbuffer(L, line.c_str(), line.size(), "=stdin");
}

void print_results(lua_State* L, int base) {
  const int n = lua_gettop(L) - base;
  if (n == 0) return;
  lua_getglobal(L, "require");
  lua_pushstring(L, "megaengine");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "pretty");
  const int pretty = lua_gettop(L);
  std::string out;
  for (int i = 1; i <= n; ++i) {
    lua_pushvalue(L, pretty);
    lua_pushvalue(L, base + i);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) lua_pushstring(L, luaL_tolstring(L, base + i, nullptr));
    out += (i > 1 ? "\t" : "") + std::string(lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  std::printf("%s\n", out.c_str());
  std::fflush(stdout);
}

}  // namespace

void run_repl(lua_State* L) {
  const std::string hist = history_path();
  using_history();
  read_history(hist.c_str());
  std::printf("megaengine %s REPL (Lua 5.4). `me` is require \"megaengine\"; =expr prints; Ctrl-D exits.\n",
              ME_VERSION);
  std::fflush(stdout);
  lua_getglobal(L, "require");
  lua_pushstring(L, "megaengine");
  if (lua_pcall(L, 1, 1, 0) == LUA_OK) lua_setglobal(L, "me");
  else lua_pop(L, 1);

  for (;;) {
    char* raw = readline("me> ");
    if (!raw) break;
    std::string line = raw;
    std::free(raw);
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const int base = lua_gettop(L);
    int status = compile(L, line);
    while (incomplete(L, status)) {  // multi-line statement
      lua_pop(L, 1);
      char* more = readline(">> ");
      if (!more) break;
      line += "\n";
      line += more;
      std::free(more);
      status = luaL_loadbuffer(L, line.c_str(), line.size(), "=stdin");
    }
    add_history(line.c_str());
    if (status == LUA_OK) {
      try {
        protected_call(L, 0, LUA_MULTRET);
        print_results(L, base);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
      }
    } else {
      std::fprintf(stderr, "%s\n", lua_tostring(L, -1));
    }
    std::fflush(stderr);
    lua_settop(L, base);
  }
  std::printf("\n");
  write_history(hist.c_str());
}

}  // namespace me::lua
