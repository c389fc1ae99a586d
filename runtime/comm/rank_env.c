// rank_env.c: the launchers' environment conventions of rank_env.h.
#include "rank_env.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_WORLD = 1 << 20 };

const char *rank_launcher_name(RankLauncher l) {
  switch (l) {
    case LAUNCHER_TORCHRUN: return "torchrun";
    case LAUNCHER_MPI: return "mpirun";
    case LAUNCHER_SLURM: return "srun";
    default: return "none";
  }
}

// A decimal integer in [lo, hi], the whole string; else an error naming the variable.
static bool parse_int(const char *name, const char *text, long lo, long hi, int *out, char *err,
                      size_t err_size) {
  char *end = NULL;
  errno = 0;
  long v = text && *text ? strtol(text, &end, 10) : 0;
  if (!text || !*text || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
    snprintf(err, err_size, "%s=\"%s\" is not an integer in [%ld, %ld]", name, text ? text : "",
             lo, hi);
    return false;
  }
  *out = (int)v;
  return true;
}

bool slurm_first_host(const char *list, char *out, size_t out_size) {
  if (!list || !*list || out_size == 0) return false;
  size_t n = 0;
  const char *p = list;
  // The host's name up to a ',' or a '['.
  while (*p && *p != ',' && *p != '[') {
    if (n + 1 >= out_size) return false;
    out[n++] = *p++;
  }
  if (*p == '[') {  // the first index of the range list: digits up to '-', ',' or ']'
    p++;
    size_t digits = 0;
    while (*p >= '0' && *p <= '9') {
      if (n + 1 >= out_size) return false;
      out[n++] = *p++, digits++;
    }
    if (digits == 0 || (*p != '-' && *p != ',' && *p != ']')) return false;
    const char *close = strchr(p, ']');
    if (!close) return false;
    for (p = close + 1; *p && *p != ','; p++) {  // a suffix after the brackets
      if (*p == '[' || n + 1 >= out_size) return false;
      out[n++] = *p;
    }
  }
  if (n == 0) return false;
  out[n] = '\0';
  return true;
}

// Reads one convention's three variables; false when its rank or world size is unset.
static bool read_triple(const char *rank_var, const char *world_var, const char *local_var,
                        EnvGet get, void *ctx, RankEnv *e, bool *bad, char *err,
                        size_t err_size) {
  const char *rank = get(rank_var, ctx), *world = get(world_var, ctx);
  if (!rank && !world) return false;
  *bad = true;
  if (!rank || !world) {
    snprintf(err, err_size, "%s is set but %s is not", rank ? rank_var : world_var,
             rank ? world_var : rank_var);
    return true;
  }
  if (!parse_int(world_var, world, 1, MAX_WORLD, &e->world, err, err_size) ||
      !parse_int(rank_var, rank, 0, e->world - 1, &e->rank, err, err_size))
    return true;
  const char *local = get(local_var, ctx);
  e->local_rank = e->rank;  // a single node when the launcher says nothing
  if (local && !parse_int(local_var, local, 0, e->world - 1, &e->local_rank, err, err_size))
    return true;
  *bad = false;
  return true;
}

// FNV-1a of the job's id, so that two jobs on one MASTER_PORT do not meet.
static uint64_t job_token(EnvGet get, void *ctx) {
  char id[512] = "";
  const char *v = get("GEMC_JOB_ID", ctx);
  if (!v || !*v) v = get("TORCHELASTIC_RUN_ID", ctx);
  if (v && *v) {
    snprintf(id, sizeof id, "%s", v);
  } else if ((v = get("SLURM_JOB_ID", ctx)) && *v) {
    const char *step = get("SLURM_STEP_ID", ctx);
    snprintf(id, sizeof id, "slurm %s.%s", v, step ? step : "");
  } else {
    return 0;
  }
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *p = id; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  return h ? h : 1;
}

bool rank_env_read(RankEnv *e, EnvGet get, void *ctx, char *err, size_t err_size) {
  memset(e, 0, sizeof *e);
  e->world = 1;
  static const struct {
    RankLauncher launcher;
    const char *rank, *world, *local;
  } conventions[] = {
      {LAUNCHER_TORCHRUN, "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {LAUNCHER_MPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {LAUNCHER_SLURM, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
  };
  for (size_t i = 0; i < sizeof conventions / sizeof conventions[0]; i++) {
    bool bad = false;
    if (!read_triple(conventions[i].rank, conventions[i].world, conventions[i].local, get, ctx, e,
                     &bad, err, err_size))
      continue;
    if (bad) return false;
    e->launcher = conventions[i].launcher;
    break;
  }
  if (e->launcher == LAUNCHER_NONE) {
    e->world = 1;
    return true;
  }
  const char *addr = get("MASTER_ADDR", ctx), *port = get("MASTER_PORT", ctx);
  if (addr && *addr) {
    if (strlen(addr) >= sizeof e->master_addr) {
      snprintf(err, err_size, "MASTER_ADDR is longer than %zu characters",
               sizeof e->master_addr - 1);
      return false;
    }
    strcpy(e->master_addr, addr);
  } else if (e->launcher == LAUNCHER_SLURM) {
    const char *list = get("SLURM_JOB_NODELIST", ctx);
    if (list && !slurm_first_host(list, e->master_addr, sizeof e->master_addr)) {
      snprintf(err, err_size, "SLURM_JOB_NODELIST=\"%s\" is not a node list gemc can read", list);
      return false;
    }
  }
  if (port && !parse_int("MASTER_PORT", port, 1, 65535, &e->master_port, err, err_size))
    return false;
  e->job = job_token(get, ctx);
  return true;
}
