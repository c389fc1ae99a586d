// train_world.c: the world of a distributed `gemc train` (train_world.h).
#include "train_world.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"

static const char *env_get(const char *name, void *ctx) {
  (void)ctx;
  return getenv(name);
}

bool train_world_read(TrainWorld *w) {
  memset(w, 0, sizeof *w);
  char err[400];
  if (!rank_env_read(&w->env, env_get, NULL, err, sizeof err)) {
    fprintf(stderr, "gemc: error: the launcher's environment: %s\n", err);
    return false;
  }
  if (w->env.world > 1) snprintf(w->prefix, sizeof w->prefix, "rank %d: ", w->env.rank);
  return true;
}

void train_world_error(const TrainWorld *w, const char *msg) {
  fprintf(stderr, "gemc: %serror: %s\n", w->prefix, msg);
}

bool train_world_rank0(const TrainWorld *w) { return w->env.rank == 0; }

// GPU ranks: this rank's device is LOCAL_RANK, and the world meets through NCCL, even a world
// of one that a launcher started (so that it runs the same path as a world of several).
static bool join_gpus(TrainWorld *w, double timeout_s) {
  if (w->env.launcher == LAUNCHER_NONE) return true;
  char err[600], dev[16];
  snprintf(dev, sizeof dev, "%d", w->env.local_rank);
  setenv("GEMC_DEVICE", dev, 1);  // the GPU session opens the same device
  if (!cuda_context_open(&w->ctx, w->env.local_rank, err, sizeof err)) {
    char msg[800];
    snprintf(msg, sizeof msg, "rank %d of %d (started by %s) trains on GPU %d (LOCAL_RANK): "
             "%s", w->env.rank, w->env.world, rank_launcher_name(w->env.launcher),
             w->env.local_rank, err);
    train_world_error(w, msg);
    return false;
  }
  w->ctx_open = true;
  CommInit init = {.master_addr = w->env.master_addr, .master_port = w->env.master_port,
                   .device = w->env.local_rank, .nccl_cta_policy = w->nccl_cta_policy,
                   .nccl_max_ctas = w->nccl_max_ctas, .job = w->env.job};
  w->comm = comm_open(COMM_NCCL, w->env.rank, w->env.world, timeout_s, &init, err,
                      sizeof err);
  if (!w->comm) {
    train_world_error(w, err);
    return false;
  }
  return true;
}

bool train_world_join(TrainWorld *w, bool cuda, double timeout_s) {
  if (cuda) return join_gpus(w, timeout_s);
  if (w->env.world <= 1) return true;
  char err[600];
  if (w->env.launcher == LAUNCHER_TORCHRUN) {
    snprintf(err, sizeof err, "this process is rank %d of %d, started by torchrun's variables, "
             "but the CPU executor's ranks meet through OpenMPI: start them with `gemc launch "
             "-n %d train ...`, mpirun or srun --mpi=pmix (docs/distributed.md)", w->env.rank,
             w->env.world, w->env.world);
    train_world_error(w, err);
    return false;
  }
  w->comm = comm_open(COMM_MPI, w->env.rank, w->env.world, timeout_s, NULL, err,
                      sizeof err);
  if (!w->comm) {
    train_world_error(w, err);
    return false;
  }
  return true;
}

static TablePlacement placement_of(ShardTable s) {
  switch (s) {
    case SHARD_TABLE_WHOLE: return PLACE_TABLE;
    case SHARD_TABLE_ROW: return PLACE_ROW;
    case SHARD_TABLE_AUTO: return PLACE_AUTO;
    default: return PLACE_REPLICATE;
  }
}

DenseMode train_world_dense(const Ir *ir, bool given, DenseMode cli) {
  if (given) return cli;
  switch (ir->parallel.dense) {
    case SHARD_DENSE_ZERO1: return DENSE_ZERO1;
    case SHARD_DENSE_ZERO2: return DENSE_ZERO2;
    case SHARD_DENSE_ZERO3: return DENSE_ZERO3;
    default: return DENSE_DATA_PARALLEL;
  }
}

int64_t train_world_bucket_bytes(const Ir *ir, double cli_mb) {
  if (cli_mb > 0) return (int64_t)(cli_mb * (1 << 20));
  return ir->parallel.bucket_mb * (1 << 20);  // 0: the trainer's default
}

bool train_world_placement(TrainWorld *w, const Ir *ir, const char *spec, char *err,
                           size_t err_size) {
  w->placement = xcalloc((size_t)ir->ntensors + 1, sizeof *w->placement);
  for (int i = 0; i < ir->ntensors; i++)
    w->placement[i] = placement_of(ir->tensors[i].shard ? ir->tensors[i].shard
                                                        : ir->parallel.tables);
  if (!spec) return true;
  TablePlacement all;
  if (table_placement_parse(spec, &all)) {
    for (int i = 0; i < ir->ntensors; i++) w->placement[i] = all;
    return true;
  }
  char *copy = xstrdup(spec), *save = NULL;
  bool ok = true;
  for (char *item = strtok_r(copy, ",", &save); ok && item; item = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(item, '=');
    TablePlacement p;
    if (!eq || !table_placement_parse(eq + 1, &p)) {
      snprintf(err, err_size, "--shard needs row, table, replicate or auto, or TABLE=PLACE,... "
               "with one of those; got '%s'", item);
      ok = false;
      break;
    }
    *eq = '\0';
    int t = ir_find_tensor(ir, item);
    if (t < 0 || ir->tensors[t].kind != TENSOR_TABLE) {
      char names[512] = "";
      for (int i = 0; i < ir->ntensors; i++)
        if (ir->tensors[i].kind == TENSOR_TABLE && strlen(names) + 64 < sizeof names)
          snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                   names[0] ? ", " : "", ir->tensors[i].name);
      snprintf(err, err_size, "--shard: model %s has no table '%s' (its tables: %s)", ir->model,
               item, names);
      ok = false;
      break;
    }
    w->placement[t] = p;
  }
  free(copy);
  return ok;
}

bool train_world_summary(TrainWorld *w, Trainer *t, DistSummary *s, bool print) {
  char err[400];
  if (!trainer_dist_summary(t, s, err, sizeof err)) {
    train_world_error(w, err);
    return false;
  }
  if (!print) return true;
  printf("  distributed: %d ranks (%s), dense %s in %d bucket%s; tables:\n%s\n", s->world,
         s->backend, s->dense_mode, s->buckets, s->buckets == 1 ? "" : "s", s->placement);
  printf("  step %.3f ms: compute %.3f ms, exposed communication %.3f ms; straggler spread "
         "%.3f (max/min rank compute)\n", 1e3 * s->step_s, 1e3 * s->compute_s,
         1e3 * s->exposed_comm_s, s->straggler_spread);
  printf("  Local MFU %.4f%%  Scaling Ratio %.3f  E2E MFU %.4f%%; dense %s >= %.3f "
         "GB/s bus bandwidth", 100 * s->local_mfu, s->scaling_ratio, 100 * s->e2e_mfu,
         s->dense_collective, s->allreduce_gbps);
  if (s->alltoall_gbps > 0) printf("; tables' all-to-all %.3f GB/s", s->alltoall_gbps);
  printf("\n  peak memory of a rank: %.1f MiB\n", s->max_rss_mib);
  fflush(stdout);
  return true;
}

int train_world_leave(TrainWorld *w, int rc, bool together) {
  if (w->comm && rc != 0 && !together) {
    fflush(stdout);
    fflush(stderr);
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    comm_abort(w->comm, rc);
  }
  comm_close(w->comm);
  if (w->ctx_open) cuda_context_close(&w->ctx);
  w->ctx_open = false;
  free(w->placement);
  w->comm = NULL;
  w->placement = NULL;
  return rc;
}
