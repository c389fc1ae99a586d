// attention.h: code generation for attention nodes (docs/attention.md). For one IR node it
// appends the CUDA of its kernels to the model's source (the device building blocks of
// kernels/attention*.cuh once, then one small extern "C" wrapper per kernel) and adds their
// launches and the tile list they use to the Lower, through the KernelBuilder.
// defines: emit_attention, attention_device_source
#ifndef GEMC_ATTENTION_H
#define GEMC_ATTENTION_H

#include <stdbool.h>

#include "kernel_builder.h"
#include "strbuf.h"

// Emits node `node` of L->ir: an ATTENTION node (its forward kernel) or one of its backward
// ops. Its launches go to L (kernel text to L->src) and the one tile list they use, if any, to
// L's tile lists. The backward ops of one attention (same four inputs) split the work:
// attention_bwd_q emits the softmax row statistics (softmax only), dQ and, for PMA, the sum
// over examples; attention_bwd_k emits dK together with dV; attention_bwd_v emits nothing when
// a _k sibling exists, else dV alone. Temporaries are ARG_WORKSPACE arguments named by (tensor,
// slot, owner = LaunchArg.i): the softmax statistics (dO's tensor, slot 0) are written by
// attention_bwd_q's launches and read by attention_bwd_k's, so the caller keeps one workspace
// per name from its first launch to its last (codegen/lower.c makes each one plan scratch).
// bf16 k, v, dO with dh a multiple of 16 get the tensor-core kernels; fp32 or fp16 storage, or
// another dh, the SIMT ones; fp8 and mxfp8 nodes the quantized ones. Returns false, adding
// nothing to L, for a node it cannot lower: dh over 128; a type other than bf16, fp16, fp32;
// v or dO not of k's type; softmax without an attention_bwd_q.
bool emit_attention(Lower *L, int node);

// Appends the device code the attention kernels need: the prelude when src does not hold it
// yet (a model's source always does; the GDPA benchmark's starts empty), then
// kernels/attention*.cuh as embedded in gemc.
void attention_device_source(StrBuf *src);

#endif
