// comm.h: the collectives of distributed training, over one of these backends:
//   COMM_SELF  a world of one process; no library (every collective is a copy or nothing);
//   COMM_MPI   OpenMPI's libmpi.so.40, loaded lazily (comm_mpi.c): the CPU executor's ranks,
//              which meet because mpirun (or `gemc launch`, or srun) started them together;
//   COMM_NCCL  NCCL's libnccl.so.2, loaded lazily (comm_nccl.c): GPU ranks, one device each,
//              which meet at MASTER_ADDR:MASTER_PORT (rendezvous.h). Buffers are device
//              pointers; collectives run on the comm's own stream, ordered against compute by
//              events (CommCall.wait_for, comm_done_event).
// Buffers are host memory for the others. Every collective is started (comm_start) and then
// waited for (comm_wait), so the caller can overlap it with compute; comm_progress lets the library move
// the started ones along between pieces of compute. A wait that does not end within the
// timeout aborts the whole job: it prints which rank waited for which operation, and the
// backend ends every rank with a non-zero status (MPI_Abort). It never hangs.
// docs/distributed.md describes the choices.
// defines: CommBackend, CommDtype, CommKind, CommCall, Comm, comm_*
#ifndef GEMC_COMM_H
#define GEMC_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum CommBackend { COMM_SELF, COMM_MPI, COMM_NCCL } CommBackend;
typedef enum CommDtype { COMM_F32, COMM_F64, COMM_I64 } CommDtype;
typedef enum CommKind {
  COMM_ALLREDUCE,       // recv[i] = sum over ranks of send[i], count elements (in place when
                        // send == recv)
  COMM_REDUCE_SCATTER,  // recv = this rank's part of the sum: part r holds counts[r] elements,
                        // the parts lie in rank order in send
  COMM_ALLGATHER,       // recv = every rank's send (counts[r] elements from rank r) in rank
                        // order; counts[] the same on every rank
  COMM_BROADCAST,       // recv (count elements) = root's recv
  COMM_ALLTOALL,        // send holds send_counts[r] elements for each rank r in rank order;
                        // recv gets recv_counts[r] from each rank r in rank order
} CommKind;

typedef struct CommCall {
  CommKind kind;
  CommDtype dtype;
  const void *send;
  void *recv;
  int64_t count;               // allreduce, broadcast
  const int64_t *counts;       // reduce-scatter, all-gather: [world]
  const int64_t *send_counts;  // all-to-all: [world]
  const int64_t *recv_counts;  // all-to-all: [world]
  int root;                    // broadcast
  const char *what;            // for a timeout's message: "dense gradients, bucket 2"
  void *wait_for;              // NCCL: a CUevent the collective waits for (NULL: none)
  double timeout_s;            // this wait's deadline instead of the comm's (0: the comm's):
                               // the agreement after a checkpoint's write, say
  bool device;                 // NCCL: the buffers are device memory. Else they are host
                               // memory, which the NCCL backend stages through the device
  // NCCL, device buffers, all-reduce only:
  float scale;                 // each rank's values are multiplied by it before the sum
                               // (NCCL's PreMulSum); 0 means 1
  int nbufs;                   // > 0: all-reduce bufs[i] (buf_counts[i] elements) in place,
                               // every buffer in one grouped call; send, recv, count unused
  void *const *bufs;
  const int64_t *buf_counts;
} CommCall;
// send == recv (in place) is allowed for all-reduce and broadcast only.

// What NCCL needs to meet: where rank 0 listens (the launcher's MASTER_ADDR and MASTER_PORT)
// and this rank's device, whose CUDA context must be current on the calling thread.
// nccl_cta_policy and nccl_max_ctas go to ncclCommInitRankConfig: how many SMs NCCL's
// kernels may take from compute (docs/distributed.md).
typedef enum CommCtaPolicy {
  COMM_CTA_DEFAULT,     // NCCL's own choice (NCCL_CTA_POLICY env, else its default)
  COMM_CTA_BANDWIDTH,   // NCCL_CTA_POLICY_DEFAULT: as many CTAs as bandwidth wants
  COMM_CTA_EFFICIENCY,  // NCCL_CTA_POLICY_EFFICIENCY: fewer CTAs for about the same bandwidth
  COMM_CTA_ZERO,        // NCCL_CTA_POLICY_ZERO: copy engines where NCCL can (no SMs)
} CommCtaPolicy;
const char *comm_cta_policy_name(CommCtaPolicy p);  // "default", "bandwidth", ...
bool comm_cta_policy_parse(const char *s, CommCtaPolicy *out);

typedef struct CommInit {
  const char *master_addr;
  int master_port;
  int device;
  CommCtaPolicy nccl_cta_policy;
  int nccl_max_ctas;        // 0: NCCL's own choice
  uint64_t job;             // the rendezvous's job token (RankEnv.job)
} CommInit;

typedef struct Comm Comm;

// Joins the world. `rank` and `world` are what the launcher said (rank_env.h); the backend
// must agree, else it is an error (an MPI launcher that is not OpenMPI's, say). timeout_s: the
// longest a wait may take (docs/distributed.md, --comm-timeout). NULL with a message in err.
Comm *comm_open(CommBackend b, int rank, int world, double timeout_s, const CommInit *init,
                char *err, size_t err_size);
void comm_close(Comm *c);  // after every started collective was waited for
int comm_rank(const Comm *c);
int comm_world(const Comm *c);
double comm_timeout(const Comm *c);  // --comm-timeout, seconds
const char *comm_backend_name(const Comm *c);
// The step the collectives belong to, for the timeout's message (0: none).
void comm_set_step(Comm *c, int64_t step);

// Starts a collective; the buffers must stay untouched until its wait. Returns a handle, or
// -1 with a message (counts over what the backend can take, too many in flight).
int comm_start(Comm *c, const CommCall *call, char *err, size_t err_size);
// Waits for a started collective. A backend error returns false with a message; a timeout
// aborts the job (see above) and does not return.
bool comm_wait(Comm *c, int handle, char *err, size_t err_size);
// Lets started collectives move on; returns at once.
void comm_progress(Comm *c);
// NCCL: the CUevent recorded when collective `handle` ends, for a compute stream to wait on
// (valid until its comm_wait); NULL for the host backends.
void *comm_done_event(Comm *c, int handle);
// NCCL: the stream the collectives run on (a CUstream); NULL for the host backends.
void *comm_stream(Comm *c);
// comm_start and comm_wait.
bool comm_run(Comm *c, const CommCall *call, char *err, size_t err_size);

// Ends every rank of the job with `code` (MPI_Abort); a world of one exits.
void comm_abort(Comm *c, int code);

// Test hooks (tests/dist), at the start of a step: GEMC_TEST_COMM_STALL=R:S makes rank R
// sleep for ever at step S, so the other ranks' waits time out; GEMC_TEST_COMM_DIE=R:S kills
// rank R there (SIGKILL), as a crash would; GEMC_TEST_COMM_HANG=R:S (NCCL) makes rank R's
// collectives of step S wait on the device for a value nobody writes, so that rank's own
// watchdog times out on a collective stuck in NCCL's stream (a world of one can test it).
void comm_test_faults(Comm *c);

size_t comm_dtype_size(CommDtype d);

#endif
