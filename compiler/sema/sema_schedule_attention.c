// sema_schedule_attention.c: the @schedule hints of an attention op (gdpa, pma), checked
// against the forward kernel that will run it (docs/schedules.md). Which kernel runs follows
// codegen/attention/ (emit_attention.c, emit_attention_sm90.c):
//   - on sm_90a, bf16 or fp16 q, k, v of head dim 64 or 128, not PMA: the sm_90a kernel (TMA,
//     wgmma, one persistent CTA per SM), unless tile_q = 64 or a tile_m asks for the older one;
//   - bf16 with d / heads a multiple of 16: the mma.sync kernel;
//   - fp32, fp16 and other head dims: the SIMT kernel; fp8 and mxfp8: the quantized kernel.
// Each kernel takes a few values of tile_q, tile_kv, tile_m and stages; any other value is an
// error that lists the ones it takes. zigzag and gelu act on every kernel. deterministic = true
// is what every kernel does; deterministic = false (dQ added with float atomics inside the
// dK/dV kernel) acts only on the sm_90a kernel at bf16 and head dim 128, and is warned about
// elsewhere.
#include <inttypes.h>
#include <string.h>

#include "attention_sm90_smem.h"  // defines: sm90_attn_forward_smem
#include "sema_internal.h"  // defines: Sema, Call, Hint, sema_* helpers

typedef enum AttnKernel {
  KERNEL_SM90,       // attn_forward_sm90: 128 query rows, 64 or 128 keys a tile, 2..4 stages
  KERNEL_MMA,        // attn_forward: 64 or 128 rows, 16 or 32 a warp, 64 keys, double buffered
  KERNEL_SIMT,       // attn_forward_simt: 64 rows, 64 keys, one stage
  KERNEL_QUANTIZED,  // attnq_forward: 64 rows, 64 keys, one stage
} AttnKernel;

// The sm_90a forward's shared memory against the 227 KB a block may have
// (attention_sm90_smem.h, as codegen and the autotuner compute it).
enum { SM90_TILE_Q = SM90_ATTN_TILE_Q, SM90_MAX_SMEM = SM90_ATTN_MAX_SMEM };

// The kernel that runs a call, and how messages name it.
typedef struct Pick {
  AttnKernel kernel;
  bool sm90_op;      // sm_90a and an op the sm_90a kernel takes: tile_q and tile_m decide
  Hint moved;        // the hint that took it off the sm_90a kernel; HINT_COUNT: none
  const char *name;  // "the mma.sync attention kernel"
  const char *why;   // "" or " (this gdpa runs at fp32)"
} Pick;

// The values of one hint a kernel takes.
typedef struct Values {
  int v[4];
  int n;
} Values;

static bool given(const Call *c, Hint h) { return (c->hints_set & (1u << h)) != 0; }

static int hint_value(const Call *c, Hint h) {
  switch (h) {
  case HINT_TILE_Q: return c->sched.tile_q;
  case HINT_TILE_KV: return c->sched.tile_kv;
  case HINT_TILE_M: return c->sched.tile_m;
  default: return c->sched.stages;
  }
}

static Pick pick_kernel(Sema *S, const Call *c, int64_t dh) {
  Pick p = {.moved = HINT_COUNT, .why = ""};
  DType prec = c->prec;
  if (prec == DT_FP8 || prec == DT_MXFP8) {
    p.kernel = KERNEL_QUANTIZED;
    p.name = "the quantized attention kernel";
    p.why = sema_fmt(S, " (this %s runs at %s)", c->spec->name, dtype_name(prec));
    return p;
  }
  p.sm90_op = strcmp(S->ir->target, "sm_90a") == 0 && c->spec->sop != SOP_PMA &&
              (prec == DT_BF16 || prec == DT_FP16) && (dh == 64 || dh == 128);
  if (p.sm90_op) {
    if (given(c, HINT_TILE_Q) && c->sched.tile_q == 64) p.moved = HINT_TILE_Q;
    else if (given(c, HINT_TILE_M)) p.moved = HINT_TILE_M;
    if (p.moved == HINT_COUNT) {
      p.kernel = KERNEL_SM90;
      p.name = "the sm_90a attention kernel";
      return p;
    }
  }
  if (prec == DT_BF16 && dh % 16 == 0) {
    p.kernel = KERNEL_MMA;
    p.name = "the mma.sync attention kernel";
    if (strcmp(S->ir->target, "sm_90a") != 0)
      p.why = sema_fmt(S, " (the one %s runs at bf16)", S->ir->target);
    else if (c->spec->sop == SOP_PMA)
      p.why = " (sm_90a runs pma on it)";
    else if (!p.sm90_op)
      p.why = sema_fmt(S, " (the sm_90a kernel takes d / heads = 64 or 128, not %" PRId64 ")",
                       dh);
    return p;
  }
  p.kernel = KERNEL_SIMT;
  p.name = "the SIMT attention kernel";
  p.why = prec != DT_BF16
              ? sema_fmt(S, " (this %s runs at %s)", c->spec->name, dtype_name(prec))
              : sema_fmt(S, " (d / heads = %" PRId64 " is not a multiple of 16)", dh);
  return p;
}

// The values of hint h that kernel k takes, for head dim dh and bn keys a tile (stages on the
// sm_90a kernel: those whose shared memory fits).
static Values takes(AttnKernel k, Hint h, int64_t dh, int bn) {
  Values r = {{0}, 0};
  switch (h) {
  case HINT_TILE_Q:
    if (k == KERNEL_SM90) r = (Values){{128}, 1};
    else if (k == KERNEL_MMA) r = (Values){{64, 128}, 2};
    else r = (Values){{64}, 1};
    break;
  case HINT_TILE_KV: r = k == KERNEL_SM90 ? (Values){{16, 32, 64, 128}, 4} : (Values){{64}, 1}; break;
  case HINT_TILE_M:
    if (k == KERNEL_MMA) r = (Values){{16, 32}, 2};
    break;
  default:  // stages
    if (k == KERNEL_SM90) {
      for (int s = 2; s <= 4; s++)
        if (sm90_attn_forward_smem(dh, bn, s) <= SM90_MAX_SMEM) r.v[r.n++] = s;
    } else {
      r = (Values){{k == KERNEL_MMA ? 2 : 1}, 1};
    }
    break;
  }
  return r;
}

static bool has(Values vs, int v) {
  for (int i = 0; i < vs.n; i++)
    if (vs.v[i] == v) return true;
  return false;
}

// "64", "64 or 128", "2, 3 or 4".
static const char *values_text(Sema *S, Values vs) {
  const char *items[4];
  for (int i = 0; i < vs.n; i++) items[i] = sema_fmt(S, "%d", vs.v[i]);
  return sema_list(S, items, vs.n);
}

// The same with "only" before a single value: "takes only 64".
static const char *listed(Sema *S, Values vs) {
  return vs.n == 1 ? sema_fmt(S, "only %d", vs.v[0]) : values_text(S, vs);
}

// The error for stages = v on the sm_90a kernel, where shared memory allows `fit`.
static void refuse_sm90_stages(Sema *S, const Call *c, Values fit, int64_t dh, int bn, int v) {
  Loc at = c->hint_loc[HINT_STAGES];
  const char *where = sema_fmt(S, "on the sm_90a attention kernel at d / heads = %" PRId64
                               " and tile_kv = %d", dh, bn);
  if (v < 2 || v > 4)
    diag_error(S->d, at, "schedule hint 'stages' takes %s %s, found %d%s", listed(S, fit), where,
               v, fit.n < 3 ? sema_fmt(S, "; more do not fit in the %d bytes (227 KB) of shared "
                                       "memory a block may use", SM90_MAX_SMEM) : "");
  else
    diag_error(S->d, at, "schedule hint 'stages' takes %s %s, found %d: %d stages need %" PRId64
               " bytes of shared memory, over the %d (227 KB) a block may use", listed(S, fit),
               where, v, v, sm90_attn_forward_smem(dh, bn, v), SM90_MAX_SMEM);
  if (!given(c, HINT_TILE_KV) && v >= 2 && v <= 4 && sm90_attn_forward_smem(dh, 64, v) <= SM90_MAX_SMEM)
    diag_note(S->d, at, "with tile_kv = 64, %d stages fit (%" PRId64 " bytes)", v,
              sm90_attn_forward_smem(dh, 64, v));
}

void sema_check_attention_schedule(Sema *S, const Call *c, int64_t dh, int64_t kv_set) {
  Pick p = pick_kernel(S, c, dh);
  if (given(c, HINT_DETERMINISTIC) && c->sched.deterministic == 2 &&
      (p.kernel != KERNEL_SM90 || dh != 128 || c->prec == DT_FP16)) {
    const char *why = p.kernel != KERNEL_SM90 ? p.why
                      : dh != 128             ? sema_fmt(S, " at d / heads = %" PRId64, dh)
                                              : " at fp16";
    // A permission, not a demand: the deterministic kernels are always correct, so a model
    // that asks for the atomic dQ still builds for every target (gemc build --arch ...).
    diag_warning(S->d, c->hint_loc[HINT_DETERMINISTIC], "schedule hint 'deterministic = false' "
                 "has no effect on %s%s: the atomic dQ runs only on the sm_90a attention kernel "
                 "at bf16 and d / heads = 128, so this %s keeps the deterministic backward", p.name, why,
                 c->spec->name);
  }
  bool kv_ok = !given(c, HINT_TILE_KV) || has(takes(p.kernel, HINT_TILE_KV, dh, 0),
                                               c->sched.tile_kv);
  int bn = given(c, HINT_TILE_KV) && kv_ok ? c->sched.tile_kv : sm90_attn_default_tile_kv(kv_set);
  unsigned left = c->hints_set & ((1u << HINT_TILE_Q) | (1u << HINT_TILE_KV) |
                                  (1u << HINT_TILE_M) | (1u << HINT_STAGES));
  while (left) {
    Hint h = sema_next_hint(c, &left);
    const char *name = sema_hint_name(h);
    int v = hint_value(c, h);
    Values ok = takes(p.kernel, h, dh, bn);
    if (has(ok, v)) continue;
    Loc at = c->hint_loc[h];
    if (p.kernel == KERNEL_SM90 && h == HINT_TILE_Q) {  // neither 128 nor 64
      diag_error(S->d, at, "schedule hint 'tile_q' takes 64 or 128 on sm_90a, found %d: 128 "
                 "query rows run the sm_90a attention kernel, 64 the %s one", v,
                 c->prec == DT_BF16 ? "mma.sync" : "SIMT");
    } else if (p.kernel == KERNEL_SM90 && h == HINT_STAGES) {
      if (kv_ok) refuse_sm90_stages(S, c, ok, dh, bn, v);
    } else if (ok.n == 0) {  // tile_m on the SIMT or quantized kernel
      diag_error(S->d, at, "schedule hint 'tile_m' is not taken by %s%s; only the mma.sync "
                 "attention kernel takes it (bf16, d / heads a multiple of 16), with 16 or 32",
                 p.name, p.why);
    } else {
      diag_error(S->d, at, "schedule hint '%s' takes %s on %s%s, found %d", name, listed(S, ok),
                 p.name, p.why, v);
    }
    // On sm_90a, a value the sm_90a kernel would take: say which hint chose the other kernel.
    if (p.moved != HINT_COUNT && h != p.moved && h != HINT_TILE_M) {
      Values sm90 = takes(KERNEL_SM90, h, dh, bn);
      if (has(sm90, v))
        diag_note(S->d, c->hint_loc[p.moved], "on sm_90a, %s = %d selects %s; the sm_90a "
                  "attention kernel (tile_q = 128 or none, no tile_m) takes %s = %s",
                  sema_hint_name(p.moved), hint_value(c, p.moved), p.name, name,
                  values_text(S, sm90));
    }
  }
}
