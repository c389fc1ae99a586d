// cmd_launch.c: `gemc launch`, which starts the ranks of a distributed run on this node
// (docs/distributed.md).
//   - The CPU executor's ranks meet through OpenMPI, so for `train` on the cpu backend it runs
//     `mpirun -n N gemc train ...` (--via mpirun).
//   - Otherwise (the cuda backend, or any program after `--`) it starts the N processes itself
//     with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//     MASTER_ADDR, MASTER_PORT) and watches them, as torchrun does: when one fails, the others
//     get SIGTERM (SIGKILL 10 s later), and launch returns the failed rank's exit code
//     (128 + N for a signal).
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "checked.h"
#include "commands.h"
#include "cuda_driver.h"     // defines: cuda_usable
#include "internal_error.h"  // defines: GEMC_EXIT_*

enum { MAX_LOCAL_RANKS = 1024, MAX_NODES = 65536, DEFAULT_MASTER_PORT = 29500,
       KILL_GRACE_S = 10 };

static const char launch_usage[] =
    "usage: gemc launch -n N [--nnodes M --node-rank R] [--master HOST:PORT]\n"
    "                   [--via mpirun|env] train FILE [train options]\n"
    "       gemc launch -n N [...] -- PROGRAM [ARGS]\n";

static void print_launch_help(FILE *out) {
  fprintf(out,
          "gemc launch: start the ranks of a distributed run on this node\n"
          "\n%s\n"
          "  -n N, --nproc-per-node N   ranks on this node (1 to %d)\n"
          "  --nnodes M                 nodes in the run (default 1); with --node-rank R,\n"
          "                             this node's ranks are R*N .. R*N+N-1\n"
          "  --master HOST:PORT         where rank 0 listens (default 127.0.0.1:%d)\n"
          "  --via mpirun|env           how the ranks meet: through OpenMPI's mpirun (the\n"
          "                             default for `train` on the cpu backend, whose ranks\n"
          "                             need MPI), or started here with torchrun's variables\n"
          "                             (the default otherwise)\n"
          "\n"
          "When a rank fails, the others are stopped and launch exits with that rank's code.\n"
          "Only rank 0 prints the learning curve and writes the report (docs/distributed.md).\n",
          launch_usage, MAX_LOCAL_RANKS, DEFAULT_MASTER_PORT);
}

#define usage(...) cli_usage_error(stderr, launch_usage, "launch", __VA_ARGS__)

typedef struct LaunchCli {
  int64_t nproc, nnodes, node_rank;
  char master_addr[256];
  int64_t master_port;
  const char *via;     // "mpirun", "env" or NULL (decided)
  char **program;      // after `--`, NULL-terminated; NULL for train
  char **train_args;   // the words after `train`
  int ntrain;
} LaunchCli;

static bool parse_master(const char *v, LaunchCli *c) {
  const char *colon = strrchr(v, ':');
  if (!colon || colon == v || (size_t)(colon - v) >= sizeof c->master_addr) return false;
  char msg[256];
  if (!cli_parse_count("--master PORT", colon + 1, 1, 65535, &c->master_port, msg, sizeof msg))
    return false;
  memcpy(c->master_addr, v, (size_t)(colon - v));
  c->master_addr[colon - v] = '\0';
  return true;
}

// Returns 1 to run, 0 after a usage error, 2 after --help.
static int parse_launch(const CliOptions *o, LaunchCli *c) {
  memset(c, 0, sizeof *c);
  c->nnodes = 1;
  c->master_port = DEFAULT_MASTER_PORT;
  snprintf(c->master_addr, sizeof c->master_addr, "127.0.0.1");
  bool node_rank_given = false;
  for (int i = 0; i < o->nrest; i++) {
    const char *arg = o->rest[i], *v = NULL;
    char msg[256];
    int got;
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return 2;
    if (strcmp(arg, "--") == 0) {
      if (i + 1 >= o->nrest) return usage("'--' needs a PROGRAM after it"), 0;
      c->program = o->rest + i + 1;
      break;
    }
    if (strcmp(arg, "train") == 0) {
      c->train_args = o->rest + i + 1;
      c->ntrain = o->nrest - i - 1;
      break;
    }
    if ((got = cli_option_value(o->nrest, o->rest, &i, "-n", &v)) != 0 ||
        (got = cli_option_value(o->nrest, o->rest, &i, "--nproc-per-node", &v)) != 0) {
      if (got < 0 || !cli_parse_count("-n", v, 1, MAX_LOCAL_RANKS, &c->nproc, msg, sizeof msg))
        return usage("-n needs the ranks on this node, a whole number in [1, %d]",
                     MAX_LOCAL_RANKS), 0;
    } else if ((got = cli_option_value(o->nrest, o->rest, &i, "--nnodes", &v)) != 0) {
      if (got < 0 || !cli_parse_count("--nnodes", v, 1, MAX_NODES, &c->nnodes, msg, sizeof msg))
        return usage("--nnodes needs a whole number in [1, %d]", MAX_NODES), 0;
    } else if ((got = cli_option_value(o->nrest, o->rest, &i, "--node-rank", &v)) != 0) {
      if (got < 0 || !cli_parse_count("--node-rank", v, 0, MAX_NODES - 1, &c->node_rank, msg,
                                      sizeof msg))
        return usage("--node-rank needs a whole number in [0, %d]", MAX_NODES - 1), 0;
      node_rank_given = true;
    } else if ((got = cli_option_value(o->nrest, o->rest, &i, "--master", &v)) != 0) {
      if (got < 0 || !parse_master(v, c))
        return usage("--master needs HOST:PORT with a port in [1, 65535], got '%s'",
                     got < 0 ? "" : v), 0;
    } else if ((got = cli_option_value(o->nrest, o->rest, &i, "--via", &v)) != 0) {
      if (got < 0 || (strcmp(v, "mpirun") != 0 && strcmp(v, "env") != 0))
        return usage("--via needs mpirun or env, got '%s'", got < 0 ? "" : v), 0;
      c->via = v;
    } else {
      return usage("unknown option '%s' for 'gemc launch' (the command to launch, `train` or "
                   "`-- PROGRAM`, comes after launch's own options)", arg), 0;
    }
  }
  if (c->nproc == 0) return usage("'gemc launch' needs -n N, the ranks on this node"), 0;
  if (!c->program && !c->train_args) return usage("'gemc launch' needs `train FILE ...` or "
                                                  "`-- PROGRAM ...` to launch"), 0;
  if (c->node_rank >= c->nnodes)
    return usage("--node-rank %" PRId64 " is not below --nnodes %" PRId64, c->node_rank,
                 c->nnodes), 0;
  if (c->nnodes > 1 && !node_rank_given)
    return usage("--nnodes %" PRId64 " needs --node-rank R on each node", c->nnodes), 0;
  if (c->nproc * c->nnodes > (1 << 20))
    return usage("-n x --nnodes is more than %d ranks", 1 << 20), 0;
  return 1;
}

// The backend `train` will pick: what its --backend says; else, with several ranks, the CPU
// (GPU ranks are asked for with --backend cuda), and for one rank whether a GPU is usable.
static bool train_on_cpu(const LaunchCli *c) {
  for (int i = 0; i < c->ntrain; i++) {
    const char *a = c->train_args[i];
    if (strncmp(a, "--artifact", 10) == 0) return false;  // an artifact's kernels need a GPU
    const char *v = strncmp(a, "--backend=", 10) == 0 ? a + 10
                    : strcmp(a, "--backend") == 0 && i + 1 < c->ntrain ? c->train_args[i + 1]
                                                                       : NULL;
    if (v && strcmp(v, "auto") != 0) return strcmp(v, "cpu") == 0;
  }
  if (c->nproc * c->nnodes > 1) return true;
  char err[256];
  return !cuda_usable(err, sizeof err);
}

static bool self_path(char *buf, size_t size) {
  ssize_t n = readlink("/proc/self/exe", buf, size - 1);
  if (n <= 0 || (size_t)n >= size - 1) return false;
  buf[n] = '\0';
  return true;
}

// A program on PATH, or false.
static bool on_path(const char *name) {
  const char *path = getenv("PATH");
  if (!path) return false;
  char *copy = xstrdup(path), *save = NULL;
  bool found = false;
  for (char *dir = strtok_r(copy, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", *dir ? dir : ".", name);
    found = access(full, X_OK) == 0;
  }
  free(copy);
  return found;
}

// --via mpirun: replaces this process with mpirun; returns only when that fails.
static int via_mpirun(const LaunchCli *c, const char *self) {
  if (c->nnodes > 1) {
    fprintf(stderr, "gemc: error: CPU ranks on several nodes meet through MPI's own launcher: "
            "run mpirun with a hostfile, or srun --mpi=pmix, with `gemc train` "
            "(docs/distributed.md)\n");
    return GEMC_EXIT_USAGE;
  }
  if (!on_path("mpirun")) {
    fprintf(stderr, "gemc: error: the CPU executor's ranks meet through OpenMPI, and mpirun is "
            "not on PATH; on Debian or Ubuntu: apt-get install openmpi-bin\n");
    return GEMC_EXIT_USER_ERROR;
  }
  char n[32];
  snprintf(n, sizeof n, "%" PRId64, c->nproc);
  char **argv = xcalloc((size_t)c->ntrain + 16, sizeof *argv);
  int k = 0;
  argv[k++] = "mpirun";
  argv[k++] = "-n";
  argv[k++] = n;
  argv[k++] = "--oversubscribe";  // more ranks than cores is a correct run, only slower
  argv[k++] = "--bind-to";
  argv[k++] = "none";
  if (geteuid() == 0) argv[k++] = "--allow-run-as-root";
  argv[k++] = xstrdup(self);
  argv[k++] = "train";
  for (int i = 0; i < c->ntrain; i++) argv[k++] = c->train_args[i];
  fflush(stdout);
  execvp("mpirun", argv);
  fprintf(stderr, "gemc: error: cannot run mpirun: %s\n", strerror(errno));
  free(argv);
  return GEMC_EXIT_USER_ERROR;
}

static pid_t *children;
static int nchildren;
static volatile sig_atomic_t stop_signal;

static void forward_signal(int sig) { stop_signal = sig; }

static void signal_all(int sig, const bool *done) {
  for (int i = 0; i < nchildren; i++)
    if (!done[i] && children[i] > 0) kill(children[i], sig);
}

static int code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return GEMC_EXIT_USER_ERROR;
}

static void set_env_int(const char *name, int64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRId64, v);
  setenv(name, buf, 1);
}

// --via env: starts the ranks and watches them.
static int via_env(const LaunchCli *c, char **argv) {
  int64_t world = c->nproc * c->nnodes;
  nchildren = (int)c->nproc;
  children = xcalloc((size_t)nchildren, sizeof *children);
  bool *done = xcalloc((size_t)nchildren, sizeof *done);
  struct sigaction sa = {.sa_handler = forward_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  fflush(stdout);
  fflush(stderr);
  // One node's ranks are this launch's alone: a job id of its own keeps another job on the
  // same MASTER_PORT out of the rendezvous (several nodes share whatever id the user set).
  if (c->nnodes == 1 && !getenv("GEMC_JOB_ID")) {
    char id[64];
    snprintf(id, sizeof id, "launch-%ld-%ld", (long)getpid(), (long)time(NULL));
    setenv("GEMC_JOB_ID", id, 1);
  }
  for (int i = 0; i < nchildren; i++) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "gemc: error: cannot start rank %d: %s\n", i, strerror(errno));
      nchildren = i;  // the ones started: stopped and reaped
      signal_all(SIGTERM, done);
      for (int k = 0; k < nchildren; k++) waitpid(children[k], NULL, 0);
      free(done);
      free(children);
      return GEMC_EXIT_USER_ERROR;
    }
    if (pid == 0) {
      set_env_int("RANK", c->node_rank * c->nproc + i);
      set_env_int("LOCAL_RANK", i);
      set_env_int("WORLD_SIZE", world);
      set_env_int("LOCAL_WORLD_SIZE", c->nproc);
      set_env_int("GROUP_RANK", c->node_rank);
      setenv("MASTER_ADDR", c->master_addr, 1);
      set_env_int("MASTER_PORT", c->master_port);
      execvp(argv[0], argv);
      fprintf(stderr, "gemc: error: rank %d: cannot run %s: %s\n", i, argv[0], strerror(errno));
      _exit(127);
    }
    children[i] = pid;
  }
  int left = nchildren, rc = 0, failed = -1;
  time_t stopping_since = 0;
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int i = 0; i < nchildren; i++) {
        if (children[i] != pid) continue;
        done[i] = true;
        left--;
        // After a forwarded signal the ranks' codes are its echo; launch reports the signal.
        if (code_of(status) != 0 && failed < 0 && !stop_signal) {
          failed = i;
          rc = code_of(status);
          fprintf(stderr, "gemc: launch: rank %" PRId64 " exited with status %d; stopping the "
                  "other ranks\n", c->node_rank * c->nproc + i, rc);
          signal_all(SIGTERM, done);
          stopping_since = time(NULL);
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (stop_signal && !stopping_since) {
      signal_all(stop_signal, done);
      stopping_since = time(NULL);
      if (!rc) rc = 128 + stop_signal;
    }
    if (stopping_since && time(NULL) - stopping_since > KILL_GRACE_S) signal_all(SIGKILL, done);
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
  free(done);
  free(children);
  return rc;
}

int cmd_launch(const CliOptions *o) {
  LaunchCli c;
  int parsed = parse_launch(o, &c);
  if (parsed == 2) {
    print_launch_help(stdout);
    return GEMC_EXIT_OK;
  }
  if (parsed == 0) return GEMC_EXIT_USAGE;
  char self[4096];
  if (!self_path(self, sizeof self)) {
    fprintf(stderr, "gemc: error: cannot find the gemc binary (/proc/self/exe)\n");
    return GEMC_EXIT_USER_ERROR;
  }
  const char *via = c.via ? c.via : c.train_args && train_on_cpu(&c) ? "mpirun" : "env";
  if (strcmp(via, "mpirun") == 0) {
    if (c.program) {
      fprintf(stderr, "gemc: error: --via mpirun launches `train`; run other programs with "
              "mpirun itself\n");
      return GEMC_EXIT_USAGE;
    }
    return via_mpirun(&c, self);
  }
  if (c.program) return via_env(&c, c.program);
  char **argv = xcalloc((size_t)c.ntrain + 3, sizeof *argv);
  argv[0] = self;
  argv[1] = "train";
  for (int i = 0; i < c.ntrain; i++) argv[2 + i] = c.train_args[i];
  int rc = via_env(&c, argv);
  free(argv);
  return rc;
}
