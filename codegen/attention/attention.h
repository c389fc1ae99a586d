// attention.h: code generation for attention nodes (docs/attention.md). For one IR node it
// appends the CUDA of its kernels to the model's source (the device building blocks of
// kernels/attention*.cuh once, then one small extern "C" wrapper per kernel) and describes
// the launches and the tile lists they need.
// defines: emit_attention, attention_device_source, PLAN_MAX_ATTENTION_LAUNCHES
#ifndef GEMC_ATTENTION_H
#define GEMC_ATTENTION_H

#include <stdbool.h>

#include "ir.h"
#include "plan.h"
#include "strbuf.h"

// out[] must hold this many launches.
#ifndef PLAN_MAX_ATTENTION_LAUNCHES
#define PLAN_MAX_ATTENTION_LAUNCHES 24
#endif

// Emits node `node` of `ir`: an ATTENTION node (its forward kernel) or one of its backward
// ops. Launches go to out[0 .. *nout) and the one tile list they use to *tiles (node = -1
// when none); a launch names it as p->ntiles, so the caller appends it to the plan. The
// backward ops of one attention (same four inputs) split the work: attention_bwd_q emits the
// softmax row statistics (softmax only), dQ and, for PMA, the sum over examples;
// attention_bwd_k emits dK together with dV; attention_bwd_v emits nothing when a _k sibling
// exists (*nout = 0), else dV alone. ARG_WORKSPACE arguments are named by (tensor, slot):
// the softmax statistics (dO's tensor, slot 0) are written by attention_bwd_q's launches and
// read by attention_bwd_k's, so the runtime keeps one workspace per (tensor, slot) from its
// first launch to its last. bf16 k, v, dO with dh a multiple of 16 get the tensor-core
// kernels; fp32 or fp16 storage, or another dh, the SIMT ones. Returns false, writing
// nothing, for a node it cannot lower: dh over 128; a type other than bf16, fp16, fp32; v or
// dO not of k's type; softmax without an attention_bwd_q.
bool emit_attention(const Plan *p, const Ir *ir, int node, StrBuf *src, Launch *out, int *nout,
                    TileList *tiles);

// Appends the device code of kernels/attention*.cuh, as embedded in gemc.
void attention_device_source(StrBuf *src);

#endif
