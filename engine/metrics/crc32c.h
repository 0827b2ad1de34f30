// The masked CRC-32C of TensorFlow's record files (TensorBoard event files). The CRC itself is
// engine/core/crc32c.h's, shared with the checkpoint shards.
#pragma once
#include <cstdint>

#include "engine/core/crc32c.h"

namespace me::metrics {

// The record format stores CRCs masked, since a CRC of bytes that themselves hold CRCs is weak:
// rotate right by 15 bits, then add 0xa282ead8.
inline uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace me::metrics
