// table_grad.cuh: the id bookkeeping of a table's sparse gradient, without float atomics, in
// time that grows with the batch's occurrences, never with the table's rows. The occurrences of
// a table's ids in one batch (every lookup, in use order, then position order) are sorted by
// id with a stable LSD radix sort of RADIX_BITS bits a pass (as many passes as the table's row
// count needs), their positions carried along, so each id's occurrences stay in occurrence
// order and the generated apply kernel sums every id's rows in the CPU executor's order. The
// generated `table_grad_gather_<table>` writes the input: keys = the ids, vals = 0, 1, 2, ...
//   radix_count    per tile of RADIX_TILE occurrences, how many fall in each digit bucket
//   scan_ints      one block: the exclusive scan of those counts, bucket-major over the tiles
//   radix_scatter  every occurrence to its bucket's next place (a stable pass)
// then the runs of equal ids become the distinct list:
//   runs_count     per tile, the occurrences that start a run
//   scan_ints      their exclusive scan, and U (the distinct ids) into the rows header
//   runs_list      per run: its id after U in the header, and where it begins
//   runs_length    per run: how many occurrences it has
// A tile is walked by one warp, 32 occurrences at a time in order: __match_any_sync finds the
// lanes with the same digit, and a lane's place among them is the count of lower lanes. Every
// pass is integer arithmetic in a fixed order, so reruns are bit-identical.

// 8 bits a pass: a 4M-row table sorts in 3 passes (6 at 4 bits), each 3 launches. The lowering
// (codegen/ops/lower_sparse.c) reads RADIX_BITS from this line.
enum { RADIX_BITS = 8, RADIX_BUCKETS = 1 << RADIX_BITS, RADIX_TILE = 1024, SCAN_THREADS = 1024 };

__device__ __forceinline__ i64 radix_tiles(i64 n) { return (n + RADIX_TILE - 1) / RADIX_TILE; }
__device__ __forceinline__ unsigned radix_lanes_below(int lane) { return (1u << lane) - 1u; }

// counts[b * tiles + t]: the occurrences of tile t whose digit (key >> shift) is b.
extern "C" __global__ void __launch_bounds__(32)
table_grad_radix_count(int *__restrict__ counts, const i64 *__restrict__ keys, i64 n, i64 shift) {
  __shared__ int in_bucket[RADIX_BUCKETS];
  const int lane = threadIdx.x;
  for (int b = lane; b < RADIX_BUCKETS; b += WARP_SIZE) in_bucket[b] = 0;
  __syncwarp();
  const i64 first = (i64)blockIdx.x * RADIX_TILE;
  // The tile's digits first: 32 loads in flight a lane, not one load latency per step.
  int digits[RADIX_TILE / WARP_SIZE];
#pragma unroll
  for (int s = 0; s < RADIX_TILE / WARP_SIZE; s++) {
    const i64 i = first + s * WARP_SIZE + lane;
    digits[s] = i < n ? (int)((keys[i] >> shift) & (RADIX_BUCKETS - 1)) : RADIX_BUCKETS;  // past n: none
  }
#pragma unroll
  for (int s = 0; s < RADIX_TILE / WARP_SIZE; s++) {
    const int digit = digits[s];
    unsigned same = __match_any_sync(0xffffffffu, digit);
    if (digit < RADIX_BUCKETS && lane == __ffs(same) - 1) in_bucket[digit] += __popc(same);
    __syncwarp();
  }
  for (int b = lane; b < RADIX_BUCKETS; b += WARP_SIZE)
    counts[(i64)b * radix_tiles(n) + blockIdx.x] = in_bucket[b];
}

// x[0, per_tile · tiles of n) becomes its exclusive scan, in place; *total gets the sum. One
// block.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
table_grad_scan_ints(int *__restrict__ x, i64 *__restrict__ total, i64 n, i64 per_tile) {
  __shared__ int part[SCAN_THREADS];
  const i64 count = per_tile * radix_tiles(n);
  const i64 per = (count + SCAN_THREADS - 1) / SCAN_THREADS, lo = threadIdx.x * per;
  const i64 hi = lo + per < count ? lo + per : count;
  int mine = 0;
  for (i64 k = lo; k < hi; k++) mine += x[k];
  part[threadIdx.x] = mine;
  __syncthreads();
  for (int off = 1; off < SCAN_THREADS; off *= 2) {  // Hillis-Steele, inclusive
    int o = threadIdx.x >= off ? part[threadIdx.x - off] : 0;
    __syncthreads();
    part[threadIdx.x] += o;
    __syncthreads();
  }
  int run = part[threadIdx.x] - mine;
  for (i64 k = lo; k < hi; k++) {
    int c = x[k];
    x[k] = run;
    run += c;
  }
  if (threadIdx.x == SCAN_THREADS - 1) *total = part[threadIdx.x];
}

// One stable pass: occurrence i of tile t goes to starts[digit * tiles + t] plus the number of
// the tile's earlier occurrences with its digit.
extern "C" __global__ void __launch_bounds__(32)
table_grad_radix_scatter(i64 *__restrict__ keys_out, int *__restrict__ vals_out,
                         const i64 *__restrict__ keys, const int *__restrict__ vals,
                         const int *__restrict__ starts, i64 n, i64 shift) {
  __shared__ int next[RADIX_BUCKETS];
  const int lane = threadIdx.x;
  for (int b = lane; b < RADIX_BUCKETS; b += WARP_SIZE)
    next[b] = starts[(i64)b * radix_tiles(n) + blockIdx.x];
  __syncwarp();
  const i64 first = (i64)blockIdx.x * RADIX_TILE;
  enum { STEPS = RADIX_TILE / WARP_SIZE, AHEAD = 8 };  // keys and values loaded 8 steps ahead
  i64 key_at[AHEAD];
  int val_at[AHEAD];
#pragma unroll
  for (int s = 0; s < AHEAD; s++) {
    const i64 i = first + s * WARP_SIZE + lane;
    key_at[s] = i < n ? keys[i] : 0;
    val_at[s] = i < n ? vals[i] : 0;
  }
#pragma unroll
  for (int s = 0; s < STEPS; s++) {
    const i64 i = first + s * WARP_SIZE + lane;
    const i64 key = key_at[s % AHEAD];
    const int val = val_at[s % AHEAD];
    if (s + AHEAD < STEPS) {
      const i64 j = i + AHEAD * WARP_SIZE;
      key_at[s % AHEAD] = j < n ? keys[j] : 0;
      val_at[s % AHEAD] = j < n ? vals[j] : 0;
    }
    int digit = i < n ? (int)((key >> shift) & (RADIX_BUCKETS - 1)) : RADIX_BUCKETS;
    unsigned same = __match_any_sync(0xffffffffu, digit);
    if (digit < RADIX_BUCKETS) {
      int at = next[digit] + __popc(same & radix_lanes_below(lane));
      keys_out[at] = key;
      vals_out[at] = val;
    }
    __syncwarp();
    if (digit < RADIX_BUCKETS && lane == __ffs(same) - 1) next[digit] += __popc(same);
    __syncwarp();
  }
}

__device__ __forceinline__ bool run_starts(const i64 *keys, i64 i, i64 n) {
  return i < n && (i == 0 || keys[i] != keys[i - 1]);
}

// runs[t]: the occurrences of tile t (of the sorted keys) that start a run of equal ids.
extern "C" __global__ void __launch_bounds__(32)
table_grad_runs_count(int *__restrict__ runs, const i64 *__restrict__ keys, i64 n) {
  const i64 first = (i64)blockIdx.x * RADIX_TILE;
  int in_tile = 0;
#pragma unroll 8
  for (int g = 0; g < RADIX_TILE; g += WARP_SIZE)
    in_tile += __popc(__ballot_sync(0xffffffffu, run_starts(keys, first + g + threadIdx.x, n)));
  if (threadIdx.x == 0) runs[blockIdx.x] = in_tile;
}

// Run r (from the scanned runs of the tiles): rows_tensor[1 + r] = its id, distinct_begin[r] =
// where it begins in the sorted order.
extern "C" __global__ void __launch_bounds__(32)
table_grad_runs_list(i64 *__restrict__ rows_tensor, int *__restrict__ distinct_begin,
                     const i64 *__restrict__ keys, const int *__restrict__ runs, i64 n) {
  const int lane = threadIdx.x;
  const i64 first = (i64)blockIdx.x * RADIX_TILE;
  int rank = runs[blockIdx.x];
#pragma unroll 8
  for (int g = 0; g < RADIX_TILE; g += WARP_SIZE) {
    i64 i = first + g + lane;
    bool starts = run_starts(keys, i, n);
    unsigned ballot = __ballot_sync(0xffffffffu, starts);
    if (starts) {
      int r = rank + __popc(ballot & radix_lanes_below(lane));
      rows_tensor[1 + r] = keys[i];  // the ids follow the count U
      distinct_begin[r] = (int)i;
    }
    rank += __popc(ballot);
  }
}

// distinct_count[r]: the length of run r, for r < U = rows_header[0].
extern "C" __global__ void __launch_bounds__(256)
table_grad_runs_length(int *__restrict__ distinct_count, const int *__restrict__ distinct_begin,
                       const i64 *__restrict__ rows_header, i64 n) {
  i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x, distinct = rows_header[0];
  if (r >= distinct) return;
  i64 end = r + 1 < distinct ? distinct_begin[r + 1] : n;
  distinct_count[r] = (int)(end - distinct_begin[r]);
}
