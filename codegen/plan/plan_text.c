// plan_text.c: the plan as stable text (plan.txt), and back. One line per buffer, tensor
// placement, scratch, tile list and launch; a SymSize prints as {c b t jag}. plan_read parses
// exactly what plan_print writes (the AOT artifact carries it), against the same IR.
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

static void print_sym(FILE *out, SymSize s) {
  fprintf(out, "{%" PRId64 " %" PRId64 " %" PRId64 " %d}", s.c, s.b, s.t, s.jag);
}

static const char *const arg_kinds[] = {"tensor", "grad", "optstate", "offsets", "size", "int",
                                        "float", "step", "tiles", "workspace", "scratch",
                                        "tensormap", "tilecount"};
static const char *const launch_kinds[] = {"kernel", "gemm", "zero"};

static void print_arg(FILE *out, const LaunchArg *a) {
  fprintf(out, " %s:%d:%d:%d:%d:%" PRId64 ":%a:", arg_kinds[a->kind], a->tensor, a->slot, a->jag, a->tiles,
          a->i, (double)a->f);
  print_sym(out, a->size);
}

int plan_arg_bytes(ArgKind k) { return k == ARG_FLOAT ? 4 : k == ARG_TENSOR_MAP ? 128 : 8; }

int launch_param_bytes(const Launch *l) {
  int bytes = 0;
  for (int a = 0; a < l->nargs; a++) {
    int size = plan_arg_bytes(l->args[a].kind);
    bytes = (bytes + size - 1) / size * size + size;
  }
  return bytes;
}

void plan_print(FILE *out, const Plan *p) {
  const Ir *ir = p->ir;
  fprintf(out, "plan %s target %s\n", ir->model ? ir->model : "?", p->target);
  fprintf(out, "buffers %d\n", p->nbuffers);
  for (int i = 0; i < p->nbuffers; i++) {
    fprintf(out, "buffer %d %s %s ", i, p->buffers[i].name, p->buffers[i].persistent ? "persistent" : "shared");
    print_sym(out, p->buffers[i].bytes);
    fputc('\n', out);
  }
  for (int t = 0; t < ir->ntensors; t++) {
    if (p->tensor_buffer[t] < 0) continue;
    fprintf(out, "tensor %d %s buffer %d offset ", t, ir->tensors[t].name, p->tensor_buffer[t]);
    print_sym(out, p->tensor_offset[t]);
    fputc('\n', out);
  }
  for (int t = 0; t < ir->ntensors; t++)
    if (p->optstate_buffer[2 * t] >= 0 || p->optstate_buffer[2 * t + 1] >= 0)
      fprintf(out, "optstate %d %s %d %d\n", t, ir->tensors[t].name, p->optstate_buffer[2 * t],
              p->optstate_buffer[2 * t + 1]);
  fprintf(out, "scratches %d\n", p->nscratch);
  for (int i = 0; i < p->nscratch; i++) {
    fprintf(out, "scratch %d %s buffer %d bytes ", i, p->scratch[i].name, p->scratch[i].buffer);
    print_sym(out, p->scratch[i].bytes);
    fputc(' ', out);
    print_sym(out, p->scratch[i].offset);
    fputc('\n', out);
  }
  fprintf(out, "tiles %d\n", p->ntiles);
  for (int i = 0; i < p->ntiles; i++) {
    const TileList *t = &p->tiles[i];
    fprintf(out, "tile %d node %d %d %d %" PRId64 " %" PRId64 " %d %d %d %d %" PRId64 " %d\n", i, t->node,
            t->q_jag, t->kv_jag, t->q_fixed, t->kv_fixed, t->tile_q, t->tile_kv, t->heads, t->causal,
            t->window,  // the order flags in one word: old plans still read
            (int)t->zigzag | (int)t->persistent << 1 | (int)t->key_side << 2);
  }
  fprintf(out, "launches %d\n", p->nlaunches);
  for (int i = 0; i < p->nlaunches; i++) {
    const Launch *l = &p->launches[i];
    fprintf(out, "launch %d %s node %d fused %d %s", i, launch_kinds[l->kind], l->node, l->nfused,
            l->optimizer ? "opt" : (l->backward ? "bwd" : "fwd"));
    if (l->kind == LAUNCH_KERNEL) {
      fprintf(out, " %s grid %s ", l->kernel, l->grid == GRID_TILES        ? "tiles"
                                                      : l->grid == GRID_PERSISTENT ? "persistent"
                                                                                   : "fixed");
      print_sym(out, l->size);
      fprintf(out, " %" PRId64 " threads %d smem %d tilelist %d args %d", l->per_block, l->threads, l->smem,
              l->tiles, l->nargs);
      for (int a = 0; a < l->nargs; a++) print_arg(out, &l->args[a]);
    } else if (l->kind == LAUNCH_GEMM) {
      fprintf(out, " m ");
      print_sym(out, l->gemm_m);
      fprintf(out, " n %" PRId64 " k ", l->gemm_n);
      print_sym(out, l->gemm_k);
      fprintf(out, " ta %d tb %d bias %d beta %a act %s dtype %s kalign %d", l->gemm_trans_a, l->gemm_trans_b,
              l->gemm_has_bias, (double)l->gemm_beta, act_name(l->gemm_act), dtype_name(l->gemm_dtype),
              l->gemm_k_align);
      print_arg(out, &l->gemm_a);
      print_arg(out, &l->gemm_b);
      print_arg(out, &l->gemm_c);
      print_arg(out, &l->gemm_bias);
      print_arg(out, &l->gemm_scale_a);
      print_arg(out, &l->gemm_scale_b);
    } else {
      fprintf(out, " bytes ");
      print_sym(out, l->zero_bytes);
      print_arg(out, &l->zero_arg);
    }
    fputc('\n', out);
  }
}

// --- reading ----------------------------------------------------------------------------

typedef struct Reader {
  const char *s;
  bool ok;
} Reader;

static void skip_ws(Reader *r) {
  while (*r->s == ' ' || *r->s == '\t') r->s++;
}

static const char *word(Reader *r, Arena *a) {
  skip_ws(r);
  const char *b = r->s;
  while (*r->s && *r->s != ' ' && *r->s != '\n') r->s++;
  if (r->s == b) r->ok = false;
  return arena_strndup(a, b, (size_t)(r->s - b));
}

static int64_t num(Reader *r) {
  skip_ws(r);
  char *end;
  long long v = strtoll(r->s, &end, 10);
  if (end == r->s) r->ok = false;
  r->s = end;
  return v;
}

static void expect(Reader *r, const char *w) {
  skip_ws(r);
  size_t n = strlen(w);
  if (strncmp(r->s, w, n) != 0) r->ok = false; else r->s += n;
}

static SymSize sym(Reader *r) {
  SymSize s;
  expect(r, "{");
  s.c = num(r);
  s.b = num(r);
  s.t = num(r);
  s.jag = (int)num(r);
  expect(r, "}");
  return s;
}

static int lookup(const char *w, const char *const *names, int n, Reader *r) {
  for (int i = 0; i < n; i++)
    if (strcmp(w, names[i]) == 0) return i;
  r->ok = false;
  return 0;
}

static LaunchArg read_arg(Reader *r, Arena *a) {
  LaunchArg x;
  memset(&x, 0, sizeof x);
  skip_ws(r);
  const char *b = r->s;
  while (*r->s && *r->s != ':') r->s++;
  char *k = arena_strndup(a, b, (size_t)(r->s - b));
  x.kind = (ArgKind)lookup(k, arg_kinds, (int)(sizeof arg_kinds / sizeof *arg_kinds), r);
  expect(r, ":");
  x.tensor = (int)num(r); expect(r, ":");
  x.slot = (int)num(r); expect(r, ":");
  x.jag = (int)num(r); expect(r, ":");
  x.tiles = (int)num(r); expect(r, ":");
  x.i = num(r); expect(r, ":");
  char *end;
  x.f = (float)strtod(r->s, &end);
  r->s = end;
  expect(r, ":");
  x.size = sym(r);
  return x;
}

static bool next_line(const char **pos, char *buf, size_t size) {
  if (!**pos) return false;
  const char *e = strchr(*pos, '\n');
  size_t n = e ? (size_t)(e - *pos) : strlen(*pos);
  if (n >= size) n = size - 1;
  memcpy(buf, *pos, n);
  buf[n] = '\0';
  *pos = e ? e + 1 : *pos + n;
  return true;
}

bool plan_read(const SourceFile *f, const Ir *ir, Arena *arena, Diag *d, Plan *out) {
  memset(out, 0, sizeof *out);
  out->arena = arena;
  out->ir = ir;
  int nt = ir->ntensors;
  out->tensor_buffer = arena_alloc(arena, (size_t)(nt + 1) * sizeof *out->tensor_buffer);
  out->tensor_offset = arena_alloc(arena, (size_t)(nt + 1) * sizeof *out->tensor_offset);
  out->optstate_buffer = arena_alloc(arena, (size_t)(2 * nt + 1) * sizeof *out->optstate_buffer);
  for (int t = 0; t < nt; t++) out->tensor_buffer[t] = out->optstate_buffer[2 * t] = out->optstate_buffer[2 * t + 1] = -1;
  size_t cap = 1 << 16;
  char *line = malloc(cap);
  if (!line) return false;
  const char *pos = f->text;
  int lineno = 0;
  bool ok = true;
  while (ok && next_line(&pos, line, cap)) {
    lineno++;
    Reader r = {line, true};
    const char *kw = word(&r, arena);
    if (strcmp(kw, "plan") == 0) {
      word(&r, arena);
      expect(&r, "target");
      out->target = word(&r, arena);
    } else if (strcmp(kw, "buffers") == 0) {
      out->nbuffers = (int)num(&r);
      out->buffers = arena_alloc(arena, (size_t)(out->nbuffers + 1) * sizeof *out->buffers);
    } else if (strcmp(kw, "buffer") == 0) {
      int i = (int)num(&r);
      if (i < 0 || i >= out->nbuffers) { r.ok = false; break; }
      out->buffers[i].name = word(&r, arena);
      out->buffers[i].persistent = strcmp(word(&r, arena), "persistent") == 0;
      out->buffers[i].bytes = sym(&r);
    } else if (strcmp(kw, "tensor") == 0) {
      int t = (int)num(&r);
      word(&r, arena);
      expect(&r, "buffer");
      int bi = (int)num(&r);
      expect(&r, "offset");
      SymSize off = sym(&r);
      if (t < 0 || t >= nt) r.ok = false; else { out->tensor_buffer[t] = bi; out->tensor_offset[t] = off; }
    } else if (strcmp(kw, "optstate") == 0) {
      int t = (int)num(&r);
      word(&r, arena);
      int m = (int)num(&r), v = (int)num(&r);
      if (t < 0 || t >= nt) r.ok = false; else { out->optstate_buffer[2 * t] = m; out->optstate_buffer[2 * t + 1] = v; }
    } else if (strcmp(kw, "scratches") == 0) {
      out->nscratch = (int)num(&r);
      out->scratch = arena_alloc(arena, (size_t)(out->nscratch + 1) * sizeof *out->scratch);
    } else if (strcmp(kw, "scratch") == 0) {
      int i = (int)num(&r);
      if (i < 0 || i >= out->nscratch) { r.ok = false; break; }
      out->scratch[i].name = word(&r, arena);
      expect(&r, "buffer");
      out->scratch[i].buffer = (int)num(&r);
      expect(&r, "bytes");
      out->scratch[i].bytes = sym(&r);
      out->scratch[i].offset = sym(&r);
    } else if (strcmp(kw, "tiles") == 0) {
      out->ntiles = (int)num(&r);
      out->tiles = arena_alloc(arena, (size_t)(out->ntiles + 1) * sizeof *out->tiles);
    } else if (strcmp(kw, "tile") == 0) {
      int i = (int)num(&r);
      if (i < 0 || i >= out->ntiles) { r.ok = false; break; }
      TileList *t = &out->tiles[i];
      expect(&r, "node");
      t->node = (int)num(&r); t->q_jag = (int)num(&r); t->kv_jag = (int)num(&r);
      t->q_fixed = num(&r); t->kv_fixed = num(&r); t->tile_q = (int)num(&r); t->tile_kv = (int)num(&r);
      t->heads = (int)num(&r); t->causal = num(&r) != 0; t->window = num(&r);
      int64_t order = num(&r);
      t->zigzag = (order & 1) != 0, t->persistent = (order & 2) != 0, t->key_side = (order & 4) != 0;
    } else if (strcmp(kw, "launches") == 0) {
      out->nlaunches = (int)num(&r);
      out->launches = arena_alloc(arena, (size_t)(out->nlaunches + 1) * sizeof *out->launches);
    } else if (strcmp(kw, "launch") == 0) {
      int i = (int)num(&r);
      if (i < 0 || i >= out->nlaunches) { r.ok = false; break; }
      Launch *l = &out->launches[i];
      l->kind = (LaunchKind)lookup(word(&r, arena), launch_kinds, 3, &r);
      expect(&r, "node");
      l->node = (int)num(&r);
      expect(&r, "fused");
      l->nfused = (int)num(&r);
      const char *phase = word(&r, arena);
      l->optimizer = strcmp(phase, "opt") == 0;
      l->backward = strcmp(phase, "bwd") == 0;
      l->zero_tensor = -1;
      if (l->kind == LAUNCH_KERNEL) {
        l->kernel = word(&r, arena);
        expect(&r, "grid");
        const char *grid = word(&r, arena);
        l->grid = strcmp(grid, "tiles") == 0        ? GRID_TILES
                  : strcmp(grid, "persistent") == 0 ? GRID_PERSISTENT
                                                    : GRID_FIXED;
        l->size = sym(&r);
        l->per_block = num(&r);
        expect(&r, "threads"); l->threads = (int)num(&r);
        expect(&r, "smem"); l->smem = (int)num(&r);
        expect(&r, "tilelist"); l->tiles = (int)num(&r);
        expect(&r, "args"); l->nargs = (int)num(&r);
        if (l->nargs < 0 || l->nargs > PLAN_MAX_ARGS) { r.ok = false; break; }
        l->args = arena_alloc(arena, (size_t)(l->nargs + 1) * sizeof *l->args);
        l->cap_args = l->nargs;
        for (int a = 0; a < l->nargs; a++) l->args[a] = read_arg(&r, arena);
        l->param_bytes = launch_param_bytes(l);
        if (l->param_bytes > PLAN_MAX_PARAM_BYTES) { r.ok = false; break; }
      } else if (l->kind == LAUNCH_GEMM) {
        expect(&r, "m"); l->gemm_m = sym(&r);
        expect(&r, "n"); l->gemm_n = num(&r);
        expect(&r, "k"); l->gemm_k = sym(&r);
        expect(&r, "ta"); l->gemm_trans_a = num(&r) != 0;
        expect(&r, "tb"); l->gemm_trans_b = num(&r) != 0;
        expect(&r, "bias"); l->gemm_has_bias = num(&r) != 0;
        expect(&r, "beta");
        char *end;
        l->gemm_beta = (float)strtod(r.s, &end);
        r.s = end;
        expect(&r, "act");
        if (!act_from_name(word(&r, arena), &l->gemm_act)) r.ok = false;
        expect(&r, "dtype");
        if (!dtype_from_name(word(&r, arena), &l->gemm_dtype)) r.ok = false;
        expect(&r, "kalign"); l->gemm_k_align = (int)num(&r);
        if (l->gemm_k_align < 0 || l->gemm_k_align > 256) r.ok = false;
        l->gemm_a = read_arg(&r, arena);
        l->gemm_b = read_arg(&r, arena);
        l->gemm_c = read_arg(&r, arena);
        l->gemm_bias = read_arg(&r, arena);
        l->gemm_scale_a = read_arg(&r, arena);
        l->gemm_scale_b = read_arg(&r, arena);
      } else {
        expect(&r, "bytes");
        l->zero_bytes = sym(&r);
        l->zero_arg = read_arg(&r, arena);
        if (l->zero_arg.kind == ARG_TENSOR) l->zero_tensor = l->zero_arg.tensor;
      }
    } else if (kw[0] != '\0') {
      r.ok = false;
    }
    if (!r.ok) {
      diag_error(d, (Loc){lineno, 1, lineno, 1}, "malformed plan line: %.80s", line);
      ok = false;
    }
  }
  free(line);
  return ok && out->target != NULL;
}
