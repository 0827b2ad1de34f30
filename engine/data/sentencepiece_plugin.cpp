// The one file that includes sentencepiece, built as its own shared object (libme_sentencepiece.so)
// with a small C interface. Why: Debian's libsentencepiece carries a private protobuf-lite 3.14 and
// exports its symbols, while libtorch links protobuf 3.21; a process linking both crashes in
// protobuf's static initialisers before main() (google/sentencepiece#723). SentencePieceTokenizer
// dlopen()s this object with RTLD_DEEPBIND, so sentencepiece binds to its own protobuf.
#include <sentencepiece_processor.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

char* copy_message(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

}  // namespace

extern "C" {

// A processor for the model at `path`, or nullptr with *error (malloc'd) saying why.
__attribute__((visibility("default"))) void* me_spm_open(const char* path, char** error) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  sentencepiece::util::Status status;
  try {
    status = sp->Load(path);
  } catch (const std::exception& e) {
    *error = copy_message(e.what());
    delete sp;
    return nullptr;
  }
  if (!status.ok()) {
    std::string why = status.ToString();
    // A file that is no model protobuf is reported as a source line; say it plainly.
    if (why.find("ParseFromArray") != std::string::npos) why = "not a SentencePiece model protobuf";
    *error = copy_message(why);
    delete sp;
    return nullptr;
  }
  return sp;
}

__attribute__((visibility("default"))) void me_spm_close(void* h) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(h);
}

__attribute__((visibility("default"))) int64_t me_spm_vocab(void* h) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(h)->GetPieceSize();
}

__attribute__((visibility("default"))) int64_t me_spm_eos(void* h) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(h)->eos_id();
}

// Encodes text into at most `cap` ids; returns how many there are (call again with more room
// when that exceeds cap), or -1 with *error.
__attribute__((visibility("default"))) int64_t me_spm_encode(void* h, const char* text, size_t len, int32_t* ids,
                                                             size_t cap, char** error) {
  std::vector<int> out;
  const auto status =
      static_cast<sentencepiece::SentencePieceProcessor*>(h)->Encode(std::string(text, len), &out);
  if (!status.ok()) {
    *error = copy_message(status.ToString());
    return -1;
  }
  for (size_t i = 0; i < out.size() && i < cap; ++i) ids[i] = out[i];
  return static_cast<int64_t>(out.size());
}

// Decodes ids into at most `cap` bytes; returns the text's length (call again with more room
// when that exceeds cap), or -1 with *error. The ids must be in range (the caller checks).
__attribute__((visibility("default"))) int64_t me_spm_decode(void* h, const int32_t* ids, size_t n, char* out,
                                                             size_t cap, char** error) {
  std::vector<int> in(ids, ids + n);
  std::string text;
  const auto status = static_cast<sentencepiece::SentencePieceProcessor*>(h)->Decode(in, &text);
  if (!status.ok()) {
    *error = copy_message(status.ToString());
    return -1;
  }
  std::memcpy(out, text.data(), std::min(cap, text.size()));
  return static_cast<int64_t>(text.size());
}

}  // extern "C"
