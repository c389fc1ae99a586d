// sema_internal.h: what the sema files share and nobody else sees: the Sema state, the
// name environment, the call being lowered, and the helpers each file offers the others.
//   sema.c            driver: settings, inputs, tables, the statement walk, the environment
//   sema_ops.c        expressions, call arguments, and one function per layer op
//   sema_attention.c  gdpa and pma
//   sema_loss.c       bce and the loss statement
//   sema_precision.c  precision defaults and overrides, legality, @schedule hints
// defines: Sema, Symbol, Binding, Call, OpSpec, SEMA_* limits, sema_* helpers
#ifndef GEMC_SEMA_INTERNAL_H
#define GEMC_SEMA_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "ast.h"
#include "diag.h"
#include "ir.h"

// The largest width, batch, dim or seed count gemc accepts: products of two still fit in
// int64, and no tensor is absurdly large.
#define SEMA_MAX_SIZE INT64_C(2147483647)
enum { SEMA_MAX_PARAMS = 10, SEMA_MAX_VARIADIC = 16 };
// Absolute caps on sizes (sema_check_sizes): the rows of one table, the bytes of one tensor at
// the model's batch (64 PiB) and the bytes of all forward tensors together (256 PiB). Under them
// every size the plan and the executors derive (gradients, optimizer state, scratch, offsets)
// fits int64 with room to spare.
#define SEMA_MAX_ROWS (INT64_C(1) << 48)
#define SEMA_MAX_TENSOR_BYTES (INT64_C(1) << 56)
#define SEMA_MAX_TOTAL_BYTES (INT64_C(1) << 58)

// Every source op, counted per binding name for value names (%h.gdpa0, %h.add1).
typedef enum SemaOp {
  SOP_EMBED, SOP_LINEAR, SOP_MLP, SOP_RMSNORM, SOP_LAYERNORM,
  SOP_SILU, SOP_GELU, SOP_GELU_TAYLOR, SOP_RELU, SOP_SIGMOID,
  SOP_CONCAT, SOP_STACK, SOP_FLATTEN, SOP_DOT_INTERACT,
  SOP_GDPA, SOP_PMA, SOP_BCE,
  SOP_ADD, SOP_SUB, SOP_MUL,  // the infix operators, named like the IR ops
  SOP_COUNT
} SemaOp;

// --- the name environment ---------------------------------------------------------------

typedef enum SymKind {
  SYM_INPUT,    // seq, sparse, multihot or dense input
  SYM_LABEL,    // label
  SYM_TABLE,    // embedding table
  SYM_BINDING,  // name = expr; possibly bound several times, possibly not yet
} SymKind;

// One binding of a name (`h = ...`); each rebinding adds one. For unused warnings.
typedef struct Binding {
  const char *name;
  Loc loc;           // the bound name
  int tensor;        // -1: its expression had an error
  bool used;
  const Stmt *stmt;  // the binding statement
} Binding;

typedef struct Symbol {
  const char *name;
  SymKind kind;
  Loc loc;              // the declared name, or the first binding's name
  const Stmt *decl;     // INPUT, LABEL, TABLE: the declaring statement
  int tensor;           // INPUT, LABEL, TABLE: its tensor; -1 when it had an error
  int jag;              // seq and multihot inputs: the jagged dim; -1 otherwise
  bool used;            // INPUT, LABEL, TABLE
  bool ready;           // INPUT, TABLE: its tensor has been made (declared above)
  // BINDING
  int binding;          // index into Sema.bindings of the current binding; -1: not bound yet
  int versions;         // how many times it has been bound so far
  int op_counts[SOP_COUNT];  // ops lowered so far under this name, for %name.<op><i>
} Symbol;

typedef struct Sema {
  const Model *m;
  Diag *d;
  Ir *ir;
  Arena *arena;
  const char *arch;     // --arch, or NULL

  // settings
  const Stmt *setting[STMT_OPTIM + 1];  // the first batch/dim/precision/target/optim statement
  int64_t batch, dim;   // 0: missing or invalid
  DType precision;      // model default
  Loc precision_loc;    // the default's name in `precision P;`, or the model name
  bool mxfp8_noted;     // the sm_90a emulation note was given

  // the environment: an open-addressing hash of Symbol pointers, plus declaration order
  Symbol **slots;
  int cap_slots, nsyms;
  Symbol **order;
  int norder, cap_order;
  Binding *bindings;
  int nbindings, cap_bindings;

  // the statement being lowered
  const char *prefix;   // the bound name, or "loss"
  int *op_counts;       // the counters for `prefix`
  bool bce_allowed;     // lowering a loss term: bce may appear at the top of it
  const Stmt *loss_stmt;
  int loss_counts[SOP_COUNT];
} Sema;

// --- sema.c: environment and shared helpers ---------------------------------------------
Symbol *sema_lookup(Sema *S, const char *name);
// Resolves a NAME expression that should be a tensor (input or binding). Reports unknown
// names (with a did-you-mean note), names used before they are bound, labels and tables.
// Returns the tensor, or -1 after an error (or when the name's own definition had one).
int sema_name_tensor(Sema *S, const Expr *e);
// "unknown name 'x'; expected EXPECTED" with a did-you-mean note among the visible names
// (only those of SymKind `only_kind` when it is >= 0).
void sema_unknown_name(Sema *S, const Expr *e, int only_kind, const char *expected);
// Marks every name under `e` used without reporting anything: after an error, so that one
// mistake does not also produce "never used" warnings.
void sema_touch(Sema *S, const Expr *e);
// Adds a note "did you mean 'X'?" for the candidate closest to `name` (edit distance <= 2).
void sema_suggest(Sema *S, Loc loc, const char *name, const char *const *candidates, int n);
// "a, b, c or d"
const char *sema_list(Sema *S, const char *const *items, int n);
char *sema_fmt(Sema *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// The shape of a tensor as messages print it: "jagged[B, *history, 256]", "dense[B]".
const char *sema_shape(Sema *S, int tensor);
// What an expression is, for "found ...": "the name 'x'", "the integer 3", "a call to mlp".
const char *sema_describe(Sema *S, const Expr *e);
// Integer and number literals, possibly negated: `3`, `-3`, `1e-3`. False (nothing
// reported) for anything else; sema_real_literal accepts integers too.
bool sema_int_literal(const Expr *e, int64_t *out);
bool sema_real_literal(const Expr *e, double *out);

// Tensor builders. The name is copied.
int sema_value(Sema *S, const char *name, Layout layout, int jag, int64_t set_k,
               int64_t width, DType dtype, Loc loc);
// A value laid out like tensor `like` (same layout, jagged dim and set k), with width `width`.
int sema_value_like(Sema *S, const char *name, int like, int64_t width, DType dtype, Loc loc);
// An fp32 master parameter fixed[d0] (d1 == 0) or fixed[d0, d1].
int sema_param(Sema *S, const char *name, int64_t d0, int64_t d1, Loc loc);
static inline const Tensor *sema_tensor(const Sema *S, int i) { return &S->ir->tensors[i]; }

// --- sema_ops.c: expressions and calls ---------------------------------------------------

// Schedule hints, by their bit in OpSpec.hints.
typedef enum Hint {
  HINT_TILE_Q, HINT_TILE_KV, HINT_TILE_M, HINT_TILE_N, HINT_TILE_K, HINT_STAGES,
  HINT_ZIGZAG, HINT_GELU, HINT_DETERMINISTIC, HINT_RECOMPUTE, HINT_COUNT
} Hint;
#define HINTS_ATTENTION ((1u << HINT_TILE_Q) | (1u << HINT_TILE_KV) | (1u << HINT_TILE_M) | \
                         (1u << HINT_STAGES) | (1u << HINT_ZIGZAG) | (1u << HINT_GELU) |   \
                         (1u << HINT_DETERMINISTIC))
#define HINTS_MATMUL ((1u << HINT_TILE_M) | (1u << HINT_TILE_N) | (1u << HINT_TILE_K) | \
                      (1u << HINT_STAGES))
#define HINTS_GELU (1u << HINT_GELU)
// recompute: every op but the lookups and the loss (compiler/passes/recompute.c)
#define HINTS_RECOMPUTE (1u << HINT_RECOMPUTE)
// The hints codegen does not read yet on the matmul ops (linear, mlp, dot_interact): checked
// and kept in the IR, but they change no generated code, so each draws a warning. On gdpa and
// pma every hint acts or is refused (sema_check_attention_schedule); gelu always acts.
#define HINTS_NO_EFFECT_YET ((1u << HINT_TILE_M) | (1u << HINT_TILE_N) | (1u << HINT_TILE_K) | \
                             (1u << HINT_STAGES))

typedef struct OpSpec OpSpec;
typedef struct Call Call;
typedef int (*LowerFn)(Sema *S, Call *c);

struct OpSpec {
  const char *name;       // as written in source
  SemaOp sop;
  const char *signature;  // for messages: "linear(x, n, bias = true)"
  const char *params[SEMA_MAX_PARAMS];  // positional ones first; NULL-terminated
  int npositional;        // how many of params may be given by position
  int nrequired;          // params [0, nrequired) must be given
  int min_variadic, max_variadic;  // variadic ops (concat): positional count; else 0, 0
  bool has_matmul;        // fp8 and mxfp8 are legal
  unsigned hints;         // the schedule hints it takes (HINT_* bits)
  LowerFn lower;
};

// A call being lowered: its bound arguments and its resolved annotations.
struct Call {
  const Expr *e;               // the CALL expression
  const OpSpec *spec;
  const Arg *arg[SEMA_MAX_PARAMS];     // by parameter index; NULL when not given
  const Arg *var[SEMA_MAX_VARIADIC];   // variadic ops: the positional arguments
  int nvar;
  DType prec;                  // the precision the op computes in
  DType value_dtype;           // what its results store (bf16 for fp8 and mxfp8)
  Loc prec_loc;                // where the precision came from (annotation or setting)
  Schedule sched;
  unsigned hints_set;          // HINT_* bits given in @schedule
  Loc hint_loc[HINT_COUNT];    // where each hint was given
  const char *out;             // the name of the op's result
  const char *base;            // "<prefix>.<op><i>": prefix of sub-values and parameters
};

// Lowers `e` to a tensor. `out` names the result when `e` is the top of a binding (NULL:
// an intermediate value, named after the op). Returns -1 after an error.
int sema_expr(Sema *S, const Expr *e, const char *out);
// Lowers an operand that must hold float features (not ids, not a loss); -1 after an error.
int sema_operand(Sema *S, const Expr *e, const char *op);
int sema_arg_operand(Sema *S, Call *c, int param);
// Argument readers. Each reports "argument 'n' of linear expects ..., found ..." on a wrong
// kind and returns false; the `dflt` is stored when the argument was not given.
bool sema_arg_int(Sema *S, Call *c, int param, int64_t dflt, int64_t *out);
bool sema_arg_positive(Sema *S, Call *c, int param, int64_t dflt, int64_t *out);
bool sema_arg_real(Sema *S, Call *c, int param, double dflt, double *out);
bool sema_arg_bool(Sema *S, Call *c, int param, bool dflt, bool *out);
bool sema_arg_act(Sema *S, Call *c, int param, bool attention, Act dflt, Act *out);
// One of `names` (an activation, a pool, a mask); `noun` names the kind in messages.
bool sema_arg_choice(Sema *S, Call *c, int param, const char *noun, const char *const *names,
                     int n, int dflt, int *out);
// Names the call's result and sub-values: counts the op under the statement's prefix and
// sets c->base ("h.gdpa0") and c->out (the requested name, or base). Each op calls it once
// its operands are lowered, just before it adds parameters and nodes.
void sema_call_begin(Sema *S, Call *c);
// A node of the call's op at precision c->prec; no schedule.
Node sema_node_for(const Call *c, OpKind op, int out);
// A linear node x @ w (+ b; b < 0: none) named `name`, laid out like x with width n.
int sema_linear_node(Sema *S, const Call *c, const Schedule *sched, const char *name, int x,
                     int w, int b, int64_t n, Act act);

// --- sema_attention.c -------------------------------------------------------------------
int sema_lower_gdpa(Sema *S, Call *c);
int sema_lower_pma(Sema *S, Call *c);

// --- sema_loss.c ------------------------------------------------------------------------
int sema_lower_bce(Sema *S, Call *c);
void sema_lower_loss(Sema *S, const Stmt *s);

// --- sema_precision.c -------------------------------------------------------------------

// Reads a precision name ("fp32" ... "mxfp8"); false when it is none of them.
bool sema_precision_from_name(const char *s, DType *out);
extern const char *const sema_precision_names[5];
// The dtype a value computed at precision p stores: p itself, or bf16 for fp8 and mxfp8.
DType sema_value_dtype(DType p);
// Applies the annotations around a call (outermost first in `annots`) to `c`: precision
// overrides and @schedule hints, each checked against the op. Sets c->prec and c->sched.
void sema_apply_annotations(Sema *S, Call *c, const Expr *const *annots, int nannots);
// The hint's name as written in @schedule ("tile_q").
const char *sema_hint_name(Hint h);
// The hint of *left (HINT_* bits, not empty) given first in c's source; clears its bit.
Hint sema_next_hint(const Call *c, unsigned *left);
// Checks the 'gelu' hint against the op's activation, once the op knows it.
void sema_check_gelu_hint(Sema *S, const Call *c, Act act);
// Once the op is lowered: on a matmul op, warns in source order about each hint that has no
// effect on the generated code yet ("@schedule(stages) has no effect on this op yet"); on an
// attention op (gdpa, pma), whose `dh` is d / heads (0 for other ops), checks every hint
// against the kernel that will run it (sema_check_attention_schedule; kv_set: the size of a
// set kv, 0 otherwise). A hint that drew an error draws no warning.
void sema_warn_idle_hints(Sema *S, const Call *c, int64_t dh, int64_t kv_set);
// The precision of an op with no annotation: the model default, or bf16 for an op without a
// matmul under an fp8 or mxfp8 default.
DType sema_default_precision(const Sema *S, bool has_matmul);
// The note about emulated mxfp8 on sm_90a, once per model.
void sema_note_mxfp8(Sema *S, Loc loc);

// --- sema_schedule_attention.c ----------------------------------------------------------

// Works out which forward kernel runs attention call c (d / heads = dh) on the target, from
// its precision, shape and the tile_q / tile_m hints, and refuses each hint value that kernel
// does not take, listing the ones it does (docs/schedules.md); kv_set (the size of a set kv, else
// 0) gives the sm_90a kernel's default key tile (sm90_attn_default_tile_kv).
void sema_check_attention_schedule(Sema *S, const Call *c, int64_t dh, int64_t kv_set);

#endif
