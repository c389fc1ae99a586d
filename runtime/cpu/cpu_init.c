// cpu_init.c: deterministic initialization of every parameter and table from one seed.
//
// Each tensor draws from its own stream, seeded by the seed and a hash of the tensor's name,
// so adding a layer leaves the other layers' initial values unchanged. What a parameter is
// decides its distribution (docs/executor.md, "Initialization"):
//   table                       U(-sqrt(3/D), sqrt(3/D)): mean 0, standard deviation 1/sqrt(D)
//   linear weight fixed[d, n]   U(-sqrt(6/(d+n)), sqrt(6/(d+n)))  (Glorot)
//   linear or layernorm bias    0
//   rmsnorm or layernorm gain   1
//   PMA seeds                   N(0, 0.02²)
//   anything else               Glorot when 2-D, 0 when 1-D
// Values are drawn in double and stored in the mode's type; fp32 mode rounds them to the
// tensor's dtype (a bf16 table holds bf16 values).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_exec_internal.h"
#include "numerics.h"

typedef enum InitKind { INIT_ZERO, INIT_ONE, INIT_GLOROT, INIT_TABLE, INIT_SEEDS } InitKind;

// splitmix64: a small, fast generator with a 64-bit state; good enough for initial weights.
static uint64_t next_u64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1), 53 bits.
static double next_unit(uint64_t *state) { return (double)(next_u64(state) >> 11) * 0x1p-53; }

static double next_normal(uint64_t *state) {  // Box-Muller
  double u = 1.0 - next_unit(state), v = next_unit(state);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static uint64_t hash_name(const char *s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

// What tensor t is, from the first forward node that reads it.
static InitKind init_kind(const Ir *ir, int t) {
  const Tensor *tt = &ir->tensors[t];
  if (tt->kind == TENSOR_TABLE) return INIT_TABLE;
  for (int i = 0; i < ir->nforward && i < ir->nnodes; i++) {
    const Node *n = &ir->nodes[i];
    for (int k = 0; k < n->nins; k++) {
      if (n->ins[k] != t) continue;
      switch (n->op) {
      case OP_LINEAR: return k == 1 ? INIT_GLOROT : INIT_ZERO;
      case OP_RMSNORM: return INIT_ONE;
      case OP_LAYERNORM: return k == 1 ? INIT_ONE : INIT_ZERO;
      case OP_ATTENTION: return INIT_SEEDS;
      default: break;
      }
    }
  }
  return tt->nfixed == 2 ? INIT_GLOROT : INIT_ZERO;
}

// Elements [from, from + n) of tensor t (rows x width), into f32 (rounded to its dtype) or
// f64. The stream drops one draw, then takes `draws` per element in row-major order; a
// splitmix64 state only adds a constant per draw, so element `from`'s state is known directly.
static void init_elements(const Ir *ir, int t, int64_t rows, int64_t width, uint64_t seed,
                          int64_t from, int64_t n, float *f32, double *f64) {
  const Tensor *tt = &ir->tensors[t];
  InitKind kind = init_kind(ir, t);
  uint64_t draws = kind == INIT_SEEDS ? 2 : kind == INIT_GLOROT || kind == INIT_TABLE ? 1 : 0;
  uint64_t state = (seed ^ hash_name(tt->name)) +
                   (1 + (uint64_t)from * draws) * 0x9e3779b97f4a7c15ull;
  double bound = 0;
  if (kind == INIT_GLOROT) bound = sqrt(6.0 / (double)(rows + width));
  if (kind == INIT_TABLE) bound = sqrt(3.0 / (double)width);
  for (int64_t i = 0; i < n; i++) {
    double v = 0;
    switch (kind) {
    case INIT_ZERO: v = 0; break;
    case INIT_ONE: v = 1; break;
    case INIT_GLOROT:
    case INIT_TABLE: v = bound * (2.0 * next_unit(&state) - 1.0); break;
    case INIT_SEEDS: v = 0.02 * next_normal(&state); break;
    }
    if (f64) f64[i] = v;
    else f32[i] = round_to_dtype((float)v, tt->dtype);
  }
}

void cpu_exec_init_params(CpuExec *x, uint64_t seed) {
  for (int t = 0; t < x->ir->ntensors; t++) {
    TensorKind k = x->ir->tensors[t].kind;
    TensorBuf *b = &x->buf[t];
    if ((k != TENSOR_PARAM && k != TENSOR_TABLE) || !b->data) continue;  // gathered: no values
    bool f64 = x->mode == EXEC_F64;
    init_elements(x->ir, t, b->rows, b->width, seed, 0, b->numel, f64 ? NULL : b->data,
                  f64 ? b->data : NULL);
  }
}

void cpu_init_param_part(const Ir *ir, int t, uint64_t seed, int64_t from, int64_t n,
                         float *out) {
  const Tensor *tt = &ir->tensors[t];
  int64_t rows = tt->nfixed == 2 ? tt->fixed[0] : 1;
  int64_t width = tt->nfixed == 2 ? tt->fixed[1] : tt->fixed[0];
  init_elements(ir, t, rows, width, seed, from, n, out, NULL);
}

void cpu_init_table_rows(const Ir *ir, int t, uint64_t seed, const int64_t *ids, int64_t n,
                         float *out) {
  const Tensor *tt = &ir->tensors[t];
  int64_t D = tt->nfixed > 1 ? tt->fixed[1] : 1;
  for (int64_t i = 0; i < n; i++)
    init_elements(ir, t, tt->fixed[0], D, seed, ids[i] * D, D, out + i * D, NULL);
}
