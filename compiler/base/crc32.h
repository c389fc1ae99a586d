// crc32.h: CRC-32 as zlib, PNG and gzip compute it (IEEE 802.3, reflected polynomial
// 0xEDB88320, initial and final XOR 0xFFFFFFFF). The data files checksum every chunk with it.
// defines: crc32_update
#ifndef GEMC_CRC32_H
#define GEMC_CRC32_H

#include <stddef.h>
#include <stdint.h>

// Continues `crc` (0 for a fresh checksum) over `size` bytes: crc32_update(0, "123456789", 9)
// is 0xCBF43926, and crc32_update(crc32_update(0, a, n), b, m) is the CRC of a then b.
uint32_t crc32_update(uint32_t crc, const void *data, size_t size);

#endif
