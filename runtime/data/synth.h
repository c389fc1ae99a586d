// synth.h: synthetic data with a learnable ground truth. A hidden teacher, fixed by the seed,
// gives every id of every input a random vector and scores an example from its sequence
// contents, its sparse ids and its dense features; the label is Bernoulli(sigmoid(score)).
// A model can therefore beat the constant predictor (NE < 1), and by how much says how much it
// learned. Generation is deterministic for a given seed and example index.
// defines: SynthConfig, LengthDist, synth_config_default, synth_new, synth_batch,
//          synth_teacher_prob, synth_lengths
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
  int64_t id_vocab;       // ids are drawn from [0, min(id_limit, id_vocab)); Zipf-like (s = 1.05);
                          // 0: no cap (the whole table; 2^20 for an id input without one)
} SynthConfig;

typedef struct Synth Synth;

// seed 1, lognormal lengths, empty_fraction 0.02, id_vocab 0 (no cap: ids span each table).
void synth_config_default(SynthConfig *cfg);

Synth *synth_new(const Schema *s, const SynthConfig *cfg);
void synth_free(Synth *g);
// Fills `b` (allocated for s with B examples) with examples [first, first + B) of the stream.
// The same (seed, first) always gives the same batch, so eval splits and resume are exact.
void synth_batch(Synth *g, int64_t first, Batch *b);
// Only the lengths of examples [first, first + b->B): b's offsets and totals, the same as
// synth_batch gives them (each example's length is its own stream). A distributed run cuts a
// global batch into shares from these, then makes only its own share with synth_batch.
void synth_lengths(Synth *g, int64_t first, Batch *b);
// The teacher's probability that label feature `label` (a schema index of a FEATURE_LABEL) is 1
// for example `k` of `b`, from that example's features alone: the Bayes-optimal prediction,
// which synth_batch samples the label from. NaN when `label` is not a label feature.
double synth_teacher_prob(const Synth *g, const Batch *b, int64_t k, int label);
// "uniform", "lognormal", "heavy".
bool synth_length_dist_from_name(const char *s, LengthDist *out);
const char *synth_length_dist_name(LengthDist d);

#endif
