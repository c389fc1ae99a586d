// cuda_on_cpu_check.cpp: the emulator that plan_emu and table_grad_emu stand on
// (cuda_on_cpu.h) keeps CUDA's rules: __syncthreads orders shared-memory writes before reads,
// a missing barrier gives a wrong result (never a right one by luck of scheduling), threads
// that exit stop counting at a barrier, shuffles and ballots see their warp, atomics add up
// over the grid, a barrier that can never fill stops the program with a message, and the
// tensor-core collectives (ldmatrix x4, plain and transposed, and mma m16n8k16) hand each lane
// the fragment the PTX ISA's layouts give it, in two warps at once, an mbarrier's phase completes
// only when its arrivals and its transaction bytes are all in, and a TMA box through wgmma (both
// 128-byte swizzled, read through a matrix descriptor) gives a plain product.
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
  // ldmatrix x4 over four 8x8 matrices of distinct values (matrix i at rows 8i.., element (r, c)
  // = 256i + 8r + c), then mma: A (16x16) and B (16x8) of small integers, exact in bf16 and in
  // fp32 sums, fragments filled by hand from the layouts; D = C + A·B against a plain product.
  static uint16_t mats[2][32][8];
  for (int w = 0; w < 2; w++)
    for (int r = 0; r < 32; r++)
      for (int c = 0; c < 8; c++) mats[w][r][c] = (uint16_t)(1000 * w + 8 * r + c);
  unsigned plain[64][4], trans[64][4];
  float d[64][4];
  auto bf16 = [](float x) { return (unsigned)(__float_as_uint(x) >> 16); };
  auto a_val = [](int w, int i, int k) { return (float)((i * 3 + k * 5 + w) % 7 - 3); };
  auto b_val = [](int w, int k, int j) { return (float)((k * 2 + j * 3 + w) % 5 - 2); };
  launch(1, 64, [&] {
    int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
    emu_ldmatrix_x4(plain[threadIdx.x], mats[w][l], false);
    emu_ldmatrix_x4(trans[threadIdx.x], mats[w][l], true);
    unsigned a[4], b[2];
    for (int reg = 0; reg < 4; reg++) {
      int i = g + 8 * (reg & 1), k = 2 * t + 8 * (reg >> 1);
      a[reg] = bf16(a_val(w, i, k)) | bf16(a_val(w, i, k + 1)) << 16;
    }
    for (int reg = 0; reg < 2; reg++) {
      int k = 2 * t + 8 * reg;
      b[reg] = bf16(b_val(w, k, g)) | bf16(b_val(w, k + 1, g)) << 16;
    }
    float *acc = d[threadIdx.x];
    for (int c = 0; c < 4; c++) acc[c] = (float)c;
    emu_mma_bf16(acc, a, b);
  });
  bool ld_ok = true, mma_ok = true;
  for (int x = 0; x < 64; x++) {
    int w = x / 32, l = x % 32, g = l >> 2, t = l & 3;
    for (int m = 0; m < 4; m++) {
      unsigned want = mats[w][8 * m + g][2 * t] | (unsigned)mats[w][8 * m + g][2 * t + 1] << 16;
      unsigned want_t = mats[w][8 * m + 2 * t][g] | (unsigned)mats[w][8 * m + 2 * t + 1][g] << 16;
      ld_ok = ld_ok && plain[x][m] == want && trans[x][m] == want_t;
    }
    for (int c = 0; c < 4; c++) {
      int i = g + 8 * (c >> 1), j = 2 * t + (c & 1);
      float want = (float)c;
      for (int k = 0; k < 16; k++) want += a_val(w, i, k) * b_val(w, k, j);
      mma_ok = mma_ok && d[x][c] == want;
    }
  }
  expect(ld_ok, "ldmatrix x4 hands each lane its fragment, plain and transposed");
  expect(mma_ok, "mma m16n8k16 computes C + A·B in the PTX fragment layouts");
  // An mbarrier of 2 arrivals: one arrival and 128 announced bytes do not complete the phase,
  // the bytes landing do; a waiter on parity 0 passes only then, one on parity 1 at once.
  bool order_ok = true;
  int step = 0;
  launch(1, 2, [&] {
    if (threadIdx.x == 0) {
      emu_mbar_init(64, 2);
      order_ok = order_ok && emu_mbar_try_wait(64, 1) && !emu_mbar_try_wait(64, 0);
      emu_mbar_expect_tx(64, 128);
      step = 1;
      __syncwarp();
      __syncwarp();  // thread 1 arrives
      order_ok = order_ok && !emu_mbar_try_wait(64, 0);
      emu_mbar_complete_tx(64, 128);
      order_ok = order_ok && emu_mbar_try_wait(64, 0) && !emu_mbar_try_wait(64, 1);
    } else {
      __syncwarp();
      order_ok = order_ok && step == 1;
      emu_mbar_arrive(64);
      __syncwarp();
    }
  });
  expect(order_ok, "an mbarrier phase waits for its arrivals and its transaction bytes");
  // A 64 x 64 bf16 matrix by TMA (box 64 rows x 64 columns, 128-byte swizzle) at 1024, its
  // transpose-free product with itself through wgmma m64n64k16 over the 4 k-steps (both
  // operands K-major, descriptors as attention_sm90.cuh builds them: +32 bytes a k-step, SBO
  // 1024): d = M·Mᵀ, against a plain product.
  static uint16_t mat[64 * 64];
  auto mval = [](int r, int c) { return (float)((r * 7 + c * 3) % 9 - 4); };
  for (int r = 0; r < 64; r++)
    for (int c = 0; c < 64; c++) mat[r * 64 + c] = (uint16_t)(__float_as_uint(mval(r, c)) >> 16);
  EmuTmaMap map = {EMU_TMA_MAGIC, (uint64_t)(uintptr_t)mat, 64, 64, 128, 64, 64, 128, {}};
  static float prod[128][32];
  launch(1, 128, [&] {
    if (threadIdx.x == 0) {
      emu_mbar_init(0, 1);
      emu_mbar_expect_tx(0, 64 * 64 * 2);
      emu_tma_load(1024, &map, 0, 0, 0);
    }
    __syncthreads();
    for (int kk = 0; kk < 4; kk++) {
      uint64_t desc = (uint64_t)((1024 + kk * 32) >> 4) | (uint64_t)(16 >> 4) << 16 |
                      (uint64_t)(1024 >> 4) << 32 | 1ull << 62;
      emu_wgmma(prod[threadIdx.x], 64, desc, nullptr, false, desc, false, kk > 0, false);
    }
  });
  bool wgmma_ok = true;
  for (int x = 0; x < 128; x++) {
    int w = x / 32, g = (x % 32) / 4, t = x % 4;
    for (int j = 0; j < 8; j++)
      for (int c = 0; c < 4; c++) {
        int row = 16 * w + g + 8 * (c >> 1), col = 8 * j + 2 * t + (c & 1);
        float want = 0;
        for (int k = 0; k < 64; k++) want += mval(row, k) * mval(col, k);
        wgmma_ok = wgmma_ok && prod[x][4 * j + c] == want;
      }
  }
  expect(wgmma_ok, "a swizzled TMA box through wgmma descriptors gives the plain product");
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
