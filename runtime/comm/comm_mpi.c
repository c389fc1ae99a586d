// comm_mpi.c: the MPI backend of comm.h. OpenMPI's libmpi.so.40 is loaded when a run of
// several CPU ranks starts, so gemc neither links against MPI nor needs it installed to run
// anything else. It uses OpenMPI's ABI: a handle (communicator, datatype, operation, request)
// is a pointer, and the predefined ones are the addresses of its ompi_mpi_* objects. That is
// why the backend is OpenMPI's and not any MPI's (docs/distributed.md).
// Every collective is MPI's non-blocking one (MPI_Iallreduce, ...), polled with MPI_Test, so
// comm.c can time a wait out instead of blocking in the library.
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "comm_internal.h"

typedef void *MpiHandle;
enum { MPI_THREAD_SINGLE_ = 0, MPI_MAX_ERROR_STRING_ = 256 };

typedef struct Mpi {
  void *lib;
  MpiHandle world, f32, f64, i64, sum;
  int (*Initialized)(int *);
  int (*Init_thread)(int *, char ***, int, int *);
  int (*Finalize)(void);
  int (*Comm_rank)(MpiHandle, int *);
  int (*Comm_size)(MpiHandle, int *);
  int (*Iallreduce)(const void *, void *, int, MpiHandle, MpiHandle, MpiHandle, MpiHandle *);
  int (*Ireduce_scatter)(const void *, void *, const int *, MpiHandle, MpiHandle, MpiHandle,
                         MpiHandle *);
  int (*Iallgatherv)(const void *, int, MpiHandle, void *, const int *, const int *, MpiHandle,
                     MpiHandle, MpiHandle *);
  int (*Ibcast)(void *, int, MpiHandle, int, MpiHandle, MpiHandle *);
  int (*Ialltoallv)(const void *, const int *, const int *, MpiHandle, void *, const int *,
                    const int *, MpiHandle, MpiHandle, MpiHandle *);
  int (*Test)(MpiHandle *, int *, void *);
  int (*Abort)(MpiHandle, int);
  int (*Error_string)(int, char *, int *);
  bool initialized_here;
} Mpi;

static const char *const LIBMPI = "libmpi.so.40";

static bool load(Mpi *m, char *err, size_t err_size) {
  m->lib = dlopen(LIBMPI, RTLD_NOW | RTLD_GLOBAL);
  if (!m->lib) {
    snprintf(err, err_size, "cannot load OpenMPI (%s: %s): CPU ranks need it; on Debian or "
             "Ubuntu: apt-get install openmpi-bin", LIBMPI, dlerror());
    return false;
  }
  struct {
    const char *name;
    void **slot;
    bool object;  // a predefined handle: its address is the handle
  } syms[] = {
      {"ompi_mpi_comm_world", &m->world, true}, {"ompi_mpi_float", &m->f32, true},
      {"ompi_mpi_double", &m->f64, true},       {"ompi_mpi_int64_t", &m->i64, true},
      {"ompi_mpi_op_sum", &m->sum, true},
      {"MPI_Initialized", (void **)&m->Initialized, false},
      {"MPI_Init_thread", (void **)&m->Init_thread, false},
      {"MPI_Finalize", (void **)&m->Finalize, false},
      {"MPI_Comm_rank", (void **)&m->Comm_rank, false},
      {"MPI_Comm_size", (void **)&m->Comm_size, false},
      {"MPI_Iallreduce", (void **)&m->Iallreduce, false},
      {"MPI_Ireduce_scatter", (void **)&m->Ireduce_scatter, false},
      {"MPI_Iallgatherv", (void **)&m->Iallgatherv, false},
      {"MPI_Ibcast", (void **)&m->Ibcast, false},
      {"MPI_Ialltoallv", (void **)&m->Ialltoallv, false},
      {"MPI_Test", (void **)&m->Test, false},
      {"MPI_Abort", (void **)&m->Abort, false},
      {"MPI_Error_string", (void **)&m->Error_string, false},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(m->lib, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(err, err_size, "%s has no %s: gemc's CPU ranks need OpenMPI 4 or later", LIBMPI,
               syms[i].name);
      return false;
    }
  }
  return true;
}

static bool mpi_ok(const Mpi *m, int rc, const char *what, char *err, size_t err_size) {
  if (rc == 0) return true;
  char text[MPI_MAX_ERROR_STRING_] = "";
  int len = 0;
  m->Error_string(rc, text, &len);
  snprintf(err, err_size, "%s failed: %s", what, text);
  return false;
}

static bool mpi_open(Comm *c, char *err, size_t err_size) {
  Mpi *m = xcalloc(1, sizeof *m);
  c->impl = m;
  if (!load(m, err, err_size)) return false;
  int inited = 0, provided = 0, rank = -1, size = 0;
  m->Initialized(&inited);
  if (!inited) {
    // Only this thread calls MPI (the batch pipeline's thread never does).
    if (!mpi_ok(m, m->Init_thread(NULL, NULL, MPI_THREAD_SINGLE_, &provided), "MPI_Init",
                err, err_size))
      return false;
    m->initialized_here = true;
  }
  m->Comm_rank(m->world, &rank);
  m->Comm_size(m->world, &size);
  if (rank != c->rank || size != c->world) {
    snprintf(err, err_size, "the launcher says rank %d of %d, but MPI says rank %d of %d: CPU "
             "ranks meet through OpenMPI, so start them with OpenMPI's mpirun, `gemc launch` or "
             "srun --mpi=pmix", c->rank, c->world, rank, size);
    return false;
  }
  return true;
}

static MpiHandle dtype(const Mpi *m, CommDtype d) {
  return d == COMM_F32 ? m->f32 : d == COMM_F64 ? m->f64 : m->i64;
}

// counts[world] into ints (and the displacements after them), as MPI's ints.
static bool to_ints(const Comm *c, const int64_t *counts, int *ints, char *err,
                    size_t err_size) {
  int64_t at = 0;
  for (int r = 0; r < c->world; r++) {
    if (counts[r] < 0 || counts[r] > INT_MAX || at > INT_MAX) {
      snprintf(err, err_size, "a collective of more than %d elements per rank is more than "
               "MPI's int counts can describe", INT_MAX);
      return false;
    }
    ints[r] = (int)counts[r];
    ints[c->world + r] = (int)at;
    at += counts[r];
  }
  return true;
}

static bool mpi_start(Comm *c, CommReq *r, char *err, size_t err_size) {
  Mpi *m = c->impl;
  const CommCall *k = &r->call;
  MpiHandle t = dtype(m, k->dtype), *req = &r->request;
  int w = c->world, rc = 0;
  const void *send = k->send == k->recv ? (const void *)1 : k->send;  // MPI_IN_PLACE is 1
  if ((k->kind == COMM_ALLREDUCE || k->kind == COMM_BROADCAST) &&
      (k->count < 0 || k->count > INT_MAX)) {
    snprintf(err, err_size, "a collective of %lld elements is more than MPI's int counts can "
             "describe", (long long)k->count);
    return false;
  }
  switch (k->kind) {
    case COMM_ALLREDUCE:
      rc = m->Iallreduce(send, k->recv, (int)k->count, t, m->sum, m->world, req);
      break;
    case COMM_REDUCE_SCATTER:
      if (!to_ints(c, k->counts, r->ints, err, err_size)) return false;
      rc = m->Ireduce_scatter(k->send, k->recv, r->ints, t, m->sum, m->world, req);
      break;
    case COMM_ALLGATHER:
      if (!to_ints(c, k->counts, r->ints, err, err_size)) return false;
      rc = m->Iallgatherv(k->send, r->ints[c->rank], t, k->recv, r->ints, r->ints + w, t,
                          m->world, req);
      break;
    case COMM_BROADCAST:
      rc = m->Ibcast(k->recv, (int)k->count, t, k->root, m->world, req);
      break;
    case COMM_ALLTOALL:
      if (!to_ints(c, k->send_counts, r->ints, err, err_size) ||
          !to_ints(c, k->recv_counts, r->ints + 2 * w, err, err_size))
        return false;
      rc = m->Ialltoallv(k->send, r->ints, r->ints + w, t, k->recv, r->ints + 2 * w,
                         r->ints + 3 * w, t, m->world, req);
      break;
  }
  return mpi_ok(m, rc, "starting an MPI collective", err, err_size);
}

static int mpi_test(Comm *c, CommReq *r, char *err, size_t err_size) {
  Mpi *m = c->impl;
  int flag = 0;
  if (!mpi_ok(m, m->Test(&r->request, &flag, NULL), "MPI_Test", err, err_size)) return -1;
  return flag ? 1 : 0;
}

static void mpi_abort(Comm *c, int code) {
  Mpi *m = c->impl;
  if (m && m->Abort) m->Abort(m->world, code);
}

static void mpi_close(Comm *c) {
  Mpi *m = c->impl;
  if (!m) return;
  if (m->initialized_here && m->Finalize) m->Finalize();
  // libmpi stays loaded: OpenMPI cannot be unloaded and loaded again.
  free(m);
}

const CommOps comm_mpi_ops = {"mpi", mpi_open, mpi_start, mpi_test, NULL, mpi_abort,
                              mpi_close};
