// crc32.c: table-driven CRC-32 (see crc32.h). The table is built on first use.
#include <stdbool.h>

#include "crc32.h"

static uint32_t crc_table[256];
static bool crc_table_ready;

static void build_table(void) {
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = n;
    for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    crc_table[n] = c;
  }
  crc_table_ready = true;
}

uint32_t crc32_update(uint32_t crc, const void *data, size_t size) {
  if (!crc_table_ready) build_table();
  const unsigned char *p = data;
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}
