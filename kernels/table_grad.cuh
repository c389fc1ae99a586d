// table_grad.cuh: the id bookkeeping of a table's sparse gradient, without float atomics.
// The occurrences of a table's ids in one batch (every lookup, in use order, then position
// order) are grouped by id in five integer passes:
//   count       count[id] += 1 for every occurrence (integer atomics: order-independent)
//   scan_blocks exclusive scans of count and of (count > 0) inside each block of SCAN_TILE rows
//   scan_totals one thread scans the block totals and writes U, the distinct ids
//   scan_add    per table row: its segment start and distinct rank; lists the distinct ids
//   scatter     each occurrence lands in its id's segment (in any order)
//   sort        each segment is put back in occurrence order (rank by counting), so the
//               generated apply kernel sums every id's rows in the CPU executor's order
// The generated kernel `<table>_grad_apply` then sums and applies the optimizer per row.

enum { SCAN_THREADS = 1024, SCAN_ITEMS = 4, SCAN_TILE = SCAN_THREADS * SCAN_ITEMS };

extern "C" __global__ void __launch_bounds__(256)
table_grad_count(int *__restrict__ count, const i64 *__restrict__ occ_ids, i64 n) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&count[occ_ids[i]], 1);
}

// block_totals[2 * block] = occurrences in the block, [2 * block + 1] = distinct ids in it.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
table_grad_scan_blocks(int *__restrict__ seg_start, int *__restrict__ distinct_rank,
                       i64 *__restrict__ block_totals, const int *__restrict__ count,
                       i64 rows) {
  __shared__ int part_occ[SCAN_THREADS], part_distinct[SCAN_THREADS];
  i64 base = (i64)blockIdx.x * SCAN_TILE + (i64)threadIdx.x * SCAN_ITEMS;
  int occ = 0, distinct = 0;
  for (int k = 0; k < SCAN_ITEMS; k++) {
    i64 r = base + k;
    int c = r < rows ? count[r] : 0;
    occ += c;
    distinct += c > 0;
  }
  part_occ[threadIdx.x] = occ;
  part_distinct[threadIdx.x] = distinct;
  __syncthreads();
  // Hillis-Steele inclusive scan over the per-thread sums.
  for (int off = 1; off < SCAN_THREADS; off *= 2) {
    int o = threadIdx.x >= off ? part_occ[threadIdx.x - off] : 0;
    int d = threadIdx.x >= off ? part_distinct[threadIdx.x - off] : 0;
    __syncthreads();
    part_occ[threadIdx.x] += o;
    part_distinct[threadIdx.x] += d;
    __syncthreads();
  }
  int run_occ = part_occ[threadIdx.x] - occ, run_distinct = part_distinct[threadIdx.x] - distinct;
  for (int k = 0; k < SCAN_ITEMS; k++) {
    i64 r = base + k;
    if (r >= rows) break;
    int c = count[r];
    seg_start[r] = run_occ;
    distinct_rank[r] = run_distinct;
    run_occ += c;
    run_distinct += c > 0;
  }
  if (threadIdx.x == SCAN_THREADS - 1) {
    block_totals[2 * blockIdx.x] = part_occ[threadIdx.x];
    block_totals[2 * blockIdx.x + 1] = part_distinct[threadIdx.x];
  }
}

// One thread: block totals to exclusive block offsets, in place; U to rows_header[0].
extern "C" __global__ void __launch_bounds__(32)
table_grad_scan_totals(i64 *__restrict__ block_totals, i64 *__restrict__ rows_header,
                       i64 nblocks) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  i64 occ = 0, distinct = 0;
  for (i64 b = 0; b < nblocks; b++) {
    i64 o = block_totals[2 * b], d = block_totals[2 * b + 1];
    block_totals[2 * b] = occ;
    block_totals[2 * b + 1] = distinct;
    occ += o;
    distinct += d;
  }
  rows_header[0] = distinct;
}

// Per table row with occurrences: its global segment start, and the distinct-id lists.
// count[r] is reset to 0 so that scatter can reuse it as the fill counter.
extern "C" __global__ void __launch_bounds__(256)
table_grad_scan_add(int *__restrict__ seg_start, i64 *__restrict__ rows_tensor,
                    int *__restrict__ distinct_begin, int *__restrict__ distinct_count,
                    int *__restrict__ count, const int *__restrict__ distinct_rank,
                    const i64 *__restrict__ block_totals, i64 rows) {
  i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  int c = count[r];
  if (c == 0) return;
  i64 block = r / SCAN_TILE;
  int start = seg_start[r] + (int)block_totals[2 * block];
  int rank = distinct_rank[r] + (int)block_totals[2 * block + 1];
  seg_start[r] = start;
  rows_tensor[1 + rank] = r;  // the ids follow the count U
  distinct_begin[rank] = start;
  distinct_count[rank] = c;
  count[r] = 0;
}

extern "C" __global__ void __launch_bounds__(256)
table_grad_scatter(int *__restrict__ perm, int *__restrict__ fill,
                   const int *__restrict__ seg_start, const i64 *__restrict__ occ_ids, i64 n) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  i64 id = occ_ids[i];
  int slot = seg_start[id] + atomicAdd(&fill[id], 1);
  perm[slot] = (int)i;
}

// One warp per distinct id: the rank of each occurrence among its segment's is its place, so
// `sorted` lists every segment in occurrence order whatever order scatter left it in. Cost
// grows with the square of a segment's length (a TODO: a radix sort for very hot ids).
extern "C" __global__ void __launch_bounds__(256)
table_grad_sort(int *__restrict__ sorted, const int *__restrict__ perm,
                const int *__restrict__ distinct_begin, const int *__restrict__ distinct_count,
                const i64 *__restrict__ rows_header, i64 max_distinct) {
  i64 d = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
  int lane = threadIdx.x % WARP_SIZE;
  if (d >= max_distinct || d >= rows_header[0]) return;
  int begin = distinct_begin[d], n = distinct_count[d];
  for (int e = lane; e < n; e += WARP_SIZE) {
    int mine = perm[begin + e], rank = 0;
    for (int f = 0; f < n; f++) rank += perm[begin + f] < mine;
    sorted[begin + rank] = mine;
  }
}
