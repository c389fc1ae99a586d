// attention_sm90_smem.h: the shared memory of the sm_90a attention kernels
// (kernels/attention_sm90.cuh's SM90_FORWARD_SMEM, attention_sm90_backward.cuh's
// SM90_BACKWARD_SMEM), and the stages they get by default: the facts that sema (which
// schedules it accepts), codegen (the launch) and the autotuner (its candidates) share.
// Header-only; in compiler/ir because all three see that layer.
// defines: SM90_ATTN_TILE_Q, SM90_ATTN_BWD_RESIDENT, SM90_ATTN_BWD_STREAM, SM90_ATTN_MAX_SMEM, sm90_attn_forward_smem,
//          sm90_attn_forward_q_buffers, sm90_attn_backward_smem, sm90_attn_default_tile_kv, sm90_attn_forward_stages,
//          sm90_attn_backward_stages, sm90_attn_backward_dq_smem, sm90_attn_backward_dq_stages
#ifndef GEMC_ATTENTION_SM90_SMEM_H
#define GEMC_ATTENTION_SM90_SMEM_H

#include <stdint.h>

enum {
  SM90_ATTN_TILE_Q = 128,             // query rows of a forward work item (two warpgroups of 64)
  SM90_ATTN_BWD_RESIDENT = 128,       // resident rows of a backward work item (SM90_BWD_RESIDENT)
  SM90_ATTN_BWD_STREAM = 64,          // rows of a streamed backward tile (SM90_BWD_STREAM)
  SM90_ATTN_MAX_SMEM = 227 * 1024,    // what one block may opt in to on an H100/H200
};

// The Q tiles the forward keeps in flight: two, or four over key tiles of at most 32 keys
// (SM90_Q_BUFFERS).
static inline int64_t sm90_attn_forward_q_buffers(int64_t tile_kv) { return tile_kv <= 32 ? 4 : 2; }

// 1 KB of alignment slack, the Q tiles, `stages` K and V tiles of tile_kv rows, the barriers.
static inline int64_t sm90_attn_forward_smem(int64_t dh, int64_t tile_kv, int64_t stages) {
  int64_t qbuf = sm90_attn_forward_q_buffers(tile_kv);
  return 1024 + qbuf * SM90_ATTN_TILE_Q * dh * 2 + 2 * stages * tile_kv * dh * 2 +
         8 * (2 * qbuf + 4 * stages);
}

// Two resident pairs of 128-row tiles, `stages` streamed pairs of 64 rows, the barriers.
static inline int64_t sm90_attn_backward_smem(int64_t dh, int64_t stages) {
  return 1024 + 2 * 2 * 128 * dh * 2 + 2 * stages * 64 * dh * 2 + 8 * (4 + 3 * stages);
}

// With dQ in the dK/dV kernel (@schedule(deterministic = false)): two 128 x 64 bf16 dSᵀ tiles.
static inline int64_t sm90_attn_backward_dq_smem(int64_t dh, int64_t stages) {
  return sm90_attn_backward_smem(dh, stages) + 2 * 128 * 64 * 2;
}

// The default key tile: 128 keys, but the smallest of 16, 32 and 64 that holds a set of at
// most 64 keys (kv_set: the set's size, 0 for a jagged or dense kv), where a larger tile would
// be mostly masked.
static inline int sm90_attn_default_tile_kv(int64_t kv_set) {
  if (kv_set <= 0 || kv_set > 64) return 128;
  return kv_set <= 16 ? 16 : kv_set <= 32 ? 32 : 64;
}

// The default pipeline depth: as many stages of 2..4 as fit (2 even when they do not).
static inline int sm90_attn_forward_stages(int64_t dh, int64_t tile_kv) {
  int stages = 2;
  while (stages < 4 && sm90_attn_forward_smem(dh, tile_kv, stages + 1) <= SM90_ATTN_MAX_SMEM)
    stages++;
  return stages;
}
static inline int sm90_attn_backward_stages(int64_t dh) {
  int stages = 2;
  while (stages < 4 && sm90_attn_backward_smem(dh, stages + 1) <= SM90_ATTN_MAX_SMEM) stages++;
  return stages;
}
static inline int sm90_attn_backward_dq_stages(int64_t dh) {
  int stages = 2;
  while (stages < 4 && sm90_attn_backward_dq_smem(dh, stages + 1) <= SM90_ATTN_MAX_SMEM) stages++;
  return stages;
}

#endif
