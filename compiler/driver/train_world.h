// train_world.h: the distributed side of `gemc train` (docs/distributed.md): the world a
// launcher started this process in, the --dense and --shard options, and the run's
// distributed numbers.
// defines: TrainWorld, train_world_*
#ifndef GEMC_TRAIN_WORLD_H
#define GEMC_TRAIN_WORLD_H

#include <stdbool.h>
#include <stdio.h>

#include "comm.h"
#include "cuda_driver.h"
#include "ir.h"
#include "rank_env.h"
#include "train.h"

typedef struct TrainWorld {
  RankEnv env;
  Comm *comm;                // NULL: a world of one
  TablePlacement *placement; // [ir->ntensors], NULL: every table replicated
  char prefix[32];           // "rank 1: " in a world of several, else ""
  CudaContext ctx;           // GPU ranks: device LOCAL_RANK, current while NCCL runs
  bool ctx_open;
  CommCtaPolicy nccl_cta_policy;  // GPU ranks: --nccl-cta-policy, --nccl-max-ctas
  int nccl_max_ctas;
} TrainWorld;

// Reads the launcher's environment. False (message printed) when it is malformed.
bool train_world_read(TrainWorld *w);
// Joins the world: the CPU executor's ranks (a world of several) meet through OpenMPI
// (mpirun, `gemc launch`, srun --mpi=pmix); GPU ranks of any world a launcher started meet
// through NCCL, each on GPU LOCAL_RANK. False, with a message printed, when this world cannot
// train: a launcher MPI cannot join, a missing GPU, a rendezvous that failed.
bool train_world_join(TrainWorld *w, bool cuda, double timeout_s);
// Each table's placement: --shard SPEC ("row", "table", "replicate" or "auto" for every
// table, or "NAME=PLACE,..." for those named), else the table's `shard` attribute, else the
// model's `parallel { tables ...; }`, else replicated. False with a message in err.
bool train_world_placement(TrainWorld *w, const Ir *ir, const char *spec, char *err,
                           size_t err_size);
// The dense mode: --dense when given (*given), else the model's `parallel { dense ...; }`,
// else data parallel; the bucket size likewise (bytes).
DenseMode train_world_dense(const Ir *ir, bool given, DenseMode cli);
int64_t train_world_bucket_bytes(const Ir *ir, double cli_mb);
bool train_world_rank0(const TrainWorld *w);
// Prints "gemc: rank R: error: MSG" (or "gemc: error: MSG" alone).
void train_world_error(const TrainWorld *w, const char *msg);
// The distributed numbers, printed by rank 0 (a collective: every rank calls it).
bool train_world_summary(TrainWorld *w, Trainer *t, DistSummary *out, bool print);
// Leaves the world and returns rc. A rank that fails alone (rc != 0, !together) in a world of
// several ends the whole job (comm_abort, after a short pause so that its message is out)
// rather than leaving the others to wait for it until --comm-timeout. A failure every rank
// decided together (trainer_failed_together) leaves normally on every rank.
int train_world_leave(TrainWorld *w, int rc, bool together);

#endif
