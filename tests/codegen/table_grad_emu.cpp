// table_grad_emu.cpp: runs kernels/table_grad.cuh and the generated apply kernels of @tagt in
// tests/golden/codegen_small.gem on the CPU (cuda_on_cpu.h) and compares the rows gradient, the
// updated bf16 table and the Adagrad state with a CPU reference, bit for bit. (The model's
// gather is one launch for both tables, with their state zeroing; plan_emu checks it, and here
// the host lays out its output: the ids, and their positions.)
// tests/codegen/table_grad_emu.sh builds it; the arguments are occurrences, table rows and the
// id range: table_grad_emu N ROWS SPREAD.
#include "cuda_on_cpu.h"
#include "prelude_on_cpu.h"
#include "table_grad_kernels.inc"  // kernels/table_grad.cuh, without extern "C"
#include "table_grad_generated.inc"  // the generated kernels, extracted by the script
#include <cstdlib>
static uint64_t rng = 12345;
static double uni() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (double)(rng >> 11) / 9007199254740992.0; }
int main(int argc, char **argv) {
  const int D = 16; const i64 ROWS = argc > 2 ? atoll(argv[2]) : 50;
  i64 n = argc > 1 ? atoll(argv[1]) : 37;
  std::vector<i64> ids(n); i64 spread = argc > 3 ? atoll(argv[3]) : 12; for (auto &x : ids) x = (i64)(uni() * spread) % ROWS;
  if (n > 3) ids[n - 1] = ROWS - 1;
  std::vector<float> dy(n * D); for (auto &x : dy) x = (float)(uni() * 2 - 1);
  std::vector<bf16_t> tab0(ROWS * D); for (auto &x : tab0) x = bf16_encode((float)(uni() * 2 - 1));
  std::vector<bf16_t> tab = tab0;
  std::vector<float> rowsum(ROWS, 0.f);
  std::vector<i64> keys0(n), keys1(n);
  std::vector<int> vals0(n), vals1(n), dbeg(n + 1);
  std::vector<char> rows(8 + n * (8 + 4 * D));
  i64 *hdr = (i64 *)rows.data();
  auto grid = [](i64 size, i64 per) { return (unsigned)((size + per - 1) / per); };
  int bits = 0;
  while (bits < 62 && ((i64)1 << bits) < ROWS) bits++;
  // as lower_sparse.c plans them (the tiles may be given: more tiles than 1024 occurrences each)
  int passes = bits <= RADIX_BITS ? 1 : (bits + RADIX_BITS - 1) / RADIX_BITS;
  unsigned tiles = argc > 4 ? (unsigned)atoi(argv[4]) : grid(n, 1024);
  if (tiles > SORT_MAX_TILES) tiles = SORT_MAX_TILES;
  if (tiles < 1) tiles = 1;
  std::vector<int> state(SORT_PASS_TOTALS + passes * tiles * RADIX_BUCKETS, 0);
  for (i64 i = 0; i < n; i++) keys0[i] = ids[i], vals0[i] = (int)i;
  launch(tiles, 1024, [&] { table_grad_radix_histogram(state.data(), keys0.data(), n, passes); });
  i64 *kin = keys0.data(), *kout = keys1.data();
  int *vin = vals0.data(), *vout = vals1.data();
  for (int p = 0; p < passes; p++) {
    launch(tiles, 1024, [&] { table_grad_radix_pass(kout, vout, kin, vin, state.data(), n, p); });
    std::swap(kin, kout);
    std::swap(vin, vout);
  }
  int *sorted = vin;
  launch(tiles, 1024, [&] { table_grad_runs(hdr, dbeg.data(), kin, state.data(), n); });
  // A warp per id, 8 ids a block; runs longer than 16 (WARP_SPLIT_MIN) listed for the long
  // kernel (32 warps), which sums them in 32 parts. The plan gives it 264 blocks; 2 here take
  // the same ids in turn (li += gridDim.x).
  // Their count is the sort state's SORT_LONG_COUNT counter, zero before the apply.
  std::vector<int> long_runs(n + 1);
  launch(grid(n, 8), 256, [&] { table_grad_apply_tagt((float *)rows.data(), tab.data(), rowsum.data(), sorted, dbeg.data(), dy.data(), n, n, long_runs.data(), state.data()); });
  launch(2, 1024, [&] { table_grad_apply_long_tagt((float *)rows.data(), tab.data(), rowsum.data(), sorted, dbeg.data(), dy.data(), n, n, long_runs.data(), state.data()); });
  // reference
  i64 U = 0; int bad = 0;
  const i64 *gids = hdr + 1; const float *gv = (const float *)(gids + n);
  std::vector<float> rs(ROWS, 0.f);
  for (i64 id = 0; id < ROWS; id++) {
    int hits = 0; float g[D] = {0};
    std::vector<i64> at;  // the id's occurrences, in order
    for (i64 p = 0; p < n; p++) if (ids[p] == id) { hits++; at.push_back(p); }
    const int PARTS = hits > 16 ? 32 : 1;  // as table_grad_apply_long sums a run longer than 16
    for (int k = 0; k < PARTS; k++) {
      float part[D] = {0};
      for (i64 e = (i64)hits * k / PARTS; e < (i64)hits * (k + 1) / PARTS; e++)
        for (int j = 0; j < D; j++) part[j] += dy[at[e] * D + j];
      for (int j = 0; j < D; j++) g[j] += part[j];
    }
    if (!hits) { if (memcmp(&tab[id * D], &tab0[id * D], 2 * D)) bad++; continue; }
    if (gids[U] != id) bad++;
    for (int j = 0; j < D; j++) if (gv[U * D + j] != g[j]) bad++;
    double sq = 0; for (int j = 0; j < D; j++) sq += (double)g[j] * g[j];
    rs[id] = (float)(rs[id] + sq / D);
    double step = 0.01 / (sqrt((double)rs[id]) + 1e-8);
    for (int j = 0; j < D; j++) if (bf16_encode((float)(bf16_decode(tab0[id * D + j]) - step * g[j])) != tab[id * D + j]) bad++;
    if (rs[id] != rowsum[id]) bad++;
    U++;
  }
  printf("n=%lld rows=%lld U=%lld (kernel %lld) mismatches=%d\n", n, ROWS, U, hdr[0], bad);
  return bad || U != hdr[0];
}
