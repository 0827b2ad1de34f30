#include "bindings/cli/repl.h"

extern "C" {
#include <lauxlib.h>
#include <lua.h>
}
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#if ME_HAVE_EDITLINE
#include <editline/readline.h>
#endif

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bindings/lua/lua_util.h"
#include "bindings/cli/repl_complete.h"

namespace me::lua {
namespace {

constexpr int kHistoryLines = 1000;  // kept in ME_HISTORY

// Ctrl-C in the REPL: at the prompt it clears the line (and abandons a statement being continued),
// as Python's and lua.c's do; while a line runs, it stops the Lua code at its next call, return or
// instruction count (lua.c's hook) and the prompt comes back. A training run installs its own
// handler for its duration (engine/core/stop_signals.h: save, then stop).
volatile std::sig_atomic_t interrupted = 0;
lua_State* running = nullptr;  // the state running a line, for the signal handler's hook

void stop_running(lua_State* L, lua_Debug*) {
  lua_sethook(L, nullptr, 0, 0);
  luaL_error(L, "interrupted (Ctrl-C)");
}

// The thread that runs the REPL. A library starts another (OpenBLAS, under LibTorch) that does not
// block SIGINT: the kernel may run the handler there, and then no wait of the REPL's returns EINTR.
// The handler sends the signal on to the REPL's thread, where the stop, the hook and the EINTR belong.
pthread_t repl_thread;

void on_interrupt(int sig) {
  if (!pthread_equal(pthread_self(), repl_thread)) {
    pthread_kill(repl_thread, sig);  // async-signal-safe; pending there while the REPL blocks SIGINT
    return;
  }
  interrupted = 1;
  if (running) lua_sethook(running, stop_running, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);  // signal-safe (lua.c)
}

// SIGINT goes to on_interrupt while it lives (no SA_RESTART: a blocking poll returns EINTR).
class InterruptHandler {
 public:
  InterruptHandler() {
    repl_thread = pthread_self();
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_);
  }
  ~InterruptHandler() { sigaction(SIGINT, &old_, nullptr); }
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

 private:
  struct sigaction old_ {};
};

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
void stifle_history(int) {}
int read_history(const char*) { return 0; }
int write_history(const char*) { return 0; }
void setup_completion(lua_State*) {}
// A line, or nothing at end of input; *cancelled when Ctrl-C cleared it (Ctrl-C at a plain stdin
// prompt ends the line read so far).
std::optional<std::string> read_line(const char* prompt, bool* cancelled) {
  *cancelled = false;
  interrupted = 0;
  char* raw = readline(prompt);
  if (interrupted) *cancelled = true;
  if (!raw) return *cancelled ? std::optional<std::string>("") : std::nullopt;
  std::string line = raw;
  std::free(raw);
  return line;
}
#else
// libedit's callback interface, fed from a poll on stdin: a Ctrl-C interrupts the poll (EINTR)
// rather than libedit's own read, so the line can be cleared and the prompt shown again. (A
// longjmp out of readline() left libedit's state broken.)
char* finished_line = nullptr;
bool line_done = false;
void take_line(char* line) {
  finished_line = line;
  line_done = true;
}

// SIGINT blocked while it lives, but for the poll's waits (ppoll) and libedit's reads. A Ctrl-C that
// comes while libedit works on a key waits for the next check of `interrupted` (with a plain poll
// the handler could run between the check and the poll, which would then wait for input the
// terminal flushed with the ^C). libedit's read must stay open to it: the terminal may flush the
// input between the poll saying "readable" and that read, and the read then only ends on EINTR.
// The CI saw both: "^C" never shown after a Ctrl-C in the middle of typed text.
class InterruptOnlyWhileWaiting {
 public:
  InterruptOnlyWhileWaiting() {
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &previous_);
    blocked_ = previous_;
    sigaddset(&blocked_, SIGINT);
    waiting_ = previous_;
    sigdelset(&waiting_, SIGINT);
  }
  ~InterruptOnlyWhileWaiting() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  InterruptOnlyWhileWaiting(const InterruptOnlyWhileWaiting&) = delete;
  InterruptOnlyWhileWaiting& operator=(const InterruptOnlyWhileWaiting&) = delete;
  int poll(pollfd* fd) const { return ppoll(fd, 1, nullptr, &waiting_); }
  // One key for libedit, whose read may block (see above). A Ctrl-C pending on this thread runs
  // its handler as the mask opens: then the key, typed after it, is left for the next line.
  void read_key() const {
    pthread_sigmask(SIG_SETMASK, &waiting_, nullptr);
    if (!interrupted) rl_callback_read_char();
    pthread_sigmask(SIG_SETMASK, &blocked_, nullptr);
  }

 private:
  sigset_t previous_{}, blocked_{}, waiting_{};
};

std::optional<std::string> read_line(const char* prompt, bool* cancelled) {
  *cancelled = false;
  interrupted = 0;
  line_done = false;
  finished_line = nullptr;
  InterruptOnlyWhileWaiting mask;
  rl_callback_handler_install(prompt, take_line);
  for (;;) {
    if (interrupted) {  // checked with SIGINT blocked: one that comes later ends the next wait
      interrupted = 0;
      std::free(finished_line);
      rl_delete_text(0, rl_end);
      rl_callback_handler_remove();
      std::printf("^C\n");
      std::fflush(stdout);
      *cancelled = true;
      return std::string();
    }
    if (line_done) break;
    pollfd in{STDIN_FILENO, POLLIN, 0};
    const int ready = mask.poll(&in);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) break;
    mask.read_key();
  }
  rl_callback_handler_remove();
  if (!finished_line) return std::nullopt;  // Ctrl-D or end of input
  std::string line = finished_line;
  std::free(finished_line);
  return line;
}

// libedit's completion callbacks take no context: the REPL's state lives here while it runs.
lua_State* completion_state = nullptr;
std::vector<std::string> completion_matches;

char* next_match(const char*, int state) {
  static size_t next = 0;
  if (state == 0) next = 0;
  return next < completion_matches.size() ? strdup(completion_matches[next++].c_str()) : nullptr;
}

char** complete_word(const char* text, int, int) {
  rl_attempted_completion_over = 1;  // no file-name completion when nothing matches
  completion_matches = completions(completion_state, text);
  return completion_matches.empty() ? nullptr : rl_completion_matches(text, next_match);
}

void setup_completion(lua_State* L) {
  completion_state = L;
  rl_readline_name = "megaengine";  // ~/.editrc sections
  rl_attempted_completion_function = complete_word;
  rl_basic_word_break_characters = kCompletionWordBreaks;
  rl_completer_word_break_characters = const_cast<char*>(kCompletionWordBreaks);
  rl_completion_append_character = '\0';  // "me.model" stays open for "." or ":"
}
#endif

// ME_HISTORY (empty: none), else ~/.megaengine_history; none when stdin is not a terminal (piped lines are
// a script, not something to recall).
std::string history_path() {
  if (!isatty(STDIN_FILENO)) return "";
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

// The globals a session starts with: `me` (require "megaengine") and `help` (me.help).
void define_globals(lua_State* L) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "megaengine");
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    std::fprintf(stderr, "%s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
    return;
  }
  lua_getfield(L, -1, "help");
  lua_setglobal(L, "help");
  lua_setglobal(L, "me");
}

}  // namespace

void run_repl(lua_State* L) {
#if ME_HAVE_EDITLINE
  // Before libedit initialises (using_history does): its own SIGINT handler would re-raise every
  // Ctrl-C to the whole process group (kill(0, SIGINT)), racing ours across threads.
  rl_catch_signals = 0;
#endif
  const std::string hist = history_path();
  using_history();
  stifle_history(kHistoryLines);
  if (!hist.empty()) read_history(hist.c_str());
  setup_completion(L);
  std::printf("megaengine %s REPL (Lua 5.4). `me` is require \"megaengine\"; an expression prints its value;\n"
              "help() explains, help(me.model.gpt) lists fields; Tab completes; Ctrl-D exits.\n",
              ME_VERSION);
  std::fflush(stdout);
  define_globals(L);

  InterruptHandler interrupts;
  for (;;) {
    bool cancelled = false;
    const auto first = read_line("me> ", &cancelled);
    if (!first) break;
    std::string line = *first;
    if (cancelled || line.find_first_not_of(" \t") == std::string::npos) continue;
    const int base = lua_gettop(L);
    int status = compile(L, line);
    while (incomplete(L, status)) {  // multi-line statement
      lua_pop(L, 1);
      const auto more = read_line(">> ", &cancelled);
      if (!more || cancelled) break;
      line += "\n";
      line += *more;
      status = luaL_loadbuffer(L, line.c_str(), line.size(), "=stdin");
    }
    if (cancelled) {  // Ctrl-C in a continuation line: the whole statement is dropped
      lua_settop(L, base);
      continue;
    }
    add_history(line.c_str());
    if (!hist.empty()) write_history(hist.c_str());  // now, so a session that dies keeps its lines
    if (status == LUA_OK) {
      try {
        running = L;
        protected_call(L, 0, LUA_MULTRET);
        running = nullptr;
        lua_sethook(L, nullptr, 0, 0);
        print_results(L, base);
      } catch (const std::exception& e) {
        running = nullptr;
        lua_sethook(L, nullptr, 0, 0);
        std::fprintf(stderr, "%s\n", e.what());
      }
    } else {
      std::fprintf(stderr, "%s\n", lua_tostring(L, -1));
    }
    std::fflush(stderr);
    lua_settop(L, base);
  }
  std::printf("\n");
}

}  // namespace me::lua
