// cmd_train.c: `gemc train FILE`. Parses the train options, compiles the model with its
// backward graph, picks the backend, and runs the training loop (runtime/train/train_loop.c) with
// its learning curve, checkpoints and JSON report. docs/train.md documents every option.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"        // defines: cmd_train
#include "checkpoint.h"      // defines: CHECKPOINT_LOCK
#include "cuda_driver.h"     // defines: cuda_usable
#include "file_io.h"         // defines: file_probe_output, file_lock_dir
#include "internal_error.h"  // defines: GEMC_EXIT_*
#include "load_model.h"      // defines: LoadedModel, load_model
#include "rank_env.h"        // defines: RankEnv, rank_env_read
#include "report_json.h"     // defines: ReportRun, report_write_json
#include "train.h"           // defines: Trainer, TrainOptions, train_loop
#include "jit_cache.h"       // defines: jit_cache_dir
#include "tune.h"            // defines: TuneOptions, tune_model
#include "train_world.h"     // defines: TrainWorld, train_world_*

enum { DEFAULT_STEPS = 100, DEFAULT_PROFILE_STEPS = 5, MAX_PROFILE_STEPS = 1000 };

typedef enum Backend { BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA } Backend;

// Everything `gemc train` was asked for.
typedef struct TrainCli {
  const char *file;
  Backend backend;
  int64_t steps;
  int64_t eval_every;  // -1: a tenth of the steps
  int64_t save_every;
  const char *report, *save, *resume;
  bool seed_given, eval_examples_given, quiet, werror;
  bool no_tune;        // --no-tune: the compiler's schedules, not the autotuner's
  int64_t profile;     // --profile[=N]: steps to time launch by launch (0: none)
  int live;            // --progress: -1 auto, 0 plain, 1 live
  const char *arch;
  const char *dense, *shard;  // --dense, --shard (distributed)
  double bucket_mb;           // --bucket-mb; 0: the default
  double comm_timeout;        // --comm-timeout seconds
  const char *cta_policy;     // --nccl-cta-policy (GPU ranks)
  int64_t max_ctas;           // --nccl-max-ctas (GPU ranks); 0: NCCL's choice
  TrainOptions opt;
} TrainCli;

enum { DEFAULT_COMM_TIMEOUT_S = 300, MAX_BUCKET_MB = 4096, MAX_NCCL_CTAS = 64 };

// The world this process trains in (train_world.h): rank 0 alone prints and writes.
static TrainWorld world;

static const char train_usage[] =
    "usage: gemc train FILE [--backend cpu|cuda|auto] [--steps N] [--batch B] [--seed S]\n"
    "                  [--data PATH] [--eval-every N] [--eval-examples N] [--report FILE.json]\n"
    "                  [--save DIR] [--save-every N] [--resume DIR] [--quiet]\n"
    "                  [--lr X] [--beta1 X] [--beta2 X] [--eps X] [--weight-decay X]\n"
    "                  [--table-lr X] [--table-eps X] [--lengths uniform|lognormal|heavy]\n"
    "                  [--id-vocab N] [--progress auto|live|plain] [--artifact FILE.gemb]\n"
    "                  [--on-nan stop|skip|skip=N] [--no-tune] [--profile[=N]]\n"
    "                  [--dense data-parallel|zero1|zero2|zero3] [--shard SPEC] [--bucket-mb X]\n"
    "                  [--comm-timeout S] [--nccl-cta-policy P] [--nccl-max-ctas N]\n";

static void print_train_help(FILE *out) {
  fprintf(out,
          "gemc train: train a model on synthetic data or a data file\n"
          "\n%s\n"
          "  --backend B        cpu, cuda or auto (default auto: the GPU when one is usable,\n"
          "                     else the CPU executor)\n"
          "  --artifact F.gemb  cuda: the kernels of a `gemc build` artifact (no NVRTC)\n"
          "  --no-tune          cuda: keep the compiler's attention schedules; by default the\n"
          "                     autotuner picks each unhinted node's from its cache, timing\n"
          "                     the candidates on a miss (docs/tuning.md, gemc tune)\n"
          "  --steps N          optimizer steps to take in this run (default %d); with --resume,\n"
          "                     N more steps\n"
          "  --batch B          examples per step (default: the model's batch)\n"
          "  --seed S           parameter initialization and synthetic data (default 1)\n"
          "  --data PATH        train on a data file (gemc data convert); the last tenth is\n"
          "                     held out. Without it: synthetic data from a hidden teacher\n"
          "  --eval-every N     evaluate on the held-out split every N steps (default: a tenth\n"
          "                     of the steps; 0: only at the end); each is a learning-curve row\n"
          "  --eval-examples N  synthetic held-out examples (default 4096, whatever --steps;\n"
          "                     rounded up to whole batches)\n"
          "  --report F.json    write the final metrics, the curve and every step's loss\n"
          "  --save DIR         write a checkpoint to DIR/checkpoint.gemc at the end\n"
          "  --save-every N     and every N steps\n"
          "  --resume DIR       continue from DIR/checkpoint.gemc (bit-exactly on the same backend)\n"
          "  --quiet, -q        print errors only\n"
          "  --progress P       auto (a live line on a terminal), live or plain\n"
          "  --profile[=N]      cuda: time N steps (default 5, after up to 10 warm-up steps)\n"
          "                     launch by launch, each as one CUDA graph, and print the kernels\n"
          "                     by time with their FLOPs, bytes and roofline (also in --report);\n"
          "                     those steps are left out of the step time\n"
          "  --on-nan A         a non-finite loss: stop (default: exit 1, naming the step and\n"
          "                     the tensor) or skip=N (skip such steps without their update;\n"
          "                     N in a row stop it; skip alone: N=%d)\n"
          "distributed (several ranks: gemc launch, mpirun or srun; docs/distributed.md):\n"
          "  --dense M          dense parameters: data-parallel (default), zero1 (sharded\n"
          "                     optimizer state), zero2 (and sharded gradients) or zero3\n"
          "                     (and sharded parameters, gathered per layer; CPU ranks)\n"
          "  --shard SPEC       tables: replicate (default), table, row or auto for all, or\n"
          "                     NAME=PLACE,... per table (auto: row-wise from 2^20 rows)\n"
          "  --bucket-mb X      dense gradients are reduced in buckets of X MiB (default 25)\n"
          "  --comm-timeout S   a collective not done in S seconds aborts every rank\n"
          "                     (default 300)\n"
          "  --nccl-cta-policy P  GPU ranks: the SMs NCCL's kernels take: default (NCCL's\n"
          "                     choice), bandwidth, efficiency, or zero (copy engines)\n"
          "  --nccl-max-ctas N  GPU ranks: at most N CTAs (SMs) per NCCL collective\n"
          "optimizer overrides (the model's values otherwise):\n"
          "  --lr X, --beta1 X, --beta2 X, --eps X, --weight-decay X   dense parameters\n"
          "  --table-lr X, --table-eps X                               every table\n"
          "synthetic data:\n"
          "  --lengths D        history lengths: uniform, lognormal (default) or heavy\n"
          "  --id-vocab N       draw ids from the first N rows of each table (default: all)\n"
          "\n"
          "docs/train.md describes the output, the report, checkpoints and the metrics;\n"
          "docs/cli.md the range of every numeric option.\n",
          train_usage, DEFAULT_STEPS, DEFAULT_ON_NAN_SKIPS);
}

#define usage(err, ...) cli_usage_error(err, train_usage, "train", __VA_ARGS__)

// The ranges of the numeric options (docs/cli.md's table): wide enough for any real run,
// narrow enough that a typo cannot start one that runs for ever.
enum { MAX_STEPS = 1000000000, MAX_BATCH = 1 << 20, MAX_EVAL_EXAMPLES = 1 << 20 };
#define MAX_ID_VOCAB INT64_C(2147483647)  // the most rows a table may have (sema)

// The optimizer overrides: each names the field it sets and the range it allows.
typedef struct RealOption {
  const char *name;
  size_t offset;  // into OptimOverrides
  RealRange range;
} RealOption;

static const RealOption real_options[] = {
    {"--lr", offsetof(OptimOverrides, lr), {0, 1e6, true, false}},
    {"--beta1", offsetof(OptimOverrides, beta1), {0, 1, false, true}},
    {"--beta2", offsetof(OptimOverrides, beta2), {0, 1, false, true}},
    {"--eps", offsetof(OptimOverrides, eps), {0, 1, true, false}},
    {"--weight-decay", offsetof(OptimOverrides, weight_decay), {0, 1e3, false, false}},
    {"--table-lr", offsetof(OptimOverrides, table_lr), {0, 1e6, true, false}},
    {"--table-eps", offsetof(OptimOverrides, table_eps), {0, 1, true, false}},
};

// The whole-number options: name, field, range.
typedef struct CountOption {
  const char *name;
  int64_t *field;
  int64_t min, max;
} CountOption;

// --- parsing ----------------------------------------------------------------------------

static bool parse_backend(const char *v, Backend *out) {
  if (strcmp(v, "auto") == 0) *out = BACKEND_AUTO;
  else if (strcmp(v, "cpu") == 0) *out = BACKEND_CPU;
  else if (strcmp(v, "cuda") == 0) *out = BACKEND_CUDA;
  else return false;
  return true;
}

// Tries the options that take a value at argv[*i]. Returns 1 when one matched (and was
// valid), 0 when none did, -1 after a usage error.
static int parse_valued(TrainCli *c, int argc, char **argv, int *i, FILE *err) {
  const char *v = NULL;
  int got;
  char msg[256], range[80];
  const CountOption counts[] = {
      {"--steps", &c->steps, 0, MAX_STEPS},
      {"--batch", &c->opt.batch, 1, MAX_BATCH},
      {"--eval-every", &c->eval_every, 0, MAX_STEPS},
      {"--eval-examples", &c->opt.eval_examples, 1, MAX_EVAL_EXAMPLES},
      {"--save-every", &c->save_every, 0, MAX_STEPS},
      {"--id-vocab", &c->opt.id_vocab, 1, MAX_ID_VOCAB},
  };
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    const CountOption *n = &counts[k];
    if ((got = cli_option_value(argc, argv, i, n->name, &v)) == 0) continue;
    if (got < 0)
      return (usage(err, "%s needs a value: a whole number in %s", n->name,
                    cli_count_range(n->min, n->max, range, sizeof range)), -1);
    if (!cli_parse_count(n->name, v, n->min, n->max, n->field, msg, sizeof msg))
      return (usage(err, "%s", msg), -1);
    return 1;
  }
  for (size_t k = 0; k < sizeof real_options / sizeof real_options[0]; k++) {
    const RealOption *r = &real_options[k];
    if ((got = cli_option_value(argc, argv, i, r->name, &v)) == 0) continue;
    double x;
    if (got < 0)
      return (usage(err, "%s needs a value: a number in %s", r->name,
                    cli_real_range(r->range, range, sizeof range)), -1);
    if (!cli_parse_real(r->name, v, r->range, &x, msg, sizeof msg))
      return (usage(err, "%s", msg), -1);
    *(double *)(void *)((char *)&c->opt.optim + r->offset) = x;
    return 1;
  }
  if ((got = cli_option_value(argc, argv, i, "--bucket-mb", &v)) != 0) {
    const RealRange r = {0, MAX_BUCKET_MB, true, false};
    if (got < 0 || !cli_parse_real("--bucket-mb", v, r, &c->bucket_mb, msg, sizeof msg))
      return (usage(err, "--bucket-mb needs MiB in %s", cli_real_range(r, range,
                                                                  sizeof range)), -1);
    return 1;
  }
  if ((got = cli_option_value(argc, argv, i, "--comm-timeout", &v)) != 0) {
    const RealRange r = {0, 86400, true, false};
    if (got < 0 || !cli_parse_real("--comm-timeout", v, r, &c->comm_timeout, msg, sizeof msg))
      return (usage(err, "--comm-timeout needs seconds in %s", cli_real_range(r, range,
                                                                         sizeof range)), -1);
    return 1;
  }
  if ((got = cli_option_value(argc, argv, i, "--nccl-cta-policy", &v)) != 0) {
    CommCtaPolicy p;
    if (got < 0 || !comm_cta_policy_parse(v, &p))
      return (usage(err, "--nccl-cta-policy needs default, bandwidth, efficiency or zero, got "
                    "'%s'", got < 0 ? "" : v), -1);
    c->cta_policy = v;
    return 1;
  }
  if ((got = cli_option_value(argc, argv, i, "--nccl-max-ctas", &v)) != 0) {
    if (got < 0 || !cli_parse_count("--nccl-max-ctas", v, 1, MAX_NCCL_CTAS, &c->max_ctas, msg,
                                    sizeof msg))
      return (usage(err, "--nccl-max-ctas needs a count in [1, %d]", MAX_NCCL_CTAS), -1);
    return 1;
  }
  if ((got = cli_option_value(argc, argv, i, "--dense", &v)) != 0) {
    if (got < 0 || !dense_mode_parse(v, &c->opt.dense_mode))
      return (usage(err, "--dense needs data-parallel, zero1, zero2 or zero3, got '%s'",
                    got < 0 ? "" : v), -1);
    c->dense = v;
    return 1;
  }
  if ((got = cli_option_value(argc, argv, i, "--backend", &v)) != 0) {
    if (got < 0 || !parse_backend(v, &c->backend))
      return (usage(err, "--backend needs cpu, cuda or auto, got '%s'", got < 0 ? "" : v), -1);
    return 1;
  }
  if ((got = cli_option_value(argc, argv, i, "--seed", &v)) != 0) {
    if (got < 0)
      return (usage(err, "--seed needs a value: a whole number in [0, %" PRIu64 "]",
                    UINT64_MAX), -1);
    if (!cli_parse_u64("--seed", v, UINT64_MAX, &c->opt.seed, msg, sizeof msg))
      return (usage(err, "%s", msg), -1);
    c->seed_given = true;
    return 1;
  }
  if ((got = cli_option_value(argc, argv, i, "--lengths", &v)) != 0) {
    if (got < 0 || !synth_length_dist_from_name(v, &c->opt.lengths))
      return (usage(err, "--lengths needs uniform, lognormal or heavy, got '%s'",
                   got < 0 ? "" : v), -1);
    return 1;
  }
  if ((got = cli_option_value(argc, argv, i, "--on-nan", &v)) != 0) {
    // stop, skip (DEFAULT_ON_NAN_SKIPS in a row stop it) or skip=N (N >= 1).
    if (got < 0) v = "";
    int64_t n = 0;
    if (strcmp(v, "stop") == 0) n = 0;
    else if (strcmp(v, "skip") == 0) n = DEFAULT_ON_NAN_SKIPS;
    else if (strncmp(v, "skip=", 5) != 0 || !cli_parse_count("--on-nan skip=N", v + 5, 1,
                                                               1000000, &n, msg, sizeof msg))
      return (usage(err, "--on-nan needs stop, skip or skip=N (N in [1, 1000000]), got '%s'",
                    v), -1);
    c->opt.on_nan_skip = n;
    return 1;
  }
  if ((got = cli_option_value(argc, argv, i, "--progress", &v)) != 0) {
    if (got < 0) v = "";
    if (strcmp(v, "auto") == 0) c->live = -1;
    else if (strcmp(v, "live") == 0) c->live = 1;
    else if (strcmp(v, "plain") == 0) c->live = 0;
    else return (usage(err, "--progress needs auto, live or plain, got '%s'", v), -1);
    return 1;
  }
  const struct { const char *name; const char **field; const char *what; } paths[] = {
      {"--data", &c->opt.data_path, "a data file"},
      {"--report", &c->report, "a file name"},
      {"--save", &c->save, "a directory"},
      {"--resume", &c->resume, "a directory"},
      {"--arch", &c->arch, "sm_90a or sm_100a"},
      {"--artifact", &c->opt.artifact, "an artifact file (gemc build)"},
      {"--shard", &c->shard, "row, table, replicate, auto or TABLE=PLACE,..."},
  };
  for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++) {
    if ((got = cli_option_value(argc, argv, i, paths[k].name, &v)) == 0) continue;
    if (got < 0 || !*v) return (usage(err, "%s needs %s", paths[k].name, paths[k].what), -1);
    *paths[k].field = v;
    return 1;
  }
  return 0;
}

// Parses the words after `train`. Returns 1 to run, 0 after a usage error, 2 after --help.
static int parse_train(const CliOptions *o, TrainCli *c, FILE *err) {
  memset(c, 0, sizeof *c);
  train_options_default(&c->opt);
  c->steps = DEFAULT_STEPS;
  c->eval_every = -1;
  c->live = -1;
  c->comm_timeout = DEFAULT_COMM_TIMEOUT_S;
  c->quiet = o->quiet;
  c->werror = o->werror;
  c->arch = o->arch;
  bool lengths_given = false, only_files = false;
  for (int i = 0; i < o->nrest; i++) {
    const char *arg = o->rest[i];
    if (only_files || arg[0] != '-' || strcmp(arg, "-") == 0) {
      if (c->file) return usage(err, "'gemc train' takes one FILE (got '%s' and '%s')", c->file, arg);
      c->file = arg;
      continue;
    }
    if (strcmp(arg, "--") == 0) {
      only_files = true;
    } else if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      return 2;
    } else if (strcmp(arg, "--quiet") == 0 || strcmp(arg, "-q") == 0) {
      c->quiet = true;
    } else if (strcmp(arg, "--Werror") == 0) {
      c->werror = true;
    } else if (strcmp(arg, "--no-tune") == 0) {
      c->no_tune = true;
    } else if (strcmp(arg, "--profile") == 0) {
      c->profile = DEFAULT_PROFILE_STEPS;
    } else if (strncmp(arg, "--profile=", 10) == 0) {
      char msg[256];
      if (!cli_parse_count("--profile", arg + 10, 1, MAX_PROFILE_STEPS, &c->profile, msg,
                           sizeof msg))
        return usage(err, "%s", msg);
    } else {
      if (strncmp(arg, "--lengths", 9) == 0) lengths_given = true;
      if (strncmp(arg, "--eval-examples", 15) == 0) c->eval_examples_given = true;
      int got = parse_valued(c, o->nrest, o->rest, &i, err);
      if (got < 0) return 0;
      if (got == 0) return usage(err, "unknown option '%s' for 'gemc train'", arg);
    }
  }
  if (!c->file) return usage(err, "'gemc train' needs a model FILE");
  if (c->arch && strcmp(c->arch, "sm_90a") != 0 && strcmp(c->arch, "sm_100a") != 0)
    return usage(err, "unknown --arch '%s'; expected one of: sm_90a, sm_100a", c->arch);
  if (c->save_every > 0 && !c->save) return usage(err, "--save-every needs --save DIR");
  if (c->opt.data_path && lengths_given)
    return usage(err, "--lengths only applies to synthetic data, not to --data");
  if (c->opt.data_path && c->opt.id_vocab > 0)
    return usage(err, "--id-vocab only applies to synthetic data, not to --data");
  if (c->opt.data_path && c->eval_examples_given)
    return usage(err, "--eval-examples only applies to synthetic data; a data file holds out "
                 "its last tenth");
  if (c->eval_every < 0) c->eval_every = c->steps >= 10 ? c->steps / 10 : 0;
  return 1;
}

// --- the backend ------------------------------------------------------------------------

// Picks the backend (sets c->opt.cuda); on failure prints why and returns false.
static bool choose_backend(TrainCli *c, char *reason, size_t size) {
  char err[512] = "";
  switch (c->backend) {
  case BACKEND_CPU:
    snprintf(reason, size, "--backend cpu");
    if (c->opt.artifact) {
      fprintf(stderr, "gemc: error: --artifact needs the cuda backend, not --backend cpu\n");
      return false;
    }
    return true;
  case BACKEND_AUTO:
    // Several ranks train on the CPU executor: GPU ranks merge table gradients through the
    // host, slowly, so they are asked for (--backend cuda; docs/distributed.md).
    if (world.env.world > 1 && !c->opt.artifact) {
      snprintf(reason, size, "auto: %d ranks, which train on the CPU executor (--backend cuda "
               "for GPU ranks)", world.env.world);
      return true;
    }
    c->opt.cuda = cuda_usable(err, sizeof err);
    if (!c->opt.cuda && c->opt.artifact) {
      fprintf(stderr, "gemc: error: --artifact needs a GPU: %s\n", err);
      return false;
    }
    if (c->opt.cuda) snprintf(reason, size, "auto: a GPU is usable");
    else snprintf(reason, size, "auto: no usable GPU: %.120s", err);
    return true;
  case BACKEND_CUDA:
    if (!cuda_usable(err, sizeof err)) {
      fprintf(stderr, "gemc: error: --backend cuda: no usable GPU (%s); use --backend cpu or "
              "auto\n", err);
      return false;
    }
    c->opt.cuda = true;
    snprintf(reason, size, "--backend cuda");
    return true;
  }
  GEMC_UNREACHABLE();
}

// --- the autotuner ----------------------------------------------------------------------

// On the cuda backend (JIT, not an artifact, without --no-tune): the schedules of the GPU's
// plan, with the autotuner's winners for the attention nodes whose hints leave a choice
// (docs/tuning.md). NULL when nothing changes; a tuner that cannot run is a warning, and the
// model trains with the compiler's schedules.
static Schedule *tuned_schedules(const TrainCli *c, const Ir *ir) {
  if (!c->opt.cuda || c->no_tune || c->opt.artifact) return NULL;
  bool any = false;
  for (int i = 0; i < ir->nforward && !any; i++) any = ir->nodes[i].op == OP_ATTENTION;
  if (!any) return NULL;
  char cache[4096], err[2048];
  bool cached = jit_cache_dir(cache, sizeof cache, err, sizeof err);
  Schedule *sched = calloc((size_t)ir->nnodes + 1, sizeof *sched);
  if (!sched) return NULL;
  for (int i = 0; i < ir->nnodes; i++) sched[i] = ir->nodes[i].sched;
  TuneOptions to = {.reps = 10, .batch = c->opt.batch, .cache_dir = cached ? cache : NULL,
                    .log = c->quiet ? NULL : stdout};
  int tuned = 0;
  TuneStatus st = tune_model(ir, &to, sched, &tuned, err, sizeof err);
  fflush(stdout);
  if (st != TUNE_OK)
    fprintf(stderr, "gemc: warning: the attention autotuner did not finish (%s); training with "
            "the compiler's schedules%s\n", err, tuned ? " where it had no winner yet" : "");
  if (tuned == 0) {
    free(sched);
    return NULL;
  }
  return sched;
}

// --- output -----------------------------------------------------------------------------

static void print_optim(FILE *out, const char *what, const Optim *o) {
  fprintf(out, "%s %s lr=%g", what, optim_name(o->kind), o->lr);
  if (o->kind == OPTIM_ADAMW)
    fprintf(out, " beta1=%g beta2=%g eps=%g weight_decay=%g", o->beta1, o->beta2, o->eps,
            o->weight_decay);
}

static void print_banner(const TrainCli *c, const Trainer *t, const char *reason,
                         int64_t resumed_from) {
  int64_t tables = 0, params = trainer_param_count(t, &tables);
  printf("gemc train: model %s (%s)\n", trainer_model_name(t), c->file);
  if (trainer_device(t))
    printf("  backend  cuda (%s) on %s\n", reason, trainer_device(t));
  else
    printf("  backend  cpu (%s)\n", reason);
  printf("  params   %" PRId64 " (%" PRId64 " in tables, %" PRId64 " dense)\n", params, tables,
         params - tables);
  printf("  steps    %" PRId64, c->steps);
  if (resumed_from >= 0) printf(" more, resuming at step %" PRId64 " from %s", resumed_from, c->resume);
  printf("; batch %" PRId64 "; seed %" PRIu64 "\n", trainer_batch(t), trainer_seed(t));
  if (c->opt.data_path)
    printf("  data     %s: %" PRId64 " training examples, %" PRId64 " held out\n",
           c->opt.data_path, trainer_train_examples(t), trainer_eval_examples(t));
  else
    printf("  data     synthetic (hidden teacher, %s lengths); %" PRId64 " held-out examples\n",
           synth_length_dist_name(c->opt.lengths), trainer_eval_examples(t));
  printf("  optim    ");
  print_optim(stdout, "dense", trainer_dense_optim(t));
  printf("; tables as the model says");
  if (!isnan(c->opt.optim.table_lr)) printf(", lr=%g", c->opt.optim.table_lr);
  printf("\n");
  if (trainer_ntasks(t) > 1)
    printf("  (NE and AUC in the curve are means over the %d tasks)\n", trainer_ntasks(t));
  printf("\n");
  fflush(stdout);
}

static void print_task(const char *name, const TaskMetrics *m, double teacher_ne) {
  printf("    %-12s NE %.4f  AUC %.4f  calibration %.4f  logloss %.4f", name, m->ne, m->auc,
         m->calibration, m->logloss);
  if (!isnan(teacher_ne)) printf("  (teacher NE %.4f)", teacher_ne);
  printf("\n");
}

static void print_summary(const Trainer *t, const LoopResult *r) {
  int n = trainer_ntasks(t);
  printf("\nfinal, after step %" PRId64 ":\n", trainer_step_count(t));
  if (r->steps > 0) {
    printf("  train (last %" PRId64 " steps): loss %.4f\n", r->train_steps_measured,
           r->train_loss);
    for (int k = 0; k < n; k++) print_task(trainer_task_name(t, k), &r->train[k], NAN);
  }
  printf("  eval (%" PRId64 " held-out examples): loss %.4f\n", r->eval.examples, r->eval.loss);
  for (int k = 0; k < n; k++)
    print_task(trainer_task_name(t, k), &r->eval.tasks[k],
               r->eval.teacher_ne ? r->eval.teacher_ne[k] : NAN);
  if (r->steps > 0)
    printf("  throughput: %.0f examples/s (%" PRId64 " steps of %" PRId64 " in %.2f s of "
           "training, %.2f s in all%s)\n",
           r->examples_per_second, r->timed_steps, trainer_batch(t), trainer_step_seconds(t),
           r->seconds, r->timed_steps < r->steps ? "; the profiled steps not counted" : "");
  if (r->timed_steps > 0 && trainer_device(t)) {
    double secs = trainer_step_seconds(t), peak = trainer_peak_tflops(t);
    double tflops = secs > 0 ? trainer_flops(t) / secs / 1e12 : 0;
    printf("  step time %.3f ms; %.1f TFLOP/s useful (IR FLOPs over real lengths); Local MFU "
           "%.2f%% of the %.0f TFLOP/s datasheet peak\n",
           1e3 * secs / (double)(r->timed_steps > 0 ? r->timed_steps : 1), tflops,
           peak > 0 ? 100 * tflops / peak : 0, peak);
    const TrainerTimes *tt = trainer_times(t);
    if (tt->steps > 0) {
      double per = 1e3 / (double)tt->steps;
      printf("  per step: the GPU ran %.3f ms; the host launched for %.3f ms, took the next "
             "batch in %.3f ms (waited %.3f ms for it, copied it in %.3f ms), waited %.3f ms for "
             "the GPU and spent %.3f ms on the rest\n",
             per * tt->device_s, per * tt->launch_s, per * tt->prefetch_s,
             per * tt->batch_wait_s, per * tt->copy_s, per * tt->wait_s, per * tt->other_s);
      printf("  the next batch was made in %.3f ms and staged (inputs encoded, tile lists "
             "dealt) in %.3f ms a step, %s\n",
             per * tt->batch_s, per * tt->upload_s,
             tt->pipelined ? "on the batch pipeline's thread" : "on the step's thread "
                             "(GEMC_PIPELINE=0)");
    }
  }
  fflush(stdout);
}

// --- the command ------------------------------------------------------------------------

// Fails early, before any training, when an output could not be written at the end: the
// report's directory takes a new file, the report is no input, the --save directory exists
// (it is created) and takes files, and no other training holds its lock. On success *lock_fd
// is the lock's descriptor (-1 without --save), held until the process exits.
static bool outputs_ready(const TrainCli *c, int *lock_fd) {
  char err[1024];
  *lock_fd = -1;
  bool ok = true;
  if (c->report)
    ok = file_probe_output(c->report, "report", err, sizeof err) &&
         file_refuse_same(c->report, c->file, err, sizeof err) &&
         (!c->opt.data_path || file_refuse_same(c->report, c->opt.data_path, err, sizeof err));
  if (ok && c->save) {
    ok = file_make_dirs(c->save, "checkpoint directory", err, sizeof err) &&
         file_probe_dir(c->save, "checkpoint directory", err, sizeof err);
    if (ok) {
      *lock_fd = file_lock_dir(c->save, CHECKPOINT_LOCK, "checkpoint directory", err,
                               sizeof err);
      ok = *lock_fd >= 0;
    }
  }
  if (!ok) fprintf(stderr, "gemc: error: %s\n", err);
  return ok;
}

// --profile's table (profile_report.h), even with --quiet: it was asked for.
static void print_profile(const Trainer *t, const LoopResult *r) {
  Profile prof;
  if (!trainer_profile(t, &prof)) {
    printf("profile: nothing was profiled (%s)\n",
           !trainer_device(t) ? "the cpu backend runs no kernels"
           : r->steps == 0    ? "no steps were taken"
                              : "--on-nan skip steps are not profiled, and a step whose capture "
                                "failed runs unprofiled (see the note above)");
    return;
  }
  int64_t timed = trainer_timed_steps(t);
  double step_ms = timed > 0 ? 1e3 * trainer_step_seconds(t) / (double)timed : 0;
  profile_print(stdout, &prof, step_ms, 30);
  profile_free(&prof);
  fflush(stdout);
}

static int run_training(const TrainCli *c, Trainer *t, const char *reason, int64_t resumed_from) {
  if (!c->quiet) print_banner(c, t, reason, resumed_from);
  LoopOptions lo = {.steps = c->steps, .eval_every = c->eval_every, .save_dir = c->save,
                    .save_every = c->save_every, .quiet = c->quiet, .live = c->live,
                    .out = stdout, .err = stderr, .profile_steps = c->profile};
  LoopResult r;
  char err[1024], loop_err[1024] = "";
  // A run the divergence guard (or an error) stopped exits 1, and still writes its report,
  // with the failure in it.
  bool trained = train_loop(t, &lo, &r, loop_err, sizeof loop_err);
  if (!trained) train_world_error(&world, loop_err);
  if (trained && !c->quiet) print_summary(t, &r);
  if (trained && c->profile > 0) print_profile(t, &r);
  DistSummary dist;
  bool distributed = trainer_distributed(t);
  if (trained && distributed && !train_world_summary(&world, t, &dist, !c->quiet))
    trained = false, snprintf(loop_err, sizeof loop_err, "the distributed summary failed");
  int rc = trained ? GEMC_EXIT_OK : GEMC_EXIT_USER_ERROR;
  if (c->report) {
    ReportRun run = {.source = c->file, .backend = trainer_device(t) ? "cuda" : "cpu",
                     .backend_reason = reason,
                     .data = c->opt.data_path, .lengths = synth_length_dist_name(c->opt.lengths),
                     .resumed_from = resumed_from, .resume_dir = c->resume, .save_dir = c->save,
                     .error = trained ? NULL : loop_err,
                     .dist = trained && distributed ? &dist : NULL};
    if (!report_write_json(c->report, t, &r, &run, err, sizeof err)) {
      train_world_error(&world, err);
      rc = GEMC_EXIT_USER_ERROR;
    }
  }
  loop_result_free(&r);
  return rc;
}

int cmd_train(const CliOptions *o) {
  TrainCli c;
  int parsed = parse_train(o, &c, stderr);
  if (parsed == 2) {
    print_train_help(stdout);
    return GEMC_EXIT_OK;
  }
  if (parsed == 0) return GEMC_EXIT_USAGE;
  if (!train_world_read(&world)) return GEMC_EXIT_USER_ERROR;
  if (world.env.world <= 1 && (c.dense || c.shard))
    fprintf(stderr, "gemc: warning: --dense and --shard only matter with several ranks "
            "(gemc launch -n N; docs/distributed.md)\n");

  char reason[160];
  if (!choose_backend(&c, reason, sizeof reason)) return GEMC_EXIT_USER_ERROR;
  if ((c.cta_policy || c.max_ctas) && (!c.opt.cuda || world.env.launcher == LAUNCHER_NONE))
    fprintf(stderr, "gemc: warning: --nccl-cta-policy and --nccl-max-ctas only matter for GPU "
            "ranks that a launcher started (gemc launch, torchrun; docs/distributed.md)\n");
  // CPU ranks meet now; GPU ranks once the model shows that they can train it.
  if (!c.opt.cuda && !train_world_join(&world, false, c.comm_timeout))
    return GEMC_EXIT_USER_ERROR;
  // Only rank 0 prints the curve and writes the report; every rank takes part in a save.
  if (!train_world_rank0(&world)) c.quiet = true, c.report = NULL, c.profile = 0;
  c.opt.gpu_log = c.quiet ? NULL : stdout;
  int lock_fd = -1;
  if (train_world_rank0(&world) && !outputs_ready(&c, &lock_fd))
    return train_world_leave(&world, GEMC_EXIT_USER_ERROR, false);

  LoadedModel m;
  if (!load_model(&m, c.file, c.arch, true, c.quiet, c.werror)) {
    loaded_model_free(&m);
    return train_world_leave(&world, GEMC_EXIT_USER_ERROR, false);
  }
  // The default held-out set is 4096 examples whatever --steps says, so that a resumed run
  // evaluates on the set a straight run does (it depends on the seed and --eval-examples).
  // Test hook of the divergence guard: GEMC_TEST_NAN_STEPS=FIRST[:COUNT] gives steps
  // FIRST..FIRST+COUNT-1 a NaN loss (docs/train.md).
  const char *nan_steps = getenv("GEMC_TEST_NAN_STEPS");
  if (nan_steps && *nan_steps) {
    long long nan_first = 0, nan_count = 1;
    if (sscanf(nan_steps, "%lld:%lld", &nan_first, &nan_count) >= 1 && nan_first > 0 &&
        nan_count > 0) {
      c.opt.test_nan_first = nan_first;
      c.opt.test_nan_count = nan_count;
    }
  }
  char err[1024];
  int rc = GEMC_EXIT_USER_ERROR;
  if (!train_world_placement(&world, &m.ir, c.shard, err, sizeof err)) {
    train_world_error(&world, err);
    loaded_model_free(&m);
    return train_world_leave(&world, GEMC_EXIT_USAGE, false);
  }
  c.opt.dense_mode = train_world_dense(&m.ir, c.dense != NULL, c.opt.dense_mode);
  if (c.opt.cuda && world.env.launcher != LAUNCHER_NONE &&
      !trainer_gpu_world_check(&m.ir, world.env.world, c.opt.dense_mode, world.placement,
                               c.opt.artifact != NULL, err, sizeof err)) {
    train_world_error(&world, err);
    loaded_model_free(&m);
    return train_world_leave(&world, GEMC_EXIT_USAGE, false);
  }
  if (c.cta_policy) comm_cta_policy_parse(c.cta_policy, &world.nccl_cta_policy);
  world.nccl_max_ctas = (int)c.max_ctas;
  if (c.opt.cuda && !train_world_join(&world, true, c.comm_timeout)) {
    loaded_model_free(&m);
    return train_world_leave(&world, GEMC_EXIT_USER_ERROR, false);
  }
  c.opt.comm = world.comm;
  c.opt.placement = world.placement;
  c.opt.bucket_bytes = train_world_bucket_bytes(&m.ir, c.bucket_mb);
  Schedule *sched = tuned_schedules(&c, &m.ir);
  c.opt.node_sched = sched;
  Trainer *t = trainer_new(&m.ir, &c.opt, err, sizeof err);
  int64_t resumed_from = -1;
  bool together = false;  // a failure every rank decided (no abort needed)
  if (t && c.resume) {
    if (trainer_resume(t, c.resume, err, sizeof err)) {
      resumed_from = trainer_step_count(t);
      if (c.seed_given && c.opt.seed != trainer_seed(t))
        snprintf(err, sizeof err, "--seed %" PRIu64 " differs from seed %" PRIu64 ", which the "
                 "checkpoint in %s was trained with; leave --seed out to continue it",
                 c.opt.seed, trainer_seed(t), c.resume);
      else
        err[0] = '\0';
    }
    if (err[0]) {
      together = trainer_failed_together(t);
      trainer_free(t);
      t = NULL;
    }
  }
  if (t) rc = run_training(&c, t, reason, resumed_from);
  else train_world_error(&world, err);
  if (t) together = trainer_failed_together(t);
  trainer_free(t);
  free(sched);
  loaded_model_free(&m);
  if (lock_fd >= 0) close(lock_fd);
  return train_world_leave(&world, rc, together);
}
