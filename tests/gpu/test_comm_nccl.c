// test_comm_nccl.c: the NCCL backend of runtime/comm (comm_nccl.c) on real GPUs. Each rank
// opens its device (LOCAL_RANK), joins the world its launcher describes (torchrun's or gemc
// launch's variables; alone, a world of one), and runs every collective of comm.h on device
// buffers, then checks each result on the host against what the collective must give for this
// world size:
//   - all-reduce of rank-dependent integers (exact in fp32), in place and out of place;
//   - reduce-scatter and all-gather, with equal counts (NCCL's own) and unequal ones (the
//     grouped path);
//   - broadcast from the last rank;
//   - all-to-all with per-peer counts, in fp64 and int64;
//   - an all-reduce ordered after a compute-stream event, and a compute stream ordered after
//     its end (comm_done_event);
//   - host buffers staged through the device (all-reduce, all-gather, broadcast, all-to-all);
//   - a grouped in-place all-reduce of several buffers, scaled per rank (PreMulSum) in a
//     world of several; a world of one refuses a scale.
// Then it times a 256 MiB all-reduce and a 256 MiB all-to-all (bus bandwidth, printed: the
// numbers issue 13 compares with nccl-tests on hosts of several GPUs). Prints PASS or FAIL per
// case; the exit status counts the failures (tests/gpu/run.sh runs it alone, through `gemc
// launch -n 1`, and through torchrun when it is there).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "cuda_driver.h"
#include "rank_env.h"

static int failures;
static Comm *comm;
static int rank, world;
static const CudaDriver *d;

static void check(bool ok, const char *what) {
  printf("%s %s (rank %d of %d)\n", ok ? "PASS" : "FAIL", what, rank, world);
  if (!ok) failures++;
}

static CUdeviceptr upload(const void *host, size_t bytes) {
  CUdeviceptr p = 0;
  if (d->cuMemAlloc(&p, bytes ? bytes : 8) != CU_SUCCESS) {
    fprintf(stderr, "cuMemAlloc failed\n");
    exit(2);
  }
  if (bytes) d->cuMemcpyHtoD(p, host, bytes);
  return p;
}

static void download(void *host, CUdeviceptr p, size_t bytes) {
  d->cuCtxSynchronize();
  if (bytes) d->cuMemcpyDtoH(host, p, bytes);
}

// On device buffers (the host-staged path has its own tests below).
static bool run(CommCall *call) {
  char err[512];
  call->device = true;
  bool ok = comm_run(comm, call, err, sizeof err);
  if (!ok) fprintf(stderr, "rank %d: %s\n", rank, err);
  return ok;
}

static const char *env_get(const char *name, void *ctx) {
  (void)ctx;
  return getenv(name);
}

static void test_allreduce(void) {
  enum { N = 1000 };
  float h[N], out[N];
  for (int i = 0; i < N; i++) h[i] = (float)(i + 1000 * rank);
  CUdeviceptr a = upload(h, sizeof h), b = upload(NULL, sizeof h);
  CommCall call = {.kind = COMM_ALLREDUCE, .dtype = COMM_F32, .send = (void *)a,
                   .recv = (void *)b, .count = N, .what = "test all-reduce"};
  bool ok = run(&call);
  download(out, b, sizeof out);
  for (int i = 0; ok && i < N; i++)
    ok = out[i] == (float)(i * world + 1000.0 * world * (world - 1) / 2);
  check(ok, "all-reduce, out of place, 1000 floats");
  call.send = (void *)a;
  call.recv = (void *)a;
  ok = run(&call);
  download(out, a, sizeof out);
  for (int i = 0; ok && i < N; i++)
    ok = out[i] == (float)(i * world + 1000.0 * world * (world - 1) / 2);
  check(ok, "all-reduce, in place");
  d->cuMemFree(a);
  d->cuMemFree(b);
}

// counts[r] = base + r * extra elements for rank r.
static void test_scatter_gather(int64_t base, int64_t extra, const char *what) {
  int64_t *counts = calloc((size_t)world, sizeof *counts), total = 0, at = 0;
  for (int r = 0; r < world; r++) {
    counts[r] = base + r * extra;
    total += counts[r];
  }
  for (int r = 0; r < rank; r++) at += counts[r];
  float *h = calloc((size_t)total + 1, sizeof *h), *out = calloc((size_t)total + 1, sizeof *out);
  for (int64_t i = 0; i < total; i++) h[i] = (float)(i + 7 * rank);
  CUdeviceptr s = upload(h, (size_t)total * sizeof *h);
  CUdeviceptr r = upload(NULL, (size_t)counts[rank] * sizeof *h);
  CommCall rs = {.kind = COMM_REDUCE_SCATTER, .dtype = COMM_F32, .send = (void *)s,
                 .recv = (void *)r, .counts = counts, .what = "test reduce-scatter"};
  bool ok = run(&rs);
  download(out, r, (size_t)counts[rank] * sizeof *out);
  for (int64_t i = 0; ok && i < counts[rank]; i++)
    ok = out[i] == (float)((at + i) * world + 7.0 * world * (world - 1) / 2);
  char name[128];
  snprintf(name, sizeof name, "reduce-scatter, %s", what);
  check(ok, name);
  // All-gather: rank q contributes counts[q] values q*100 + i.
  for (int64_t i = 0; i < counts[rank]; i++) h[i] = (float)(rank * 100 + i);
  CUdeviceptr mine = upload(h, (size_t)counts[rank] * sizeof *h);
  CUdeviceptr all = upload(NULL, (size_t)total * sizeof *h);
  CommCall ag = {.kind = COMM_ALLGATHER, .dtype = COMM_F32, .send = (void *)mine,
                 .recv = (void *)all, .counts = counts, .what = "test all-gather"};
  ok = run(&ag);
  download(out, all, (size_t)total * sizeof *out);
  for (int q = 0, k = 0; ok && q < world; q++)
    for (int64_t i = 0; ok && i < counts[q]; i++) ok = out[k++] == (float)(q * 100 + i);
  snprintf(name, sizeof name, "all-gather, %s", what);
  check(ok, name);
  d->cuMemFree(s);
  d->cuMemFree(r);
  d->cuMemFree(mine);
  d->cuMemFree(all);
  free(h);
  free(out);
  free(counts);
}

static void test_broadcast(void) {
  double h[64], out[64];
  for (int i = 0; i < 64; i++) h[i] = rank == world - 1 ? 0.5 * i : -1;
  CUdeviceptr p = upload(h, sizeof h);
  CommCall call = {.kind = COMM_BROADCAST, .dtype = COMM_F64, .recv = (void *)p, .count = 64,
                   .root = world - 1, .what = "test broadcast"};
  bool ok = run(&call);
  download(out, p, sizeof out);
  for (int i = 0; ok && i < 64; i++) ok = out[i] == 0.5 * i;
  check(ok, "broadcast from the last rank, 64 doubles");
  d->cuMemFree(p);
}

// Rank r sends (r + q + 1) values to rank q: value r * 1000 + q * 10 + i.
static void test_alltoall(void) {
  int64_t *sc = calloc((size_t)world, sizeof *sc), *rc = calloc((size_t)world, sizeof *rc);
  int64_t ns = 0, nr = 0;
  for (int q = 0; q < world; q++) {
    sc[q] = rank + q + 1;
    rc[q] = q + rank + 1;
    ns += sc[q];
    nr += rc[q];
  }
  int64_t *h = calloc((size_t)ns, sizeof *h), *out = calloc((size_t)nr, sizeof *out);
  for (int q = 0, k = 0; q < world; q++)
    for (int64_t i = 0; i < sc[q]; i++) h[k++] = rank * 1000 + q * 10 + i;
  CUdeviceptr s = upload(h, (size_t)ns * sizeof *h), r = upload(NULL, (size_t)nr * sizeof *h);
  CommCall call = {.kind = COMM_ALLTOALL, .dtype = COMM_I64, .send = (void *)s,
                   .recv = (void *)r, .send_counts = sc, .recv_counts = rc,
                   .what = "test all-to-all"};
  bool ok = run(&call);
  download(out, r, (size_t)nr * sizeof *out);
  for (int q = 0, k = 0; ok && q < world; q++)
    for (int64_t i = 0; ok && i < rc[q]; i++) ok = out[k++] == q * 1000 + rank * 10 + i;
  check(ok, "all-to-all with per-peer counts, int64");
  d->cuMemFree(s);
  d->cuMemFree(r);
  free(h);
  free(out);
  free(sc);
  free(rc);
}

// Compute writes, the collective waits for it; compute reads after the collective's event.
static void test_ordering(void) {
  enum { N = 1 << 20 };
  float *h = calloc(N, sizeof *h), *out = calloc(N, sizeof *out);
  for (int i = 0; i < N; i++) h[i] = 1.0f;
  CUstream compute;
  d->cuStreamCreate(&compute, CU_STREAM_NON_BLOCKING);
  CUdeviceptr src = upload(NULL, N * sizeof *h), buf = upload(NULL, N * sizeof *h);
  CUdeviceptr copy = upload(NULL, N * sizeof *h);
  d->cuMemcpyHtoD(src, h, N * sizeof *h);
  // A pageable upload may return before its DMA lands, and the non-blocking stream below does
  // not wait for the legacy stream: finish it first (else the test races its own setup).
  d->cuCtxSynchronize();
  CUevent written;
  d->cuEventCreate(&written, CU_EVENT_DISABLE_TIMING);
  d->cuMemcpyDtoDAsync(buf, src, N * sizeof *h, compute);  // "compute" produces buf
  d->cuEventRecord(written, compute);
  char err[512];
  CommCall call = {.kind = COMM_ALLREDUCE, .dtype = COMM_F32, .send = (void *)buf,
                   .recv = (void *)buf, .count = N, .wait_for = written,
                   .what = "test ordering", .device = true};
  int hnd = comm_start(comm, &call, err, sizeof err);
  bool ok = hnd >= 0;
  void *done = ok ? comm_done_event(comm, hnd) : NULL;
  if (done) d->cuStreamWaitEvent(compute, done, 0);
  d->cuMemcpyDtoDAsync(copy, buf, N * sizeof *h, compute);  // "compute" consumes the sum
  ok = ok && comm_wait(comm, hnd, err, sizeof err);
  if (!ok) fprintf(stderr, "rank %d: %s\n", rank, err);
  d->cuStreamSynchronize(compute);
  download(out, copy, N * sizeof *out);
  for (int i = 0; ok && i < N; i++) ok = out[i] == (float)world;
  check(ok, "all-reduce ordered after a compute event, compute ordered after it (4 MiB)");
  d->cuEventDestroy(written);
  d->cuStreamDestroy(compute);
  d->cuMemFree(src);
  d->cuMemFree(buf);
  d->cuMemFree(copy);
  free(h);
  free(out);
}

// Host buffers, staged through the device by the backend: an fp64 all-reduce in place, an
// int64 all-gather with unequal counts, a broadcast, and an all-to-all (every staging shape).
static void test_host_staged(void) {
  char err[512];
  double v[3] = {1.5 * (rank + 1), -2.0, (double)rank};
  CommCall ar = {.kind = COMM_ALLREDUCE, .dtype = COMM_F64, .send = v, .recv = v, .count = 3,
                 .what = "host all-reduce"};
  bool ok = comm_run(comm, &ar, err, sizeof err);
  double tri = 0.5 * world * (world - 1);
  ok = ok && v[0] == 1.5 * (tri + world) && v[1] == -2.0 * world && v[2] == tri;
  check(ok, "all-reduce of host fp64 values, staged through the device");
  int64_t *counts = calloc((size_t)world, sizeof *counts), total = 0;
  for (int r = 0; r < world; r++) total += counts[r] = r + 2;
  int64_t *mine = calloc((size_t)rank + 2, sizeof *mine), *all = calloc((size_t)total, 8);
  for (int i = 0; i < rank + 2; i++) mine[i] = 100 * rank + i;
  CommCall ag = {.kind = COMM_ALLGATHER, .dtype = COMM_I64, .send = mine, .recv = all,
                 .counts = counts, .what = "host all-gather"};
  ok = comm_run(comm, &ag, err, sizeof err);
  for (int r = 0, at = 0; ok && r < world; r++)
    for (int i = 0; i < r + 2; i++) ok = all[at++] == 100 * r + i;
  check(ok, "all-gather of host int64 values, counts r + 2");
  float b[4] = {0, 0, 0, 0};
  if (rank == world - 1) b[0] = 7, b[3] = -1;
  CommCall bc = {.kind = COMM_BROADCAST, .dtype = COMM_F32, .recv = b, .count = 4,
                 .root = world - 1, .what = "host broadcast"};
  ok = comm_run(comm, &bc, err, sizeof err) && b[0] == 7 && b[3] == -1 && b[1] == 0;
  check(ok, "broadcast of host values from the last rank");
  int64_t *sc = calloc((size_t)world, 8), *rc = calloc((size_t)world, 8);
  for (int r = 0; r < world; r++) sc[r] = 1, rc[r] = 1;
  float *sv = calloc((size_t)world, 4), *rv = calloc((size_t)world, 4);
  for (int r = 0; r < world; r++) sv[r] = (float)(10 * rank + r);
  CommCall aa = {.kind = COMM_ALLTOALL, .dtype = COMM_F32, .send = sv, .recv = rv,
                 .send_counts = sc, .recv_counts = rc, .what = "host all-to-all"};
  ok = comm_run(comm, &aa, err, sizeof err);
  for (int r = 0; ok && r < world; r++) ok = rv[r] == (float)(10 * r + rank);
  check(ok, "all-to-all of host values");
  if (!ok) fprintf(stderr, "rank %d: %s\n", rank, err);
  free(counts), free(mine), free(all), free(sc), free(rc), free(sv), free(rv);
}

// The trainer's bucket call: several device buffers all-reduced in place in one grouped
// call, each rank's values scaled by its share (PreMulSum) before the sum. A world of one
// refuses a scale (comm.c: NCCL's one-rank path left a tail unscaled) and reduces unscaled.
static void test_grouped_scaled(void) {
  enum { NB = 3 };
  int64_t counts[NB] = {1000, 1, 4097};
  void *bufs[NB];
  float *h[NB];
  for (int j = 0; j < NB; j++) {
    h[j] = calloc((size_t)counts[j], sizeof *h[j]);
    for (int64_t i = 0; i < counts[j]; i++) h[j][i] = (float)(i % 64 + j);
    bufs[j] = (void *)upload(h[j], (size_t)counts[j] * 4);
  }
  // Scales 0.25 (rank + 1): powers of two times small integers, so every sum is exact.
  CommCall call = {.kind = COMM_ALLREDUCE, .dtype = COMM_F32, .nbufs = NB, .bufs = bufs,
                   .buf_counts = counts, .scale = world > 1 ? 0.25f * (float)(rank + 1) : 0,
                   .what = "test grouped buckets", .device = true};
  char err[256];
  if (world == 1) {
    CommCall scaled = call;
    scaled.scale = 0.5f;
    check(comm_start(comm, &scaled, err, sizeof err) < 0 && strstr(err, "world of one"),
          "a scaled all-reduce in a world of one is refused");
  }
  bool ok = run(&call);
  float factor = world > 1 ? 0.25f * (float)world * (float)(world + 1) / 2 : 1;
  for (int j = 0; j < NB && ok; j++) {
    float *out = calloc((size_t)counts[j], sizeof *out);
    download(out, (CUdeviceptr)bufs[j], (size_t)counts[j] * 4);
    for (int64_t i = 0; ok && i < counts[j]; i++) {
      ok = out[i] == h[j][i] * factor;
      if (!ok)
        fprintf(stderr, "rank %d: buffer %d [%lld] = %g, want %g\n", rank, j, (long long)i,
                out[i], h[j][i] * factor);
    }
    free(out);
  }
  check(ok, world > 1 ? "grouped in-place all-reduce of 3 buffers (1000, 1, 4097) scaled by "
                        "0.25 (rank + 1)"
                      : "grouped in-place all-reduce of 3 buffers (1000, 1, 4097)");
  for (int j = 0; j < NB; j++) {
    d->cuMemFree((CUdeviceptr)bufs[j]);
    free(h[j]);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// All-to-all of 256 MiB per rank, equal parts: the embedding exchange's pattern.
static void alltoall_bandwidth(void) {
  const int64_t n = (int64_t)64 << 20;
  int64_t *counts = calloc((size_t)world, sizeof *counts);
  for (int r = 0; r < world; r++) counts[r] = n / world;
  CUdeviceptr s = upload(NULL, (size_t)n * 4), r = upload(NULL, (size_t)n * 4);
  CommCall call = {.kind = COMM_ALLTOALL, .dtype = COMM_F32, .send = (void *)s,
                   .recv = (void *)r, .send_counts = counts, .recv_counts = counts,
                   .what = "bandwidth all-to-all"};
  bool ok = run(&call);
  d->cuCtxSynchronize();
  double t0 = now_s();
  for (int i = 0; ok && i < 5; i++) ok = run(&call);
  double sec = (now_s() - t0) / 5;
  double bus = world > 1 ? 4.0 * (double)(n / world * world) * (world - 1) / world / sec / 1e9 : 0;
  printf("all-to-all of 256 MiB a rank: %.3f ms, bus bandwidth %.1f GB/s (world %d%s)\n",
         1e3 * sec, bus, world, world == 1 ? ": no traffic" : "");
  check(ok, "a 256 MiB all-to-all, 5 times");
  d->cuMemFree(s);
  d->cuMemFree(r);
  free(counts);
}

static void bandwidth(void) {
  const int64_t n = (int64_t)64 << 20;  // 256 MiB of floats
  CUdeviceptr p = upload(NULL, (size_t)n * 4);
  d->cuMemsetD8Async(p, 0, (size_t)n * 4, NULL);
  CommCall call = {.kind = COMM_ALLREDUCE, .dtype = COMM_F32, .send = (void *)p,
                   .recv = (void *)p, .count = n, .what = "bandwidth all-reduce"};
  bool ok = run(&call);  // warm-up
  d->cuCtxSynchronize();
  double t0 = now_s();
  for (int i = 0; ok && i < 5; i++) ok = run(&call);
  double s = (now_s() - t0) / 5;
  double bus = world > 1 ? 4.0 * (double)n * 2.0 * (world - 1) / world / s / 1e9 : 0;
  printf("all-reduce of 256 MiB: %.3f ms, bus bandwidth %.1f GB/s (world %d%s)\n", 1e3 * s, bus,
         world, world == 1 ? ": no traffic" : "");
  check(ok, "a 256 MiB all-reduce, 5 times");
  d->cuMemFree(p);
}

int main(void) {
  char err[512];
  RankEnv env;
  if (!rank_env_read(&env, env_get, NULL, err, sizeof err)) {
    fprintf(stderr, "test_comm_nccl: %s\n", err);
    return 2;
  }
  rank = env.rank;
  world = env.world;
  CudaContext ctx;
  if (!cuda_context_open(&ctx, env.local_rank, err, sizeof err)) {
    printf("SKIP test_comm_nccl: %s\n", err);
    return 0;
  }
  d = cuda_driver();
  CommInit init = {.master_addr = env.master_addr, .master_port = env.master_port,
                   .device = env.local_rank, .job = env.job};
  comm = comm_open(COMM_NCCL, rank, world, 120, &init, err, sizeof err);
  if (!comm) {
    printf("FAIL opening NCCL (rank %d of %d): %s\n", rank, world, err);
    return 1;
  }
  printf("NCCL world of %d, rank %d on device %d (started by %s)\n", world, rank,
         env.local_rank, rank_launcher_name(env.launcher));
  test_allreduce();
  test_scatter_gather(256, 0, "equal counts");
  test_scatter_gather(100, 37, "counts 100 + 37 r");
  test_broadcast();
  test_alltoall();
  test_ordering();
  test_host_staged();
  test_grouped_scaled();
  bandwidth();
  alltoall_bandwidth();
  comm_close(comm);
  cuda_context_close(&ctx);
  return failures;
}
