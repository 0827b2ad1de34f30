#include "engine/data/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/utf8.h"

namespace me::data {
namespace {

// libme_sentencepiece.so (sentencepiece_plugin.cpp), loaded once per process.
struct Plugin {
  void* (*open)(const char*, char**) = nullptr;
  void (*close)(void*) = nullptr;
  int64_t (*vocab)(void*) = nullptr;
  int64_t (*eos)(void*) = nullptr;
  int64_t (*encode)(void*, const char*, size_t, int32_t*, size_t, char**) = nullptr;
  int64_t (*decode)(void*, const int32_t*, size_t, char*, size_t, char**) = nullptr;
};

std::string take_message(char* m) {
  std::string s = m ? m : "unknown error";
  std::free(m);
  return s;
}

// Where to look: $ME_SENTENCEPIECE_PLUGIN, next to the executable, the build directory.
const Plugin& plugin() {
  static const Plugin p = [] {
    std::vector<std::string> tried;
    if (const char* env = std::getenv("ME_SENTENCEPIECE_PLUGIN")) tried.push_back(env);
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
      const std::string exe(self, static_cast<size_t>(n));
      tried.push_back(exe.substr(0, exe.rfind('/') + 1) + "libme_sentencepiece.so");
    }
#ifdef ME_SENTENCEPIECE_PLUGIN
    tried.push_back(ME_SENTENCEPIECE_PLUGIN);
#endif
    void* h = nullptr;
    std::string why;
#if defined(__SANITIZE_ADDRESS__)
    // AddressSanitizer's runtime refuses RTLD_DEEPBIND. Without it the plugin's protobuf
    // clashes with a LibTorch that bundles its own (Debian's 1.13 does), so in a sanitized build
    // SentencePiece works only in programs without LibTorch (its unit tests); scripts/sanitize.sh
    // leaves out the training runs that need it.
    const int flags = RTLD_NOW | RTLD_LOCAL;
#else
    // DEEPBIND: the plugin's sentencepiece binds to its own protobuf, not pip LibTorch's.
    const int flags = RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND;
#endif
    for (const auto& path : tried) {
      if ((h = dlopen(path.c_str(), flags))) break;
      why += cat("\n  ", path, ": ", dlerror());
    }
    if (!h)
      fail("SentencePiece is not available: libme_sentencepiece.so was not found or did not load", why,
           "\n(it is built when libsentencepiece-dev is installed at configure time; or set ME_SENTENCEPIECE_PLUGIN)");
    Plugin q;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      ME_CHECK(fn, "libme_sentencepiece.so lacks ", name, ": rebuild megaengine");
    };
    sym(q.open, "me_spm_open");
    sym(q.close, "me_spm_close");
    sym(q.vocab, "me_spm_vocab");
    sym(q.eos, "me_spm_eos");
    sym(q.encode, "me_spm_encode");
    sym(q.decode, "me_spm_decode");
    return q;
  }();
  return p;
}

}  // namespace

struct SentencePieceTokenizer::Impl {
  void* sp = nullptr;
  std::string path;
  int64_t vocab = 0;
  int64_t eos = -1;
  ~Impl() {
    if (sp) plugin().close(sp);
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = model_file;
  // Checked here first: sentencepiece's own messages for these are terse, and a directory makes
  // it throw std::ios_base::failure from deep inside Load. (POSIX stat, not std::filesystem:
  // pip's libtorch exports std::filesystem symbols of another libstdc++.)
  struct stat st {};
  if (::stat(model_file.c_str(), &st) != 0)
    fail("cannot open SentencePiece model '", model_file, "': no such file. Pass the .model file that ",
         "spm_train wrote (--model_prefix=NAME writes NAME.model; LLaMA ships tokenizer.model)");
  if (S_ISDIR(st.st_mode))
    fail("SentencePiece model '", model_file, "' is a directory; pass the tokenizer.model file inside it");

  const auto& p = plugin();
  char* error = nullptr;
  impl_->sp = p.open(model_file.c_str(), &error);
  if (!impl_->sp) {
    std::string why = take_message(error);
    while (!why.empty() && (why.back() == ' ' || why.back() == '.')) why.pop_back();
    fail("cannot load SentencePiece model '", model_file, "': ", why, ". Pass the .model file from spm_train ",
         "(not the .vocab file, nor a Hugging Face tokenizer.json)");
  }
  impl_->vocab = p.vocab(impl_->sp);
  impl_->eos = p.eos(impl_->sp);
  // Preprocessing appends eod after every document, so a model without </s> cannot be used.
  if (impl_->eos < 0)
    fail("SentencePiece model '", model_file, "' has no end-of-sentence piece (eos_id is -1), which megaengine ",
         "appends after each document as eod; train it with spm_train --eos_id=N (LLaMA's is 2)");
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept = default;

void SentencePieceTokenizer::encode_into(const std::string& text, std::vector<int64_t>& out) const {
  ME_CHECK(impl_, "SentencePieceTokenizer used after being moved from");
  // At most one id per byte plus the dummy prefix; retried with the exact size otherwise.
  std::vector<int32_t> ids(text.size() + 2);
  char* error = nullptr;
  int64_t n = plugin().encode(impl_->sp, text.data(), text.size(), ids.data(), ids.size(), &error);
  if (n > static_cast<int64_t>(ids.size())) {
    ids.resize(static_cast<size_t>(n));
    n = plugin().encode(impl_->sp, text.data(), text.size(), ids.data(), ids.size(), &error);
  }
  if (n < 0) fail("SentencePiece encode with '", impl_->path, "' failed: ", take_message(error));
  out.insert(out.end(), ids.begin(), ids.begin() + n);
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  ME_CHECK(impl_, "SentencePieceTokenizer used after being moved from");
  std::vector<int32_t> narrow;
  narrow.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    ME_CHECK(id >= 0 && id < impl_->vocab, "SentencePiece decode: token ", i, " is id ", id,
             ", outside the vocabulary [0, ", impl_->vocab, ") of '", impl_->path, "'");
    narrow.push_back(static_cast<int32_t>(id));
  }
  std::string text(ids.size() * 8 + 16, '\0');
  char* error = nullptr;
  int64_t n = plugin().decode(impl_->sp, narrow.data(), narrow.size(), text.data(), text.size(), &error);
  if (n > static_cast<int64_t>(text.size())) {
    text.resize(static_cast<size_t>(n));
    n = plugin().decode(impl_->sp, narrow.data(), narrow.size(), text.data(), text.size(), &error);
  }
  if (n < 0) fail("SentencePiece decode with '", impl_->path, "' failed: ", take_message(error));
  text.resize(static_cast<size_t>(n));
  // SentencePiece already writes U+FFFD for byte pieces that form no character; repair() makes
  // valid UTF-8 a guarantee of every decode rather than of the library version.
  return utf8::repair(text);
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->vocab; }
int64_t SentencePieceTokenizer::eod() const { return impl_->eos; }
std::string SentencePieceTokenizer::describe() const {
  return cat("sentencepiece (", impl_->vocab, " ids, eod ", impl_->eos, ") from ", impl_->path);
}

}  // namespace me::data
