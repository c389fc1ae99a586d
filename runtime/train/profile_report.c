// profile_report.c: the grouping, the roofline and the table of `gemc train --profile`
// (profile_report.h).
#include "profile_report.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "launch_cost.h"

// The name a launch is grouped under: the kernel, or what cuBLASLt or the memset did.
static void launch_label(const Plan *p, int i, char *out, size_t size) {
  const Launch *l = &p->launches[i];
  switch (l->kind) {
  case LAUNCH_KERNEL: snprintf(out, size, "%s", l->kernel); return;
  case LAUNCH_ZERO: snprintf(out, size, "memset"); return;
  case LAUNCH_GEMM:
    snprintf(out, size, "gemm (cuBLASLt) n=%" PRId64 " %s%s%s", l->gemm_n,
             dtype_name(l->gemm_dtype), l->gemm_trans_a ? " At" : "", l->gemm_trans_b ? " Bt" : "");
    return;
  }
  snprintf(out, size, "?");
}

static void op_label(const Plan *p, int i, char *out, size_t size) {
  const Ir *ir = p->ir;
  const Launch *l = &p->launches[i];
  if (l->node < 0 || l->node >= ir->nnodes) {
    snprintf(out, size, "-");
    return;
  }
  const Node *n = &ir->nodes[l->node];
  const char *src = ir->source ? strrchr(ir->source, '/') : NULL;
  src = src ? src + 1 : ir->source ? ir->source : "model";
  snprintf(out, size, "%s:%d:%d %s%s", src, n->loc.first_line, n->loc.first_column,
           op_name(n->op), l->nfused > 1 ? " (fused)" : "");
}

static int by_time(const void *a, const void *b) {
  const ProfileRow *x = a, *y = b;
  if (x->ms != y->ms) return x->ms < y->ms ? 1 : -1;
  return strcmp(x->kernel, y->kernel);
}

bool profile_build(const Plan *p, const GpuLaunchProfile *totals, int64_t steps,
                   const Target *target, Profile *out) {
  memset(out, 0, sizeof *out);
  if (!totals || steps <= 0) return false;
  out->steps = steps;
  out->target = target;
  out->rows = xcalloc((size_t)p->nlaunches + 1, sizeof *out->rows);
  for (int i = 0; i < p->nlaunches; i++) {
    const GpuLaunchProfile *t = &totals[i];
    if (t->runs == 0) continue;
    ProfileRow r = {0};
    launch_label(p, i, r.kernel, sizeof r.kernel);
    op_label(p, i, r.op, sizeof r.op);
    r.backward = p->launches[i].backward;
    r.optimizer = p->launches[i].optimizer;
    ProfileRow *row = NULL;
    for (int k = 0; k < out->nrows && !row; k++)
      if (strcmp(out->rows[k].kernel, r.kernel) == 0 && strcmp(out->rows[k].op, r.op) == 0)
        row = &out->rows[k];
    if (!row) {
      row = &out->rows[out->nrows++];
      *row = r;
    }
    double per = 1.0 / (double)steps;
    row->launches += (double)t->runs * per;
    row->ms += t->ms * per;
    row->flops += t->flops * per;
    row->bytes += t->bytes * per;
    row->tensor_core = row->tensor_core || t->tensor_core;
    LaunchCost c = {t->flops * per, t->bytes * per, t->tensor_core};
    row->roofline_ms += target ? 1e3 * launch_roofline_s(c, target) : 0;
  }
  for (int k = 0; k < out->nrows; k++) {
    out->kernel_ms += out->rows[k].ms;
    out->flops += out->rows[k].flops;
  }
  qsort(out->rows, (size_t)out->nrows, sizeof *out->rows, by_time);
  return out->nrows > 0;
}

void profile_print(FILE *f, const Profile *prof, double step_ms, int max_rows) {
  fprintf(f, "profile: %" PRId64 " step%s, each run as one CUDA graph with an event around "
          "every launch (kernels back to back); per step:\n", prof->steps,
          prof->steps == 1 ? "" : "s");
  fprintf(f, "| kernel | op | pass | launches | ms | %% | GFLOP | MB | achieved | of roofline |\n");
  fprintf(f, "|---|---|---|---|---|---|---|---|---|---|\n");
  int shown = max_rows > 0 && max_rows < prof->nrows ? max_rows : prof->nrows;
  for (int k = 0; k < shown; k++) {
    const ProfileRow *r = &prof->rows[k];
    char achieved[48];
    if (r->flops > 0 && r->ms > 0)
      snprintf(achieved, sizeof achieved, "%.1f TFLOP/s%s", r->flops / (r->ms * 1e9),
               r->tensor_core ? "" : " (fp32)");
    else if (r->ms > 0)
      snprintf(achieved, sizeof achieved, "%.0f GB/s", r->bytes / (r->ms * 1e6));
    else
      snprintf(achieved, sizeof achieved, "-");
    fprintf(f, "| %s | %s | %s | %.0f | %.3f | %.1f | %.2f | %.2f | %s | %.0f%% |\n", r->kernel,
            r->op, r->optimizer ? "opt" : r->backward ? "bwd" : "fwd", r->launches, r->ms,
            prof->kernel_ms > 0 ? 100 * r->ms / prof->kernel_ms : 0, r->flops / 1e9,
            r->bytes / 1e6, achieved, r->ms > 0 ? 100 * r->roofline_ms / r->ms : 0);
  }
  if (shown < prof->nrows) {
    double rest = 0;
    for (int k = shown; k < prof->nrows; k++) rest += prof->rows[k].ms;
    fprintf(f, "| (%d more) | | | | %.3f | %.1f | | | | |\n", prof->nrows - shown, rest,
            prof->kernel_ms > 0 ? 100 * rest / prof->kernel_ms : 0);
  }
  double roof = 0;
  for (int k = 0; k < prof->nrows; k++) roof += prof->rows[k].roofline_ms;
  fprintf(f, "  kernels: %.3f ms a step (their roofline %.3f ms: %.0f%%)", prof->kernel_ms, roof,
          prof->kernel_ms > 0 ? 100 * roof / prof->kernel_ms : 0);
  if (step_ms > 0)
    fprintf(f, "; the step's wall time %.3f ms: %.3f ms (%.0f%%) of it is not kernel time "
            "(host launches, gaps, waits)", step_ms, step_ms - prof->kernel_ms,
            100 * (step_ms - prof->kernel_ms) / step_ms);
  fprintf(f, "\n");
}

void profile_free(Profile *prof) {
  free(prof->rows);
  memset(prof, 0, sizeof *prof);
}
