// Text that leaves the engine (decoded samples, tokenizer output) is valid UTF-8. Byte-level
// tokenizers can split a character between tokens, and a model can emit any byte sequence, so
// the bytes are repaired the way Python's bytes.decode("utf-8", errors="replace") and Rust's
// String::from_utf8_lossy (Hugging Face tokenizers' decode) repair them: each maximal subpart of
// an ill-formed sequence becomes one U+FFFD, the Unicode Standard's recommended practice
// (chapter 3, "U+FFFD Substitution of Maximal Subparts"). Torch-free.
#pragma once
#include <string>
#include <string_view>

namespace me::utf8 {

// The replacement character U+FFFD in UTF-8.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// True when `bytes` is well-formed UTF-8 (no overlong forms, surrogates or code points > U+10FFFF).
bool is_valid(std::string_view bytes);

// `bytes` with every maximal ill-formed subpart replaced by U+FFFD; valid input comes back unchanged.
std::string repair(std::string_view bytes);

}  // namespace me::utf8
