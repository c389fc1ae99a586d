// comm_internal.h: what comm.c shares with its backends (comm_mpi.c): the started
// collectives and the table of a backend's operations.
// defines: CommReq, CommOps, struct Comm, comm_mpi_ops
#ifndef GEMC_COMM_INTERNAL_H
#define GEMC_COMM_INTERNAL_H

#include "comm.h"

enum { COMM_MAX_INFLIGHT = 64 };

// A started collective. The MPI backend keeps its request and the int counts and
// displacements MPI takes (they must live until the collective ends).
typedef struct CommReq {
  bool used;
  bool finished;   // comm_progress saw it end
  CommCall call;
  char what[96];   // call.what points here: the caller's string may not outlive the start
  double started;  // seconds (CLOCK_MONOTONIC)
  void *request;   // MPI: its request; NCCL: the CUevent recorded at the end
  int *ints;       // 4 * world ints: counts, displacements, and a second pair for all-to-all
  // NCCL with host buffers: the slot's device staging buffer (kept and grown, never freed
  // while the job runs: a cuMemFree would wait for every stream) and where the result goes.
  uint64_t stage;
  size_t stage_bytes;
  size_t recv_at, recv_bytes;
  void *host_recv;
} CommReq;

typedef struct CommOps {
  const char *name;
  // Joins the world; sets c->impl. False with a message.
  // close also frees every request slot's staging buffer.
  bool (*open)(Comm *c, char *err, size_t err_size);
  bool (*start)(Comm *c, CommReq *r, char *err, size_t err_size);
  // 1: finished; 0: not yet; -1: failed, with a message.
  int (*test)(Comm *c, CommReq *r, char *err, size_t err_size);
  // After a wait saw it finish: frees what the backend keeps for it (NULL: nothing).
  void (*release)(Comm *c, CommReq *r);
  void (*abort)(Comm *c, int code);
  void (*close)(Comm *c);
} CommOps;

struct Comm {
  const CommOps *ops;
  int rank, world;
  double timeout_s;
  CommInit init;          // COMM_NCCL
  int64_t step;
  int stall_rank;        // GEMC_TEST_COMM_STALL; -1: none
  int64_t stall_step;
  int die_rank;          // GEMC_TEST_COMM_DIE; -1: none
  int64_t die_step;
  int hang_rank;         // GEMC_TEST_COMM_HANG (NCCL); -1: none
  int64_t hang_step;
  CommReq reqs[COMM_MAX_INFLIGHT];
  void *impl;
  void *impl_stream;      // COMM_NCCL: its CUstream
};

extern const CommOps comm_mpi_ops;
extern const CommOps comm_nccl_ops;

#endif
