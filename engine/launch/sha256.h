// SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104), for deriving a job's rendezvous token from
// a per-user secret without revealing the secret (see job_token.h). Small and dependency-free:
// the engine links no crypto library for this one use.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace me::launch {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest sha256(const std::string& data);
Sha256Digest hmac_sha256(const std::string& key, const std::string& message);

// Lower-case hexadecimal of any bytes.
std::string to_hex(const uint8_t* data, std::size_t size);
inline std::string to_hex(const Sha256Digest& d) { return to_hex(d.data(), d.size()); }

}  // namespace me::launch
