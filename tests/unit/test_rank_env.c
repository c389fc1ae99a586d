// test_rank_env.c: the launchers' environment conventions (runtime/comm/rank_env.h): torchrun,
// OpenMPI and Slurm variables set by hand, their precedence, Slurm node lists, and malformed or
// inconsistent values refused with a message naming the variable.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "rank_env.h"

// An environment as a NULL-terminated list of "NAME=value" strings.
static const char *table_get(const char *name, void *ctx) {
  size_t n = strlen(name);
  for (const char *const *v = ctx; *v; v++)
    if (strncmp(*v, name, n) == 0 && (*v)[n] == '=') return *v + n + 1;
  return NULL;
}

static bool read_env(const char *const *vars, RankEnv *e, char *err, size_t cap) {
  return rank_env_read(e, table_get, (void *)(uintptr_t)vars, err, cap);
}

static void test_rank_env_none_is_one_process(void **state) {
  (void)state;
  static const char *const vars[] = {"PATH=/bin", "SLURM_JOB_NODELIST=a[1-2]", NULL};
  RankEnv e;
  char err[200];
  assert_true(read_env(vars, &e, err, sizeof err));
  assert_int_equal(e.launcher, LAUNCHER_NONE);
  assert_int_equal(e.world, 1);
  assert_int_equal(e.rank, 0);
  assert_string_equal(e.master_addr, "");
}

static void test_rank_env_torchrun(void **state) {
  (void)state;
  static const char *const vars[] = {"RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1",
                                     "MASTER_ADDR=node7", "MASTER_PORT=29500", NULL};
  RankEnv e;
  char err[200];
  assert_true(read_env(vars, &e, err, sizeof err));
  assert_int_equal(e.launcher, LAUNCHER_TORCHRUN);
  assert_int_equal(e.rank, 5);
  assert_int_equal(e.world, 8);
  assert_int_equal(e.local_rank, 1);
  assert_string_equal(e.master_addr, "node7");
  assert_int_equal(e.master_port, 29500);
  assert_string_equal(rank_launcher_name(e.launcher), "torchrun");
}

static void test_rank_env_openmpi(void **state) {
  (void)state;
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4",
                                     "OMPI_COMM_WORLD_LOCAL_RANK=1", NULL};
  RankEnv e;
  char err[200];
  assert_true(read_env(vars, &e, err, sizeof err));
  assert_int_equal(e.launcher, LAUNCHER_MPI);
  assert_int_equal(e.rank, 3);
  assert_int_equal(e.world, 4);
  assert_int_equal(e.local_rank, 1);
  assert_int_equal(e.master_port, 0);
}

static void test_rank_env_slurm_master_from_the_node_list(void **state) {
  (void)state;
  static const char *const vars[] = {"SLURM_PROCID=6", "SLURM_NTASKS=16", "SLURM_LOCALID=2",
                                     "SLURM_JOB_NODELIST=gpu[003-006,9],login1", NULL};
  RankEnv e;
  char err[200];
  assert_true(read_env(vars, &e, err, sizeof err));
  assert_int_equal(e.launcher, LAUNCHER_SLURM);
  assert_int_equal(e.rank, 6);
  assert_int_equal(e.world, 16);
  assert_int_equal(e.local_rank, 2);
  assert_string_equal(e.master_addr, "gpu003");
  // MASTER_ADDR wins over the node list.
  static const char *const with_master[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2",
                                            "SLURM_JOB_NODELIST=gpu[1-2]", "MASTER_ADDR=head",
                                            NULL};
  assert_true(read_env(with_master, &e, err, sizeof err));
  assert_string_equal(e.master_addr, "head");
}

static void test_rank_env_torchrun_wins_over_slurm(void **state) {
  (void)state;
  // torchrun started inside a Slurm step: its own variables describe this process.
  static const char *const vars[] = {"SLURM_PROCID=0", "SLURM_NTASKS=1", "RANK=1",
                                     "WORLD_SIZE=2", NULL};
  RankEnv e;
  char err[200];
  assert_true(read_env(vars, &e, err, sizeof err));
  assert_int_equal(e.launcher, LAUNCHER_TORCHRUN);
  assert_int_equal(e.rank, 1);
  assert_int_equal(e.world, 2);
  assert_int_equal(e.local_rank, 1);  // no LOCAL_RANK: one node
}

static void expect_refused(const char *const *vars, const char *needle) {
  RankEnv e;
  char err[200] = "";
  assert_false(read_env(vars, &e, err, sizeof err));
  if (!strstr(err, needle)) fail_msg("message \"%s\" does not name \"%s\"", err, needle);
}

static void test_rank_env_refuses_bad_values(void **state) {
  (void)state;
  static const char *const rank_past_world[] = {"RANK=2", "WORLD_SIZE=2", NULL};
  expect_refused(rank_past_world, "RANK=\"2\"");
  static const char *const negative[] = {"RANK=-1", "WORLD_SIZE=2", NULL};
  expect_refused(negative, "RANK");
  static const char *const junk[] = {"RANK=0", "WORLD_SIZE=2x", NULL};
  expect_refused(junk, "WORLD_SIZE=\"2x\"");
  static const char *const zero_world[] = {"RANK=0", "WORLD_SIZE=0", NULL};
  expect_refused(zero_world, "WORLD_SIZE");
  static const char *const huge[] = {"RANK=0", "WORLD_SIZE=99999999999999999999", NULL};
  expect_refused(huge, "WORLD_SIZE");
  static const char *const half[] = {"RANK=0", NULL};
  expect_refused(half, "WORLD_SIZE");
  static const char *const local[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=2", NULL};
  expect_refused(local, "LOCAL_RANK");
  static const char *const port[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=70000", NULL};
  expect_refused(port, "MASTER_PORT");
  static const char *const empty_port[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=", NULL};
  expect_refused(empty_port, "MASTER_PORT");
  static const char *const mpi[] = {"OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4", NULL};
  expect_refused(mpi, "OMPI_COMM_WORLD_RANK");
  static const char *const nodes[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2",
                                      "SLURM_JOB_NODELIST=gpu[", NULL};
  expect_refused(nodes, "SLURM_JOB_NODELIST");
}

// The job token: none without a job id; GEMC_JOB_ID first, then torchrun's run id, then
// Slurm's job and step; different ids give different tokens.
static void test_rank_env_job_token(void **state) {
  (void)state;
  char err[200];
  RankEnv a, b, c, d, none;
  static const char *const v0[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", NULL};
  static const char *const v1[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0",
                                   "GEMC_JOB_ID=j1", "TORCHELASTIC_RUN_ID=r1", NULL};
  static const char *const v2[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1",
                                   "GEMC_JOB_ID=j1", NULL};
  static const char *const v3[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0",
                                   "TORCHELASTIC_RUN_ID=r1", NULL};
  static const char *const v4[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
                                   "SLURM_JOB_ID=77", "SLURM_STEP_ID=0", NULL};
  assert_true(read_env(v0, &none, err, sizeof err));
  assert_true(read_env(v1, &a, err, sizeof err));
  assert_true(read_env(v2, &b, err, sizeof err));
  assert_true(read_env(v3, &c, err, sizeof err));
  assert_true(read_env(v4, &d, err, sizeof err));
  assert_true(none.job == 0);
  assert_true(a.job != 0 && a.job == b.job);  // GEMC_JOB_ID wins; ranks of a job agree
  assert_true(c.job != 0 && c.job != a.job);
  assert_true(d.job != 0 && d.job != c.job);
}

static void test_slurm_first_host_forms(void **state) {
  (void)state;
  char out[32];
  assert_true(slurm_first_host("login1", out, sizeof out));
  assert_string_equal(out, "login1");
  assert_true(slurm_first_host("a,b,c", out, sizeof out));
  assert_string_equal(out, "a");
  assert_true(slurm_first_host("node[07-12]", out, sizeof out));
  assert_string_equal(out, "node07");
  assert_true(slurm_first_host("node[3,5-6]", out, sizeof out));
  assert_string_equal(out, "node3");
  assert_true(slurm_first_host("rack[1-2]-ib", out, sizeof out));
  assert_string_equal(out, "rack1-ib");
  assert_false(slurm_first_host("", out, sizeof out));
  assert_false(slurm_first_host("node[]", out, sizeof out));
  assert_false(slurm_first_host("node[a-b]", out, sizeof out));
  assert_false(slurm_first_host("node[1-2", out, sizeof out));
  assert_false(slurm_first_host("averyveryveryverylonghostnamethatdoesnotfit", out, sizeof out));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rank_env_none_is_one_process),
      cmocka_unit_test(test_rank_env_torchrun),
      cmocka_unit_test(test_rank_env_openmpi),
      cmocka_unit_test(test_rank_env_slurm_master_from_the_node_list),
      cmocka_unit_test(test_rank_env_torchrun_wins_over_slurm),
      cmocka_unit_test(test_rank_env_refuses_bad_values),
      cmocka_unit_test(test_rank_env_job_token),
      cmocka_unit_test(test_slurm_first_host_forms),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
