// comm.c: the collectives of comm.h: the handles, the waits with their timeout, and the
// backend of a world of one (COMM_SELF). comm_mpi.c is the MPI backend.
#include "comm.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checked.h"
#include "clock.h"
#include "comm_internal.h"

size_t comm_dtype_size(CommDtype d) { return d == COMM_F32 ? 4 : 8; }

const char *comm_cta_policy_name(CommCtaPolicy p) {
  switch (p) {
    case COMM_CTA_BANDWIDTH: return "bandwidth";
    case COMM_CTA_EFFICIENCY: return "efficiency";
    case COMM_CTA_ZERO: return "zero";
    default: return "default";
  }
}

bool comm_cta_policy_parse(const char *s, CommCtaPolicy *out) {
  static const CommCtaPolicy all[] = {COMM_CTA_DEFAULT, COMM_CTA_BANDWIDTH, COMM_CTA_EFFICIENCY,
                                      COMM_CTA_ZERO};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (strcmp(s, comm_cta_policy_name(all[i])) == 0) {
      *out = all[i];
      return true;
    }
  return false;
}

static const char *kind_name(CommKind k) {
  switch (k) {
    case COMM_ALLREDUCE: return "all-reduce";
    case COMM_REDUCE_SCATTER: return "reduce-scatter";
    case COMM_ALLGATHER: return "all-gather";
    case COMM_BROADCAST: return "broadcast";
    default: return "all-to-all";
  }
}

// --- a world of one -----------------------------------------------------------------------

static bool self_open(Comm *c, char *err, size_t err_size) {
  (void)err, (void)err_size;
  c->impl = NULL;
  return true;
}

static void copy_if(void *dst, const void *src, int64_t n, CommDtype d) {
  if (n > 0 && dst != src) memmove(dst, src, (size_t)n * comm_dtype_size(d));
}

static bool self_start(Comm *c, CommReq *r, char *err, size_t err_size) {
  (void)c, (void)err, (void)err_size;
  const CommCall *k = &r->call;
  switch (k->kind) {
    case COMM_ALLREDUCE: copy_if(k->recv, k->send, k->count, k->dtype); break;
    case COMM_REDUCE_SCATTER:
    case COMM_ALLGATHER: copy_if(k->recv, k->send, k->counts[0], k->dtype); break;
    case COMM_BROADCAST: break;
    case COMM_ALLTOALL: copy_if(k->recv, k->send, k->send_counts[0], k->dtype); break;
  }
  return true;
}

static int self_test(Comm *c, CommReq *r, char *err, size_t err_size) {
  (void)c, (void)r, (void)err, (void)err_size;
  return 1;
}

static void self_abort(Comm *c, int code) {
  (void)c;
  exit(code);
}

static void self_close(Comm *c) { (void)c; }

static const CommOps self_ops = {"self", self_open, self_start, self_test, NULL, self_abort,
                                 self_close};

// --- the interface ------------------------------------------------------------------------

static void read_fault_hooks(Comm *c) {
  c->stall_rank = c->die_rank = c->hang_rank = -1;
  const char *v = getenv("GEMC_TEST_COMM_STALL");
  int r;
  long long s;
  if (v && sscanf(v, "%d:%lld", &r, &s) == 2) c->stall_rank = r, c->stall_step = s;
  v = getenv("GEMC_TEST_COMM_DIE");
  if (v && sscanf(v, "%d:%lld", &r, &s) == 2) c->die_rank = r, c->die_step = s;
  v = getenv("GEMC_TEST_COMM_HANG");
  if (v && sscanf(v, "%d:%lld", &r, &s) == 2) c->hang_rank = r, c->hang_step = s;
}

Comm *comm_open(CommBackend b, int rank, int world, double timeout_s, const CommInit *init,
                char *err, size_t err_size) {
  Comm *c = xcalloc(1, sizeof *c);
  c->ops = b == COMM_MPI ? &comm_mpi_ops : b == COMM_NCCL ? &comm_nccl_ops : &self_ops;
  if (init) c->init = *init;
  c->rank = rank;
  c->world = world;
  c->timeout_s = timeout_s > 0 ? timeout_s : 300;
  read_fault_hooks(c);
  if (b == COMM_SELF && world != 1) {
    snprintf(err, err_size, "a world of %d ranks needs a communication backend", world);
    free(c);
    return NULL;
  }
  if (!c->ops->open(c, err, err_size)) {
    c->ops->close(c);  // what the backend set up before it failed
    free(c);
    return NULL;
  }
  return c;
}

void comm_close(Comm *c) {
  if (!c) return;
  for (int i = 0; i < COMM_MAX_INFLIGHT; i++) free(c->reqs[i].ints);
  c->ops->close(c);
  free(c);
}

int comm_rank(const Comm *c) { return c ? c->rank : 0; }
int comm_world(const Comm *c) { return c ? c->world : 1; }
double comm_timeout(const Comm *c) { return c ? c->timeout_s : 0; }
const char *comm_backend_name(const Comm *c) { return c ? c->ops->name : "self"; }
void comm_set_step(Comm *c, int64_t step) { c->step = step; }

void comm_test_faults(Comm *c) {
  if (c->rank == c->die_rank && c->step == c->die_step) {
    fprintf(stderr, "gemc: rank %d: test: killed at step %" PRId64 " (GEMC_TEST_COMM_DIE)\n",
            c->rank, c->step);
    raise(SIGKILL);
  }
  if (c->rank != c->stall_rank || c->step != c->stall_step) return;
  fprintf(stderr, "gemc: rank %d: test: stalling at step %" PRId64 " (GEMC_TEST_COMM_STALL)\n",
          c->rank, c->step);
  for (;;) pause();
}

int comm_start(Comm *c, const CommCall *call, char *err, size_t err_size) {
  int h = -1;
  for (int i = 0; i < COMM_MAX_INFLIGHT && h < 0; i++)
    if (!c->reqs[i].used) h = i;
  if (h < 0) {
    snprintf(err, err_size, "more than %d collectives in flight", COMM_MAX_INFLIGHT);
    return -1;
  }
  bool nccl = c->ops == &comm_nccl_ops;
  if ((call->scale != 0 || call->nbufs > 0) &&
      (!nccl || !call->device || call->kind != COMM_ALLREDUCE)) {
    snprintf(err, err_size, "internal error: a scaled or grouped collective (%s) needs NCCL "
             "and device buffers, and is an all-reduce", call->what ? call->what : "data");
    return -1;
  }
  // NCCL 2.28's one-rank path (ncclLaunchOneRank) left the last element of a 4097-element
  // buffer unscaled on the H200 (docs/distributed.md); a world of one never needs a scale (its
  // share is the whole batch), so it is refused rather than trusted.
  if (call->scale != 0 && call->scale != 1 && c->world == 1) {
    snprintf(err, err_size, "internal error: a scaled all-reduce (%s) in a world of one",
             call->what ? call->what : "data");
    return -1;
  }
  if (call->device && !nccl) {
    snprintf(err, err_size, "internal error: device buffers (%s) on the %s backend",
             call->what ? call->what : "data", c->ops->name);
    return -1;
  }
  CommReq *r = &c->reqs[h];
  r->call = *call;
  snprintf(r->what, sizeof r->what, "%s", call->what ? call->what : "data");
  r->call.what = r->what;
  r->started = monotonic_seconds();
  r->request = NULL;
  r->finished = false;
  if (!r->ints) r->ints = xcalloc(4 * (size_t)c->world + 4, sizeof *r->ints);
  if (!c->ops->start(c, r, err, err_size)) return -1;
  r->used = true;
  return h;
}

static void abort_took_too_long(int sig) {
  (void)sig;
  _exit(1);
}

// Prints what timed out and ends the job; does not return. The backend's abort gets 20 s: a
// collective stuck on a device stream can hold NCCL's abort, or the driver's teardown at
// exit, for ever, so the process leaves by _exit.
static void timed_out(Comm *c, const CommReq *r) {
  fprintf(stderr, "gemc: rank %d: error: the %s of %s (step %" PRId64 ") did not finish "
          "within %g s (--comm-timeout): another rank died or stalled; aborting every rank\n",
          c->rank, kind_name(r->call.kind), r->call.what, c->step,
          r->call.timeout_s > 0 ? r->call.timeout_s : c->timeout_s);
  fflush(stderr);
  signal(SIGALRM, abort_took_too_long);
  alarm(20);
  c->ops->abort(c, 1);
  fflush(stdout);
  _exit(1);
}

bool comm_wait(Comm *c, int handle, char *err, size_t err_size) {
  if (handle < 0 || handle >= COMM_MAX_INFLIGHT || !c->reqs[handle].used) {
    snprintf(err, err_size, "internal error: wait for collective %d, which is not in flight",
             handle);
    return false;
  }
  CommReq *r = &c->reqs[handle];
  for (long polls = 0;; polls++) {
    int done = r->finished ? 1 : c->ops->test(c, r, err, err_size);
    if (done != 0) {
      if (c->ops->release) c->ops->release(c, r);
      r->used = false;
      return done > 0;
    }
    double limit = r->call.timeout_s > 0 ? r->call.timeout_s : c->timeout_s;
    if (monotonic_seconds() - r->started > limit) timed_out(c, r);
    if (polls > 1000) {
      struct timespec nap = {0, 20000};  // 20 us: a waiting rank leaves the cores to others
      nanosleep(&nap, NULL);
    }
  }
}

void comm_progress(Comm *c) {
  char err[256];
  for (int i = 0; i < COMM_MAX_INFLIGHT; i++) {
    CommReq *r = &c->reqs[i];
    if (r->used && !r->finished) r->finished = c->ops->test(c, r, err, sizeof err) > 0;
  }
}

void *comm_done_event(Comm *c, int handle) {
  if (c->ops != &comm_nccl_ops || handle < 0 || handle >= COMM_MAX_INFLIGHT) return NULL;
  return c->reqs[handle].used ? c->reqs[handle].request : NULL;  // until its comm_wait
}

void *comm_stream(Comm *c) { return c->ops == &comm_nccl_ops ? c->impl_stream : NULL; }

bool comm_run(Comm *c, const CommCall *call, char *err, size_t err_size) {
  int h = comm_start(c, call, err, err_size);
  return h >= 0 && comm_wait(c, h, err, err_size);
}

void comm_abort(Comm *c, int code) {
  fflush(stdout);
  fflush(stderr);
  if (c) c->ops->abort(c, code);
  exit(code);
}
