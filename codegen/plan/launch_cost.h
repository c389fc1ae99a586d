// launch_cost.h: what one launch of a plan costs for one batch: the useful FLOPs it performs and
// the bytes it moves in global memory, so that a profiler can set its measured time against the
// roofline (launch_roofline_s). Everything is counted over the batch's real sizes (B, each T_j,
// each example's lengths), never the plan's largest batch. docs/gpu.md, "Per-launch cost".
// defines: LaunchCost, launch_cost, launch_roofline_s, attn_simt
//
// FLOPs are the IR's (compiler/ir/ir_flops.h, the count behind Local MFU), put on the launches
// that do the work, so that the sum over a plan's launches is step_flops for the whole step:
//   - LAUNCH_GEMM: 2·m·n·k, its own sizes.
//   - attention: the launches of an attention node that do its matmuls are its kernels with
//     dynamic shared memory (their Q, K, V tiles are staged there; the quantize, amax and
//     chunk-sum helpers have none). A forward node's count goes to them (there is one). The
//     backward nodes of one attention (attention_bwd_q, _k, _v with the same four inputs) are
//     one group: its count (2.5 times the forward with all three) is split over the group's
//     matmul launches by the matmuls each does: S = Q·Kᵀ recomputed (1), dP = dO·Vᵀ (1 if it
//     writes dQ or dK), then one each for the dQ = dS·K, dK = dSᵀ·Q, dV = Pᵀ·dO it writes; a
//     launch that writes none is the softmax-statistics pass, which recomputes S and O = P·V
//     (2). So a softmax backward splits 2 : 3 : 4 over statistics, dQ, and dK with dV. PMA's
//     one-pass backward (`_bwd_pma`) counts its dQ too, though it writes the chunks' partials.
//   - any other node with FLOPs (dot_interact): on its launch that takes the node's output
//     (not on its operands' quantize kernels).
//   - everything else, optimizer launches included: 0.
// Bytes are what the launch reads and writes in global memory, each distinct thing once (a
// tensor read and written in place counts once: a floor on the traffic, not a cache model):
//   - LAUNCH_GEMM: (m·k + k·n) operands of gemm_dtype, m·n of C (its own type, as the runtime
//     picks it: its tensor's, fp32 for a gradient or an fp32 scratch), twice when beta != 0
//     (C is read too), and n of the bias when it has one.
//   - LAUNCH_ZERO: zero_bytes.
//   - LAUNCH_KERNEL: the sum over its pointer arguments of what they point at for this batch:
//     ARG_TENSOR and ARG_TENSOR_MAP the tensor (stored as plan.h says: fp8/mxfp8 as bf16, ids
//     int64), ARG_GRAD the gradient tensor (the same memory as an ARG_TENSOR of it),
//     ARG_OPTSTATE its buffer, ARG_SCRATCH Plan.scratch[slot].bytes, ARG_WORKSPACE its size,
//     ARG_OFFSETS 8·(B+1). Tile lists are not counted (a few bytes a tile, built per batch).
//     Tables count only the rows the batch touches, never their whole size: a table argument
//     (and a table's optimizer state, rowsum) counts min(lookups, rows) of its rows, lookups
//     being the ids of the launch's own embed or embed_pool, else of every lookup of the table
//     (what table_grad gathers). A table's sparse gradient (ROWS: [U][ids][U x D fp32]) counts
//     U = min(occurrences, rows) rows (the most distinct ids the batch can have): its header,
//     ids and values in the launch that also takes the table (table_grad's apply, which writes
//     the values), its header and ids only in table_grad's integer passes.
// tensor_core says which peak bounds the FLOPs: true for bf16/fp16 GEMMs, for the mma.sync
// and wgmma attention kernels (bf16 or fp16 operands: not attn_simt) and for the quantized
// (fp8/mxfp8) attention kernels of head widths that are a multiple of 16 (mma.sync on the
// quantized values, exact in bf16); false for fp32 GEMMs (cuBLASLt's CUBLAS_COMPUTE_32F: no
// TF32), the SIMT attention kernels (fp32 arithmetic, one thread per row; the tiny-key-set
// quantized ones too) and every other kernel (dot_interact included: one thread per example
// and pair). fp8 and mxfp8 GEMM operands reach cuBLASLt dequantized, in bf16 or fp32.
#ifndef GEMC_LAUNCH_COST_H
#define GEMC_LAUNCH_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "ir.h"
#include "plan.h"
#include "target.h"

typedef struct LaunchCost {
  double flops;      // useful FLOPs this launch performs for the batch
  double bytes;      // bytes it reads and writes in global memory, each distinct thing once
  bool tensor_core;  // its FLOPs run on tensor cores (bf16/fp16 peak); else CUDA cores (fp32)
} LaunchCost;

// The cost of launch `launch` of p (over p->ir) for a batch of B examples, totals[j] = T_j and
// offsets[j] = jagged dim j's int64 offsets [B+1] (attention needs each example's lengths).
LaunchCost launch_cost(const Plan *p, int launch, int64_t B, const int64_t *totals,
                       const int64_t *const *offsets);

// The least time in seconds launch cost c can take on target t: the larger of its FLOPs at the
// peak tensor_core names (Target.peak_tflops_bf16, else peak_tflops_fp32) and its bytes at
// Target.hbm_tb_per_s. A profiler divides it by the measured time for the launch's fraction of
// the roofline. 0 for a launch that costs nothing.
double launch_roofline_s(LaunchCost c, const Target *t);

// Whether the bf16/fp16/fp32 attention kernels of attention node n (forward or backward) take
// the SIMT path (codegen/attention, attention.h): k not bf16, q fp16, or a head dim that is not
// a multiple of 16. The emitters and the cost model share this one rule.
bool attn_simt(const Ir *ir, const Node *n);

#endif
