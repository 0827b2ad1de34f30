// CRC-32C (Castagnoli), the checksum of checkpoint shards (and of TensorBoard's records).
// SSE4.2's crc32 instruction where the CPU has it (~10 GB/s per core), slicing-by-8 tables
// otherwise; both give the same value. Torch-free.
#pragma once
#include <cstddef>
#include <cstdint>

namespace me {

// Continues a CRC: crc32c(crc32c(0, a), b) == crc32c(0, a followed by b).
uint32_t crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace me
