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
//   - A timeout aborts the communicator (ncclCommAbort) before the job ends.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "comm_internal.h"
#include "cuda_driver.h"
#include "rendezvous.h"

typedef int NcclResult;  // ncclSuccess == 0, ncclInProgress == 7
enum { NCCL_SUCCESS = 0, NCCL_IN_PROGRESS = 7, NCCL_INT64 = 4, NCCL_FLOAT32 = 7,
       NCCL_FLOAT64 = 8, NCCL_SUM = 0, NCCL_ID_BYTES = 128 };
typedef struct NcclComm *NcclCommHandle;
typedef struct NcclId {
  char internal[NCCL_ID_BYTES];
} NcclId;

typedef struct Nccl {
  void *lib;
  NcclCommHandle comm;
  CUstream stream;
  int version;
  NcclResult (*GetVersion)(int *);
  NcclResult (*GetUniqueId)(NcclId *);
  NcclResult (*CommInitRank)(NcclCommHandle *, int, NcclId, int);
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
  if (!rendezvous_share(c->init.master_addr, c->init.master_port, c->rank, c->world, &id,
                        sizeof id, c->timeout_s, err, err_size))
    return false;
  return nccl_ok(n, n->CommInitRank(&n->comm, c->world, id, c->rank), "ncclCommInitRank", err,
                 err_size);
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

// The collective itself, on n->stream.
static NcclResult enqueue(Comm *c, Nccl *n, const CommCall *k) {
  int t = nccl_dtype(k->dtype), w = c->world;
  size_t es = comm_dtype_size(k->dtype);
  const char *send = k->send;
  char *recv = k->recv;
  NcclResult rc = NCCL_SUCCESS;
  switch (k->kind) {
    case COMM_ALLREDUCE:
      return n->AllReduce(send, recv, (size_t)k->count, t, NCCL_SUM, n->comm, n->stream);
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

static bool nccl_start(Comm *c, CommReq *r, char *err, size_t err_size) {
  Nccl *n = c->impl;
  const CudaDriver *d = cuda_driver();
  const CommCall *k = &r->call;
  if (k->wait_for && !cu_ok(d->cuStreamWaitEvent(n->stream, k->wait_for, 0),
                            "cuStreamWaitEvent", err, err_size))
    return false;
  if (!nccl_ok(n, enqueue(c, n, k), "an NCCL collective", err, err_size)) return false;
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
  return cu_ok(q, "an NCCL collective's event", err, err_size) ? 1 : -1;
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
  if (n->stream && cuda_driver()) cuda_driver()->cuStreamDestroy(n->stream);
  free(n);
}

const CommOps comm_nccl_ops = {"nccl", nccl_open, nccl_start, nccl_test, nccl_release,
                               nccl_abort, nccl_close};
