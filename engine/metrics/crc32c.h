// CRC-32C (Castagnoli), the checksum of TensorFlow's record files (TensorBoard event files).
#pragma once
#include <cstddef>
#include <cstdint>

namespace me::metrics {

// CRC-32C of n bytes, continuing from `crc` (0 to start): reflected polynomial 0x82F63B78,
// initial value and final xor 0xFFFFFFFF, so crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// The record format stores CRCs masked, since a CRC of bytes that themselves hold CRCs is weak:
// rotate right by 15 bits, then add 0xa282ead8.
uint32_t mask_crc(uint32_t crc);

}  // namespace me::metrics
