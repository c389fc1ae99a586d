// ir_flops.h: the useful floating-point work of one IR node over a batch's real jagged lengths
// (never the padded max), the one count that Local MFU (runtime/train/flops.c) and the
// per-launch cost model (codegen/plan/launch_cost.c) share. Matmuls (linear and its backward
// ops, dot_interact) count 2·M·K·N; attention 4·d per visible (query, key) pair forward, d the
// model width (heads · dh), causal and window masks respected, and 2.5 times that for its
// three backward nodes together (2.5/3 each: the flash-attention convention); every other op
// counts 0. docs/gpu.md gives the formulas.
// defines: ir_node_flops, ir_attention_flops, ir_attention_forward_of
#ifndef GEMC_IR_FLOPS_H
#define GEMC_IR_FLOPS_H

#include <stdint.h>

#include "ir.h"

// FLOPs of node `node` for a batch of B examples, offsets[j] = jagged dim j's int64 offsets
// [B+1] (the lengths of each example, which attention needs; totals are offsets[j][B]).
double ir_node_flops(const Ir *ir, int node, int64_t B, const int64_t *const *offsets);

// The forward FLOPs of ATTENTION node n: 4·d·Σ visible pairs over the examples.
double ir_attention_flops(const Ir *ir, const Node *n, int64_t B, const int64_t *const *offsets);

// The forward ATTENTION node that backward attention node `node` differentiates (the first with
// the same q and k), or -1.
int ir_attention_forward_of(const Ir *ir, int node);

#endif
