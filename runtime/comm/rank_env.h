// rank_env.h: where this process stands in a distributed launch, read from the environment of
// the launcher that started it (docs/distributed.md):
//   - torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
//   - OpenMPI's mpirun: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK;
//   - Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and the first host of
//     SLURM_JOB_NODELIST as the master (MASTER_ADDR and MASTER_PORT win when set).
// The first convention whose rank and world size are both set is the one read; none set is a
// single process. Malformed or inconsistent values are an error, never a guess.
// defines: RankLauncher, RankEnv, rank_env_read, rank_launcher_name, slurm_first_host
#ifndef GEMC_RANK_ENV_H
#define GEMC_RANK_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum RankLauncher {
  LAUNCHER_NONE,      // a single process started by hand
  LAUNCHER_TORCHRUN,  // torchrun, or `gemc launch`, which sets the same variables
  LAUNCHER_MPI,       // OpenMPI's mpirun
  LAUNCHER_SLURM,     // srun
} RankLauncher;

typedef struct RankEnv {
  RankLauncher launcher;
  int rank, world, local_rank;
  char master_addr[256];  // "" when the launcher gave none
  int master_port;        // 0 when the launcher gave none
  uint64_t job;           // a hash of the job's id (GEMC_JOB_ID, else torchrun's
                          // TORCHELASTIC_RUN_ID, else Slurm's SLURM_JOB_ID.SLURM_STEP_ID);
                          // 0 when none is set. The rendezvous meets only its own job.
} RankEnv;

// The environment as `get(name, ctx)` returns it (NULL: unset); getenv through a wrapper in
// the trainer, a table in the tests. False with a message naming the variable in `err`.
typedef const char *(*EnvGet)(const char *name, void *ctx);
bool rank_env_read(RankEnv *e, EnvGet get, void *ctx, char *err, size_t err_size);

const char *rank_launcher_name(RankLauncher l);

// The first host of a Slurm node list ("gpu[003-006,9],login1" -> "gpu003"); false when the
// list is empty, malformed or the name longer than out_size - 1.
bool slurm_first_host(const char *list, char *out, size_t out_size);

#endif
