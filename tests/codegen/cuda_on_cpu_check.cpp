// cuda_on_cpu_check.cpp: the emulator that plan_emu and table_grad_emu stand on
// (cuda_on_cpu.h) keeps CUDA's rules: __syncthreads orders shared-memory writes before reads,
// a missing barrier gives a wrong result (never a right one by luck of scheduling), threads
// that exit stop counting at a barrier, shuffles and ballots see their warp, atomics add up
// over the grid, and a barrier that can never fill stops the program with a message.
// Run by cuda_on_cpu_check.sh; exits 0 when every check holds, and the child that must
// deadlock is expected to abort.
#include "cuda_on_cpu.h"
#include <sys/wait.h>

static int failures;
static void expect(bool ok, const char *what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) failures++;
}

int main() {
  static float s[256];
  float out[256];
  // Reversal through shared memory, with the barrier: exact, in every block.
  bool exact = true;
  for (unsigned g = 1; g <= 3; g++) {
    launch(g, 256, [&] {
      s[threadIdx.x] = (float)(threadIdx.x + blockIdx.x);
      __syncthreads();
      out[threadIdx.x] = s[255 - threadIdx.x];
      __syncthreads();
    });
    for (int i = 0; i < 256; i++) exact = exact && out[i] == (float)(255 - i + g - 1);
  }
  expect(exact, "__syncthreads orders the writes of a block before its reads");
  // The same without the barrier: the low threads read before the high ones write.
  for (int i = 0; i < 256; i++) s[i] = -1.0f;
  launch(1, 256, [&] {
    s[threadIdx.x] = (float)threadIdx.x;
    out[threadIdx.x] = s[255 - threadIdx.x];
  });
  int wrong = 0;
  for (int i = 0; i < 256; i++) wrong += out[i] != (float)(255 - i);
  expect(wrong > 0, "a missing barrier shows up as wrong values");
  // Threads that return early leave the barrier to the others.
  int after = 0;
  launch(1, 128, [&] {
    if (threadIdx.x >= 100) return;
    __syncthreads();
    __atomic_fetch_add(&after, 1, __ATOMIC_SEQ_CST);
  });
  expect(after == 100, "exited threads stop counting at __syncthreads");
  // A warp sum by xor shuffles, and a ballot of the odd lanes, in a partial last warp.
  float sums[48];
  unsigned ballots[48];
  launch(1, 48, [&] {
    float v = (float)threadIdx.x;
    int lanes = threadIdx.x < 32 ? 32 : 16;
    for (int off = lanes / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    sums[threadIdx.x] = v;
    ballots[threadIdx.x] = __ballot_sync(0xffffffffu, threadIdx.x % 2 == 1);
  });
  expect(sums[0] == 496.0f && sums[31] == 496.0f && sums[32] == 632.0f && sums[47] == 632.0f,
         "xor shuffles reduce within each warp");
  expect(ballots[0] == 0xaaaaaaaau && ballots[40] == 0xaaaau, "ballot sees the lanes of its warp");
  int total = 0;
  launch(7, 96, [&] { atomicAdd(&total, (int)blockIdx.x + 1); });
  expect(total == 96 * 28, "atomicAdd sums over every thread of the grid");
  // Lane 0 waits at its warp's barrier while the rest of the block waits at the block's.
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    fclose(stderr);  // the message is the emulator's; the parent checks the abort
    launch(1, 64, [&] {
      if (threadIdx.x == 0) __syncwarp();
      else __syncthreads();
    });
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  expect(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "a barrier that cannot fill aborts, not hangs");
  printf("cuda_on_cpu_check: %d failure(s)\n", failures);
  return failures ? 1 : 0;
}
