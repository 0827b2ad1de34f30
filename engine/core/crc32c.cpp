#include "engine/core/crc32c.h"

#include <array>
#include <cstring>

namespace me {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, reflected

// tables[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kPolynomial : 0u);
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  return t;
}

uint32_t crc_tables(uint32_t crc, const unsigned char* p, size_t n) {
  static const auto t = make_tables();
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;
    crc = t[7][word & 0xff] ^ t[6][(word >> 8) & 0xff] ^ t[5][(word >> 16) & 0xff] ^ t[4][(word >> 24) & 0xff] ^
          t[3][(word >> 32) & 0xff] ^ t[2][(word >> 40) & 0xff] ^ t[1][(word >> 48) & 0xff] ^ t[0][word >> 56];
  }
  for (; n > 0; --n, ++p) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xffu];
  return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ME_CRC32C_HW 1
__attribute__((target("sse4.2"))) uint32_t crc_hardware(uint32_t crc, const unsigned char* p, size_t n) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#ifdef ME_CRC32C_HW
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  crc = hardware ? crc_hardware(crc, p, n) : crc_tables(crc, p, n);
#else
  crc = crc_tables(crc, p, n);
#endif
  return ~crc;
}

}  // namespace me
