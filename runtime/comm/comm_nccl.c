// comm_nccl.c: the NCCL backend of comm.h. libnccl.so.2 (NCCL 2.x, in the CUDA toolkit) is
// loaded when a GPU world opens, so nothing else needs it. Like the CUDA driver, its few types
// are mirrored here (opaque handles, int enums with nccl.h's values, the 128-byte unique id),
// so building gemc needs no NCCL header.
//   - Rank 0 makes the unique id; rendezvous.h carries it to the other ranks.
//   - Every collective is enqueued on the comm's own non-blocking stream, after the event the
//     caller names (CommCall.wait_for), and an event is recorded after it: comm_wait polls
//     that event (and NCCL's asynchronous error) against the deadline, and a compute stream
//     can wait on it (comm_done_event).
//   - Variable per-rank counts use NCCL's grouped calls: all-gather as one broadcast per
//     rank, reduce-scatter as one reduce per rank, all-to-all as sends and receives.
//   - Host buffers (the trainer's loss, agreements, predictions; CommCall.device false) go
//     through a device staging buffer per request slot: copied in before the collective,
//     copied out when its event has passed.
//   - Scaled all-reduces use NCCL's PreMulSum operator (made per call, destroyed once
//     enqueued); grouped ones enqueue one all-reduce per buffer inside one group.
//   - A timeout aborts the communicator (ncclCommAbort) before the job ends.
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"
#include "clock.h"
#include "comm_internal.h"
#include "cuda_driver.h"
#include "rendezvous.h"

typedef int NcclResult;  // ncclSuccess == 0, ncclInProgress == 7
enum { NCCL_SUCCESS = 0, NCCL_IN_PROGRESS = 7, NCCL_INT64 = 4, NCCL_FLOAT32 = 7,
       NCCL_FLOAT64 = 8, NCCL_SUM = 0, NCCL_ID_BYTES = 128, NCCL_SCALAR_HOST_IMMEDIATE = 1 };
typedef struct NcclComm *NcclCommHandle;
// ncclConfig_t as NCCL 2.28's nccl.h lays it out (size, magic and version let an older NCCL
// read the fields it knows). NCCL_CONFIG_UNDEF_INT (INT_MIN) leaves a field to NCCL.
typedef struct NcclConfig {
  size_t size;
  unsigned magic, version;
  int blocking, cga_cluster_size, min_ctas, max_ctas;
  const char *net_name;
  int split_share, traffic_class;
  const char *comm_name;
  int collnet_enable, cta_policy, shrink_share, nvls_ctas, channels_per_net_peer;
  int nvlink_centric_sched;
} NcclConfig;
enum { NCCL_CONFIG_MAGIC = 0xcafebeef, NCCL_CONFIG_VERSION = 22800 };
typedef struct NcclId {
  char internal[NCCL_ID_BYTES];
} NcclId;

typedef struct Nccl {
  void *lib;
  NcclCommHandle comm;
  CUstream stream;
  CUdeviceptr never;  // GEMC_TEST_COMM_HANG: a zero word the hung stream waits to see at 1
  int version;
  NcclResult (*GetVersion)(int *);
  NcclResult (*GetUniqueId)(NcclId *);
  NcclResult (*CommInitRank)(NcclCommHandle *, int, NcclId, int);
  NcclResult (*CommInitRankConfig)(NcclCommHandle *, int, NcclId, int, NcclConfig *);
  NcclResult (*CommDestroy)(NcclCommHandle);
  NcclResult (*CommAbort)(NcclCommHandle);
  NcclResult (*CommGetAsyncError)(NcclCommHandle, NcclResult *);
  const char *(*GetErrorString)(NcclResult);
  NcclResult (*AllReduce)(const void *, void *, size_t, int, int, NcclCommHandle, CUstream);
  NcclResult (*ReduceScatter)(const void *, void *, size_t, int, int, NcclCommHandle,
                              CUstream);
  NcclResult (*AllGather)(const void *, void *, size_t, int, NcclCommHandle, CUstream);
  NcclResult (*Broadcast)(const void *, void *, size_t, int, int, NcclCommHandle, CUstream);
  NcclResult (*Reduce)(const void *, void *, size_t, int, int, int, NcclCommHandle, CUstream);
  NcclResult (*Send)(const void *, size_t, int, int, NcclCommHandle, CUstream);
  NcclResult (*Recv)(void *, size_t, int, int, NcclCommHandle, CUstream);
  NcclResult (*GroupStart)(void);
  NcclResult (*GroupEnd)(void);
  NcclResult (*RedOpCreatePreMulSum)(int *, void *, int, int, NcclCommHandle);
  NcclResult (*RedOpDestroy)(int, NcclCommHandle);
} Nccl;

static const char *const LIBNCCL = "libnccl.so.2";

static bool load(Nccl *n, char *err, size_t err_size) {
  n->lib = dlopen(LIBNCCL, RTLD_NOW | RTLD_LOCAL);
  if (!n->lib) n->lib = dlopen("/usr/local/cuda/lib64/libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!n->lib)
    return fail(err, err_size, "cannot load NCCL (%s: %s): GPU ranks need it; it ships with the "
                "CUDA toolkit (or apt-get install libnccl2)", LIBNCCL, dlerror());
  struct {
    const char *name;
    void **slot;
  } syms[] = {
      {"ncclGetVersion", (void **)&n->GetVersion},
      {"ncclGetUniqueId", (void **)&n->GetUniqueId},
      {"ncclCommInitRank", (void **)&n->CommInitRank},
      {"ncclCommInitRankConfig", (void **)&n->CommInitRankConfig},
      {"ncclCommDestroy", (void **)&n->CommDestroy},
      {"ncclCommAbort", (void **)&n->CommAbort},
      {"ncclCommGetAsyncError", (void **)&n->CommGetAsyncError},
      {"ncclGetErrorString", (void **)&n->GetErrorString},
      {"ncclAllReduce", (void **)&n->AllReduce},
      {"ncclReduceScatter", (void **)&n->ReduceScatter},
      {"ncclAllGather", (void **)&n->AllGather},
      {"ncclBroadcast", (void **)&n->Broadcast},
      {"ncclReduce", (void **)&n->Reduce},
      {"ncclSend", (void **)&n->Send},
      {"ncclRecv", (void **)&n->Recv},
      {"ncclGroupStart", (void **)&n->GroupStart},
      {"ncclGroupEnd", (void **)&n->GroupEnd},
      {"ncclRedOpCreatePreMulSum", (void **)&n->RedOpCreatePreMulSum},
      {"ncclRedOpDestroy", (void **)&n->RedOpDestroy},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(n->lib, syms[i].name);
    if (!*syms[i].slot)
      return fail(err, err_size, "%s has no %s: gemc needs NCCL 2.12 or later", LIBNCCL,
                  syms[i].name);
  }
  n->GetVersion(&n->version);
  return true;
}

static bool nccl_ok(const Nccl *n, NcclResult rc, const char *what, char *err, size_t err_size) {
  if (rc == NCCL_SUCCESS) return true;
  return fail(err, err_size, "%s failed: %s", what, n->GetErrorString(rc));
}

static bool cu_ok(CUresult rc, const char *what, char *err, size_t err_size) {
  if (rc == CU_SUCCESS) return true;
  const char *name = "?";
  if (cuda_driver()) cuda_driver()->cuGetErrorName(rc, &name);
  return fail(err, err_size, "%s failed: %s", what, name);
}

// Waits for a non-blocking communicator's call to settle, against the comm's timeout: the
// init, and any call that returned ncclInProgress. A timeout aborts the communicator.
static NcclResult settle(Comm *c, Nccl *n, NcclResult rc, const char *what, char *err,
                         size_t err_size) {
  double deadline = monotonic_seconds() + c->timeout_s;
  while (rc == NCCL_IN_PROGRESS) {
    NcclResult async = NCCL_IN_PROGRESS, q = n->CommGetAsyncError(n->comm, &async);
    rc = q != NCCL_SUCCESS ? q : async;
    if (rc != NCCL_IN_PROGRESS) break;
    if (monotonic_seconds() > deadline) {
      fail(err, err_size, "%s did not finish within %g s (--comm-timeout): a rank is missing "
           "or stalled", what, c->timeout_s);
      n->CommAbort(n->comm);
      n->comm = NULL;
      return NCCL_IN_PROGRESS;
    }
    struct timespec nap = {0, 200000};
    nanosleep(&nap, NULL);
  }
  return rc;
}

// ncclCommInitRankConfig, non-blocking so that a rank that never comes cannot hold the others
// past --comm-timeout, with the SM limits of CommInit.
static bool init_comm(Comm *c, Nccl *n, const NcclId *id, char *err, size_t err_size) {
  const int undef = INT_MIN;
  NcclConfig cfg = {.size = sizeof cfg, .magic = NCCL_CONFIG_MAGIC,
                    .version = NCCL_CONFIG_VERSION, .blocking = 0, .cga_cluster_size = undef,
                    .min_ctas = undef, .max_ctas = undef, .split_share = undef,
                    .traffic_class = undef, .collnet_enable = undef, .cta_policy = undef,
                    .shrink_share = undef, .nvls_ctas = undef, .channels_per_net_peer = undef,
                    .nvlink_centric_sched = undef};
  // NCCL_CTA_POLICY_DEFAULT, _EFFICIENCY and _ZERO are 0, 1 and 2.
  if (c->init.nccl_cta_policy != COMM_CTA_DEFAULT)
    cfg.cta_policy = (int)c->init.nccl_cta_policy - (int)COMM_CTA_BANDWIDTH;
  if (c->init.nccl_max_ctas > 0) {
    cfg.max_ctas = c->init.nccl_max_ctas;
    cfg.min_ctas = 1;
  }
  if (c->init.nccl_cta_policy == COMM_CTA_ZERO && n->version < 22700)
    return fail(err, err_size, "--nccl-cta-policy zero needs NCCL 2.27 or later; this is %d.%d",
                n->version / 10000, n->version / 100 % 100);
  NcclResult rc = n->CommInitRankConfig(&n->comm, c->world, *id, c->rank, &cfg);
  if (rc == NCCL_IN_PROGRESS)
    rc = settle(c, n, rc, "NCCL's initialization (ncclCommInitRankConfig)", err, err_size);
  if (rc == NCCL_IN_PROGRESS) return false;  // timed out, err says so
  return nccl_ok(n, rc, "ncclCommInitRankConfig", err, err_size);
}

static bool nccl_open(Comm *c, char *err, size_t err_size) {
  Nccl *n = xcalloc(1, sizeof *n);
  c->impl = n;
  char why[256];
  if (!cuda_driver_load(why, sizeof why))
    return fail(err, err_size, "GPU ranks need the CUDA driver: %s", why);
  if (!load(n, err, err_size)) return false;
  const CudaDriver *d = cuda_driver();
  if (!cu_ok(d->cuStreamCreate(&n->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate", err,
             err_size))
    return false;
  c->impl_stream = n->stream;
  NcclId id;
  memset(&id, 0, sizeof id);
  if (c->rank == 0 && !nccl_ok(n, n->GetUniqueId(&id), "ncclGetUniqueId", err, err_size))
    return false;
  if (!rendezvous_share(c->init.master_addr, c->init.master_port, c->rank, c->world,
                        c->init.job, &id,
                        sizeof id, c->timeout_s, err, err_size))
    return false;
  return init_comm(c, n, &id, err, err_size);
}
static int nccl_dtype(CommDtype d) {
  return d == COMM_F32 ? NCCL_FLOAT32 : d == COMM_F64 ? NCCL_FLOAT64 : NCCL_INT64;
}

static bool all_equal(const int64_t *v, int n) {
  for (int i = 1; i < n; i++)
    if (v[i] != v[0]) return false;
  return true;
}

// Ends a group: NCCL reports a grouped call's errors here.
static NcclResult group_end(const Nccl *n, NcclResult rc) {
  NcclResult e = n->GroupEnd();
  return rc != NCCL_SUCCESS ? rc : e;
}

// An all-reduce: plain or scaled (PreMulSum), of one buffer or of several in one group.
static NcclResult enqueue_allreduce(Nccl *n, const CommCall *k, int t) {
  int op = NCCL_SUM;
  float scale = k->scale;
  NcclResult rc = NCCL_SUCCESS;
  if (scale != 0 && scale != 1) {
    rc = n->RedOpCreatePreMulSum(&op, &scale, t, NCCL_SCALAR_HOST_IMMEDIATE, n->comm);
    if (rc != NCCL_SUCCESS) return rc;
  }
  if (k->nbufs > 0) {
    n->GroupStart();
    for (int i = 0; i < k->nbufs && rc == NCCL_SUCCESS; i++)
      rc = n->AllReduce(k->bufs[i], k->bufs[i], (size_t)k->buf_counts[i], t, op, n->comm,
                        n->stream);
    rc = group_end(n, rc);
  } else {
    rc = n->AllReduce(k->send, k->recv, (size_t)k->count, t, op, n->comm, n->stream);
  }
  // An operator may be destroyed once the calls that use it are enqueued.
  if (op != NCCL_SUM) n->RedOpDestroy(op, n->comm);
  return rc;
}

// The collective itself, on n->stream.
static NcclResult enqueue(Comm *c, Nccl *n, const CommCall *k) {
  int t = nccl_dtype(k->dtype), w = c->world;
  size_t es = comm_dtype_size(k->dtype);
  const char *send = k->send;
  char *recv = k->recv;
  NcclResult rc = NCCL_SUCCESS;
  switch (k->kind) {
    case COMM_ALLREDUCE:
      return enqueue_allreduce(n, k, t);
    case COMM_BROADCAST:
      return n->Broadcast(recv, recv, (size_t)k->count, t, k->root, n->comm, n->stream);
    case COMM_REDUCE_SCATTER:
      if (all_equal(k->counts, w))
        return n->ReduceScatter(send, recv, (size_t)k->counts[0], t, NCCL_SUM, n->comm,
                                n->stream);
      n->GroupStart();
      for (int64_t r = 0, at = 0; r < w && rc == NCCL_SUCCESS; at += k->counts[r], r++)
        rc = n->Reduce(send + (size_t)at * es, recv, (size_t)k->counts[r], t, NCCL_SUM, (int)r,
                       n->comm, n->stream);
      return group_end(n, rc);
    case COMM_ALLGATHER:
      if (all_equal(k->counts, w))
        return n->AllGather(send, recv, (size_t)k->counts[0], t, n->comm, n->stream);
      n->GroupStart();
      for (int64_t r = 0, at = 0; r < w && rc == NCCL_SUCCESS; at += k->counts[r], r++)
        rc = n->Broadcast(send, recv + (size_t)at * es, (size_t)k->counts[r], t, (int)r,
                          n->comm, n->stream);
      return group_end(n, rc);
    case COMM_ALLTOALL:
      n->GroupStart();
      for (int64_t r = 0, s_at = 0, r_at = 0; r < w && rc == NCCL_SUCCESS; r++) {
        if (k->send_counts[r] > 0)
          rc = n->Send(send + (size_t)s_at * es, (size_t)k->send_counts[r], t, (int)r, n->comm,
                       n->stream);
        if (rc == NCCL_SUCCESS && k->recv_counts[r] > 0)
          rc = n->Recv(recv + (size_t)r_at * es, (size_t)k->recv_counts[r], t, (int)r, n->comm,
                       n->stream);
        s_at += k->send_counts[r];
        r_at += k->recv_counts[r];
      }
      return group_end(n, rc);
  }
  return rc;
}

static int64_t sum_counts(const int64_t *v, int n) {
  int64_t s = 0;
  for (int i = 0; i < n; i++) s += v[i];
  return s;
}

// Host buffers: *k becomes the same call on the slot's staging buffer, its send part copied
// in (on the comm stream); the wait copies the recv part out (nccl_test).
static bool stage_in(Comm *c, CommReq *r, CommCall *k, char *err, size_t err_size) {
  const CudaDriver *d = cuda_driver();
  Nccl *n = c->impl;
  size_t es = comm_dtype_size(k->dtype);
  int64_t ns = 0, nr = 0;
  switch (k->kind) {
    case COMM_ALLREDUCE: ns = nr = k->count; break;
    case COMM_BROADCAST: nr = k->count; break;
    case COMM_REDUCE_SCATTER: ns = sum_counts(k->counts, c->world); nr = k->counts[c->rank]; break;
    case COMM_ALLGATHER: ns = k->counts[c->rank]; nr = sum_counts(k->counts, c->world); break;
    case COMM_ALLTOALL:
      ns = sum_counts(k->send_counts, c->world);
      nr = sum_counts(k->recv_counts, c->world);
      break;
  }
  size_t send_bytes = ((size_t)ns * es + 255) / 256 * 256, recv_bytes = (size_t)nr * es;
  size_t need = send_bytes + recv_bytes + 8;
  if (need > r->stage_bytes) {
    if (r->stage) d->cuMemFree((CUdeviceptr)r->stage);
    r->stage = 0;
    r->stage_bytes = 0;
    CUdeviceptr p;
    if (!cu_ok(d->cuMemAlloc(&p, need * 2), "staging a collective's host buffers", err,
               err_size))
      return false;
    r->stage = p;
    r->stage_bytes = need * 2;
  }
  CUdeviceptr sp = (CUdeviceptr)r->stage, rp = sp + send_bytes;
  const void *host_in = k->kind == COMM_BROADCAST ? k->recv : k->send;
  CUdeviceptr dev_in = k->kind == COMM_BROADCAST ? rp : sp;
  size_t in_bytes = (size_t)(k->kind == COMM_BROADCAST ? nr : ns) * es;
  if (in_bytes > 0 && !cu_ok(d->cuMemcpyHtoDAsync(dev_in, host_in, in_bytes, n->stream),
                             "staging a collective's input", err, err_size))
    return false;
  r->host_recv = k->recv;
  r->recv_at = send_bytes;
  r->recv_bytes = recv_bytes;
  k->send = (const void *)(uintptr_t)sp;
  k->recv = (void *)(uintptr_t)rp;
  return true;
}

// GEMC_TEST_COMM_HANG: this rank's collectives of this step wait for ever on the device.
static bool test_hang(Comm *c, Nccl *n, char *err, size_t err_size) {
  if (c->rank != c->hang_rank || c->step != c->hang_step) return true;
  static int64_t said_for = -1;
  const CudaDriver *d = cuda_driver();
  if (!d->cuStreamWaitValue32)
    return fail(err, err_size, "GEMC_TEST_COMM_HANG needs cuStreamWaitValue32");
  if (!n->never) {
    if (!cu_ok(d->cuMemAlloc(&n->never, 4), "cuMemAlloc", err, err_size) ||
        !cu_ok(d->cuMemsetD8Async(n->never, 0, 4, n->stream), "cuMemsetD8Async", err, err_size))
      return false;
  }
  if (said_for != c->step)
    fprintf(stderr, "gemc: rank %d: test: the collectives of step %lld hang on the device "
            "(GEMC_TEST_COMM_HANG)\n", c->rank, (long long)c->step);
  said_for = c->step;
  return cu_ok(d->cuStreamWaitValue32(n->stream, n->never, 1, 0), "cuStreamWaitValue32", err,
               err_size);
}

static bool nccl_start(Comm *c, CommReq *r, char *err, size_t err_size) {
  Nccl *n = c->impl;
  const CudaDriver *d = cuda_driver();
  CommCall k_staged = r->call, *k = &k_staged;
  r->host_recv = NULL;
  if (k->wait_for && !cu_ok(d->cuStreamWaitEvent(n->stream, k->wait_for, 0),
                            "cuStreamWaitEvent", err, err_size))
    return false;
  if (!test_hang(c, n, err, err_size)) return false;
  if (!k->device && !stage_in(c, r, k, err, err_size)) return false;
  // A non-blocking communicator may answer ncclInProgress: the collective is on the stream
  // once that settles.
  NcclResult rc = settle(c, n, enqueue(c, n, k), "enqueuing an NCCL collective", err, err_size);
  if (rc == NCCL_IN_PROGRESS) return false;
  if (!nccl_ok(n, rc, "an NCCL collective", err, err_size)) return false;
  CUevent e = NULL;
  if (!cu_ok(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate", err, err_size))
    return false;
  r->request = e;
  return cu_ok(d->cuEventRecord(e, n->stream), "cuEventRecord", err, err_size);
}

static int nccl_test(Comm *c, CommReq *r, char *err, size_t err_size) {
  Nccl *n = c->impl;
  const CudaDriver *d = cuda_driver();
  CUresult q = d->cuEventQuery(r->request);
  if (q == CU_ERROR_NOT_READY) {
    NcclResult async = NCCL_SUCCESS;
    n->CommGetAsyncError(n->comm, &async);
    if (async != NCCL_SUCCESS && async != NCCL_IN_PROGRESS) {
      nccl_ok(n, async, "an NCCL collective", err, err_size);
      return -1;
    }
    return 0;
  }
  if (!cu_ok(q, "an NCCL collective's event", err, err_size)) return -1;
  if (r->host_recv && r->recv_bytes > 0 &&
      !cu_ok(d->cuMemcpyDtoH(r->host_recv, (CUdeviceptr)r->stage + r->recv_at, r->recv_bytes),
             "reading a collective's result", err, err_size))
    return -1;
  r->host_recv = NULL;
  return 1;
}

// The done event lives until the wait (comm_done_event hands it out).
static void nccl_release(Comm *c, CommReq *r) {
  (void)c;
  if (r->request && cuda_driver()) cuda_driver()->cuEventDestroy(r->request);
  r->request = NULL;
}

static void nccl_abort(Comm *c, int code) {
  (void)code;
  Nccl *n = c->impl;
  if (n && n->comm) n->CommAbort(n->comm);
  if (n) n->comm = NULL;
}

static void nccl_close(Comm *c) {
  Nccl *n = c->impl;
  if (!n) return;
  if (n->comm) n->CommDestroy(n->comm);
  const CudaDriver *d = cuda_driver();
  for (int i = 0; d && i < COMM_MAX_INFLIGHT; i++) {
    if (c->reqs[i].stage) d->cuMemFree((CUdeviceptr)c->reqs[i].stage);
    c->reqs[i].stage = 0;
  }
  if (n->never && d) d->cuMemFree(n->never);
  if (n->stream && d) d->cuStreamDestroy(n->stream);
  free(n);
}

const CommOps comm_nccl_ops = {"nccl", nccl_open, nccl_start, nccl_test, nccl_release,
                               nccl_abort, nccl_close};
