// test_rendezvous.c: the TCP exchange of NCCL's unique id (rendezvous.h) with real processes
// on this machine: 4 ranks share 128 bytes; a missing rank, a rank without a rank 0 and a
// peer from another world are errors within the deadline; a peer of another job is turned
// away while the job's own ranks meet; a world of one needs no network.
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "rendezvous.h"

// A port nothing listens on now (the kernel's pick for an ephemeral bind).
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t n = sizeof a;
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &n), 0);
  close(fd);
  return ntohs(a.sin_port);
}

static void pattern(unsigned char *b, size_t n, int seed) {
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 31 + (size_t)seed);
}

enum { JOB = 0x1234abcd5678ull };

// Forks rank `rank` of `world` of job `job`; it exits 0 when it received rank 0's pattern.
static pid_t peer_of(int port, int rank, int world, uint64_t job, double timeout, size_t size) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    unsigned char got[128] = {0}, want[128];
    char err[256];
    pattern(want, size, 7);
    bool ok = rendezvous_share("127.0.0.1", port, rank, world, job, got, size, timeout, err,
                               sizeof err);
    _exit(ok && memcmp(got, want, size) == 0 ? 0 : 1);
  }
  return pid;
}

static pid_t peer(int port, int rank, int world, double timeout, size_t size) {
  return peer_of(port, rank, world, JOB, timeout, size);
}

static int status_of(pid_t pid) {
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 99;
}

static void test_four_ranks_share_the_id(void **state) {
  (void)state;
  int port = free_port();
  pid_t kids[3];
  for (int r = 1; r <= 3; r++) kids[r - 1] = peer(port, r, 4, 20, 128);
  unsigned char blob[128];
  pattern(blob, sizeof blob, 7);
  char err[256] = "";
  bool ok = rendezvous_share("127.0.0.1", port, 0, 4, JOB, blob, sizeof blob, 20, err, sizeof err);
  if (!ok) fprintf(stderr, "%s\n", err);
  assert_true(ok);
  for (int i = 0; i < 3; i++) assert_int_equal(status_of(kids[i]), 0);
}

static void test_missing_rank_times_out(void **state) {
  (void)state;
  int port = free_port();
  pid_t kid = peer(port, 1, 3, 5, 16);
  unsigned char blob[16];
  pattern(blob, sizeof blob, 7);
  char err[256] = "";
  time_t start = time(NULL);
  assert_false(rendezvous_share("127.0.0.1", port, 0, 3, JOB, blob, sizeof blob, 1, err, sizeof err));
  assert_true(time(NULL) - start <= 5);
  assert_non_null(strstr(err, "1 of 2 ranks did not reach rank 0"));
  assert_non_null(strstr(err, "missing: 2"));
  assert_int_equal(status_of(kid), 0);  // rank 1 came and got the id
}

static void test_rank_without_rank0_times_out(void **state) {
  (void)state;
  unsigned char blob[8];
  char err[256] = "";
  assert_false(rendezvous_share("127.0.0.1", free_port(), 1, 2, JOB, blob, sizeof blob, 0.5, err,
                                sizeof err));
  assert_non_null(strstr(err, "rank 1 could not get the id from rank 0"));
}

static void test_peer_of_another_world_is_refused(void **state) {
  (void)state;
  int port = free_port();
  pid_t kid = peer(port, 1, 3, 5, 128);  // says world 3
  unsigned char blob[128] = {0};
  char err[256] = "";
  assert_false(rendezvous_share("127.0.0.1", port, 0, 2, JOB, blob, sizeof blob, 5, err, sizeof err));
  assert_non_null(strstr(err, "a peer says rank 1 of 3; this world has 2 ranks"));
  assert_int_equal(status_of(kid), 1);
}

// Two jobs on one port: rank 0 turns away the other job's rank 1 (which fails, unanswered)
// and still meets its own.
static void test_peer_of_another_job_is_turned_away(void **state) {
  (void)state;
  int port = free_port();
  pid_t stranger = peer_of(port, 1, 2, JOB + 1, 3, 64);
  struct timespec nap = {0, 300 * 1000 * 1000};
  nanosleep(&nap, NULL);  // the stranger connects first
  pid_t own = peer(port, 1, 2, 10, 64);
  unsigned char blob[64];
  pattern(blob, sizeof blob, 7);
  char err[256] = "";
  bool ok = rendezvous_share("127.0.0.1", port, 0, 2, JOB, blob, sizeof blob, 10, err,
                             sizeof err);
  if (!ok) fprintf(stderr, "%s\n", err);
  assert_true(ok);
  assert_int_equal(status_of(own), 0);
  assert_int_equal(status_of(stranger), 1);
}

static void test_world_of_one_and_missing_master(void **state) {
  (void)state;
  char blob[4] = "abc", err[256] = "";
  assert_true(rendezvous_share(NULL, 0, 0, 1, 0, blob, sizeof blob, 1, err, sizeof err));
  assert_string_equal(blob, "abc");
  assert_false(rendezvous_share("", 0, 0, 2, 0, blob, sizeof blob, 1, err, sizeof err));
  assert_non_null(strstr(err, "need MASTER_ADDR and MASTER_PORT"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_four_ranks_share_the_id),
      cmocka_unit_test(test_missing_rank_times_out),
      cmocka_unit_test(test_rank_without_rank0_times_out),
      cmocka_unit_test(test_peer_of_another_world_is_refused),
      cmocka_unit_test(test_peer_of_another_job_is_turned_away),
      cmocka_unit_test(test_world_of_one_and_missing_master),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
