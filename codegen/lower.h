// lower.h: code generation's entry point: a verified forward+backward IR in, a Plan (every
// kernel's CUDA C, its launches, tile lists and memory plan) out. codegen/lower.c.
// defines: plan_build, plan_build_with, PlanOptions
#ifndef GEMC_LOWER_H
#define GEMC_LOWER_H

#include <stdbool.h>

#include "arena.h"
#include "diag.h"
#include "ir.h"
#include "plan.h"

// Lowers a verified forward+backward IR (with its gradients) to a plan for `target` (NULL: the
// IR's own). Errors (an op codegen cannot lower yet) go to d.
bool plan_build(const Ir *ir, const char *target, Arena *arena, Diag *d, Plan *out);

// Options for tools and tests. skip_attention leaves attention nodes out (a comment marks
// each): the plan is incomplete, but every other kernel can be compiled and checked.
typedef struct PlanOptions {
  bool skip_attention;
} PlanOptions;
bool plan_build_with(const Ir *ir, const char *target, const PlanOptions *opt, Arena *arena,
                     Diag *d, Plan *out);

#endif
