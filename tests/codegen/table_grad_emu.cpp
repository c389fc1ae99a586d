// table_grad_emu.cpp: runs kernels/table_grad.cuh and the generated gather/apply kernels of
// @tagt in tests/golden/codegen_small.gem on the CPU (cuda_on_cpu.h) and compares the rows
// gradient, the updated bf16 table and the Adagrad state with a CPU reference, bit for bit.
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
  i64 nblocks = (ROWS + 4095) / 4096;
  std::vector<i64> occ(n); std::vector<int> count(ROWS, 0), seg(ROWS), rank(ROWS), dbeg(n), dcnt(n), perm(n), sorted(n);
  std::vector<long long> totals(2 * nblocks);
  std::vector<char> rows(8 + n * (8 + 4 * D));
  i64 *hdr = (i64 *)rows.data();
  auto grid = [](i64 size, i64 per) { return (unsigned)((size + per - 1) / per); };
  launch(grid(n, 256), 256, [&] { table_grad_gather_tagt(occ.data(), ids.data(), n); });
  launch(grid(n, 256), 256, [&] { table_grad_count(count.data(), occ.data(), n); });
  launch(nblocks, 1024, [&] { table_grad_scan_blocks(seg.data(), rank.data(), totals.data(), count.data(), ROWS); });
  launch(1, 32, [&] { table_grad_scan_totals(totals.data(), hdr, nblocks); });
  launch(grid(ROWS, 256), 256, [&] { table_grad_scan_add(seg.data(), hdr, dbeg.data(), dcnt.data(), count.data(), rank.data(), totals.data(), ROWS); });
  launch(grid(n, 256), 256, [&] { table_grad_scatter(perm.data(), count.data(), seg.data(), occ.data(), n); });
  launch(grid(32 * n, 256), 256, [&] { table_grad_sort(sorted.data(), perm.data(), dbeg.data(), dcnt.data(), hdr, n); });
  launch(n, 256, [&] { table_grad_apply_tagt((float *)rows.data(), tab.data(), rowsum.data(), sorted.data(), dbeg.data(), dcnt.data(), dy.data(), n, n); });
  // reference
  i64 U = 0; int bad = 0;
  const i64 *gids = hdr + 1; const float *gv = (const float *)(gids + n);
  std::vector<float> rs(ROWS, 0.f);
  for (i64 id = 0; id < ROWS; id++) {
    int hits = 0; float g[D] = {0};
    for (i64 p = 0; p < n; p++) if (ids[p] == id) { hits++; for (int j = 0; j < D; j++) g[j] += dy[p * D + j]; }
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
