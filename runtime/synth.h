// synth.h: synthetic data with a learnable ground truth. A hidden teacher, fixed by the seed,
// gives every id of every input a random vector and scores an example from its sequence
// contents, its sparse ids and its dense features; the label is Bernoulli(sigmoid(score)).
// A model can therefore beat the constant predictor (NE < 1), and by how much says how much it
// learned. Generation is deterministic for a given seed and example index.
// defines: SynthConfig, LengthDist, synth_init, synth_batch
#ifndef GEMC_SYNTH_H
#define GEMC_SYNTH_H

#include <stdint.h>

#include "batch.h"

typedef enum LengthDist {
  LENGTHS_UNIFORM,    // U[1, max]
  LENGTHS_LOGNORMAL,  // lognormal with median max/8, clamped to [1, max]
  LENGTHS_HEAVY,      // 90% short (U[1, max/16]), 10% long (U[max/2, max])
} LengthDist;

typedef struct SynthConfig {
  uint64_t seed;
  LengthDist lengths;
  double empty_fraction;  // probability that a sequence is empty (length 0); default 0.02
  int64_t id_vocab;       // ids are drawn from [0, min(id_limit, id_vocab)); Zipf-like (s = 1.05)
} SynthConfig;

typedef struct Synth Synth;

Synth *synth_new(const Schema *s, const SynthConfig *cfg);
void synth_free(Synth *g);
// Fills `b` (allocated for s with B examples) with examples [first, first + B) of the stream.
// The same (seed, first) always gives the same batch, so eval splits and resume are exact.
void synth_batch(Synth *g, int64_t first, Batch *b);
bool synth_length_dist_from_name(const char *s, LengthDist *out);
const char *synth_length_dist_name(LengthDist d);

#endif
