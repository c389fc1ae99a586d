// float_bits.h: a float's 32 bits and back, without aliasing (the numerics' rounding and the
// data files' little-endian floats).
// defines: float_bits, bits_float
#ifndef GEMC_FLOAT_BITS_H
#define GEMC_FLOAT_BITS_H

#include <stdint.h>
#include <string.h>

static inline uint32_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline float bits_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

#endif
