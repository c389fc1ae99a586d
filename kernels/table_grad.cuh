// table_grad.cuh: the id bookkeeping of a table's sparse gradient, without float atomics, in
// time that grows with the batch's occurrences, never with the table's rows. The occurrences of
// a table's ids in one batch (every lookup, in use order, then position order) are sorted by
// id with a stable LSD radix sort of RADIX_BITS bits a pass (as many passes as the table's row
// count needs), their positions carried along, so each id's occurrences stay in occurrence
// order and the generated apply kernel sums every id's rows in the CPU executor's order. The
// generated `table_grad_gather_<table>` writes the input: keys = the ids, vals = 0, 1, 2, ...
// The plan zeroes a small sort state (counters, histograms, tile totals; SORT_STATE_INTS) first:
//   radix_histogram  every pass's 256 digit counts over all occurrences, in one launch
//   radix_pass       one launch a pass: each block takes the next tile of the occurrences,
//                    counts its digits, publishes its totals, adds the totals of the tiles
//                    before it (which started before it, so never wait on it), and scatters
//   runs             the runs of equal ids, in one launch the same way: U into the rows header,
//                    then the ids, and where each run begins (distinct_begin[U] = n)
// A block is 32 warps, and each warp walks its contiguous range of the tile 32 occurrences at a
// time in order: __match_any_sync finds the lanes with the same digit, and a lane's place among
// them is the count of lower lanes. Tiles, warps and lanes keep the occurrences' order, so every
// pass is stable; it is integer arithmetic in a fixed order, so reruns are bit-identical.
// Integer atomics only count (a tile's claim, histogram sums): their order changes no result.
// Each kernel's body is a __device__ function of the block's place and the launch's tile count,
// so that the lowering can run several tables' sorts in one launch a step (the tables of one
// backward are independent): a generated kernel gives each table its own range of blocks and
// calls these with that table's arguments (codegen/ops/lower_sparse.c, "one sort launch for
// several tables"). The extern "C" kernels below are the one-table launches.

// 8 bits a pass: a 4M-row table sorts in 3 passes. The lowering (codegen/ops/lower_sparse.c)
// reads RADIX_BITS and SORT_MAX_TILES from this line.
enum { RADIX_BITS = 8, RADIX_BUCKETS = 1 << RADIX_BITS, SORT_MAX_TILES = 128, SORT_MAX_PASSES = 8 };
enum {
  SORT_WARPS = 32, SORT_THREADS = SORT_WARPS * WARP_SIZE, SORT_AHEAD = 4,
  // The sort state, in ints: the tile counters (a pass's at [pass], the runs' after them; the
  // last, SORT_LONG_COUNT, counts the generated apply kernel's listed long runs), the
  // histograms [pass][digit], the runs' tile totals, then the passes' tile totals
  // [pass][tile][digit].
  SORT_COUNTERS = 16, SORT_LONG_COUNT = SORT_COUNTERS - 1, SORT_HISTOGRAMS = SORT_COUNTERS,
  SORT_RUN_TOTALS = SORT_HISTOGRAMS + SORT_MAX_PASSES * RADIX_BUCKETS,
  SORT_PASS_TOTALS = SORT_RUN_TOTALS + SORT_MAX_TILES
};
static_assert(SORT_MAX_PASSES < SORT_LONG_COUNT, "the passes' and the runs' counters come first");
#define SORT_PUBLISHED 0x80000000u  // a tile total's flag: written (totals are below 2^31)

__device__ __forceinline__ unsigned radix_lanes_below(int lane) { return (1u << lane) - 1u; }
__device__ __forceinline__ int radix_digit(i64 key, i64 shift) {
  return (int)((key >> shift) & (RADIX_BUCKETS - 1));
}

// The block's place in the order: the next tile, claimed from counter *next (the tiles before
// it were claimed by blocks already running). Then the warp's range [lo, hi) of it: the
// occurrences split evenly over `tiles` tiles of SORT_WARPS warps.
__device__ __forceinline__ int sort_claim_tile(int *next) {
  __shared__ int tile;
  if (threadIdx.x == 0) tile = atomicAdd(next, 1);
  __syncthreads();
  return tile;
}
__device__ __forceinline__ void sort_warp_range(i64 n, int tile, int tiles, i64 *lo, i64 *hi) {
  const i64 warps = (i64)tiles * SORT_WARPS, per = (n + warps - 1) / warps;
  const i64 at = ((i64)tile * SORT_WARPS + threadIdx.x / WARP_SIZE) * per;
  *lo = at < n ? at : n;
  *hi = at + per < n ? at + per : n;
}
// The sum of the published totals at first[t * stride] for t = start, start + step, ... below
// end, each waited for until it is written; 8 loads in flight before any wait.
__device__ __forceinline__ int sort_sum_totals(const int *first, int start, int end, int step,
                                               i64 stride) {
  enum { BATCH = 8 };
  int sum = 0;
  for (int t0 = start; t0 < end; t0 += BATCH * step) {
    unsigned v[BATCH];
#pragma unroll
    for (int j = 0; j < BATCH; j++) {
      const int t = t0 + j * step;
      v[j] = t < end ? *(const volatile unsigned *)&first[t * stride] : SORT_PUBLISHED;
    }
#pragma unroll
    for (int j = 0; j < BATCH; j++) {
      while (!(v[j] & SORT_PUBLISHED)) {
        __nanosleep(64);
        v[j] = *(const volatile unsigned *)&first[(t0 + j * step) * stride];
      }
      sum += (int)(v[j] & ~SORT_PUBLISHED);
    }
  }
  return sum;
}
__device__ __forceinline__ void sort_publish_total(int *total, int value) {
  *(volatile unsigned *)total = SORT_PUBLISHED | (unsigned)value;
}

// state[SORT_HISTOGRAMS + p * RADIX_BUCKETS + b] += the occurrences whose pass-p digit is b:
// block `block` of `blocks`, grid-striding.
__device__ __forceinline__ void radix_histogram_block(int *__restrict__ state,
                                                      const i64 *__restrict__ keys, i64 n,
                                                      i64 passes, int block, int blocks) {
  __shared__ int in_block[SORT_MAX_PASSES * RADIX_BUCKETS];
  for (int k = threadIdx.x; k < SORT_MAX_PASSES * RADIX_BUCKETS; k += SORT_THREADS) in_block[k] = 0;
  __syncthreads();
  const int lane = threadIdx.x % WARP_SIZE;
  const i64 stride = (i64)blocks * SORT_THREADS;
  // Warp-uniform steps (the match needs the whole warp); the lanes of one digit add once.
  for (i64 g = (i64)block * SORT_THREADS + threadIdx.x - lane; g < n; g += stride) {
    const i64 i = g + lane;
    const i64 key = i < n ? keys[i] : 0;
    for (int p = 0; p < passes; p++) {
      const int digit = i < n ? radix_digit(key, RADIX_BITS * p) : RADIX_BUCKETS;
      const unsigned same = __match_any_sync(0xffffffffu, digit);
      if (digit < RADIX_BUCKETS && lane == __ffs(same) - 1)
        atomicAdd(&in_block[p * RADIX_BUCKETS + digit], __popc(same));
    }
  }
  __syncthreads();
  for (int k = threadIdx.x; k < passes * RADIX_BUCKETS; k += SORT_THREADS)
    if (in_block[k]) atomicAdd(&state[SORT_HISTOGRAMS + k], in_block[k]);
}

extern "C" __global__ void __launch_bounds__(SORT_THREADS)
table_grad_radix_histogram(int *__restrict__ state, const i64 *__restrict__ keys, i64 n,
                           i64 passes) {
  radix_histogram_block(state, keys, n, passes, (int)blockIdx.x, (int)gridDim.x);
}

// One stable pass over digit `pass` (bits [8 pass, 8 pass + 8) of the key): one of `tiles`
// blocks, which takes the next tile.
__device__ __forceinline__ void radix_pass_tile(i64 *__restrict__ keys_out,
                                                int *__restrict__ vals_out,
                                                const i64 *__restrict__ keys,
                                                const int *__restrict__ vals,
                                                int *__restrict__ state, i64 n, i64 pass,
                                                int tiles) {
  // place[w][b]: warp w's count of digit b, then where its next occurrence of b goes.
  __shared__ int place[SORT_WARPS][RADIX_BUCKETS];
  __shared__ int digit_start[RADIX_BUCKETS], earlier[SORT_THREADS / RADIX_BUCKETS][RADIX_BUCKETS];
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const i64 shift = RADIX_BITS * pass;
  int *places = &place[0][0];
  for (int k = threadIdx.x; k < SORT_WARPS * RADIX_BUCKETS; k += SORT_THREADS) places[k] = 0;
  const int tile = sort_claim_tile(&state[pass]);  // (its __syncthreads orders the zeroing)
  i64 lo, hi;
  sort_warp_range(n, tile, tiles, &lo, &hi);
  // 1. the warp's digit counts, SORT_AHEAD steps of keys loaded before they are counted
  for (i64 g = lo; g < hi; g += SORT_AHEAD * WARP_SIZE) {
    int digit[SORT_AHEAD];
#pragma unroll
    for (int s = 0; s < SORT_AHEAD; s++) {
      const i64 i = g + s * WARP_SIZE + lane;
      digit[s] = i < hi ? radix_digit(keys[i], shift) : RADIX_BUCKETS;  // past hi: none
    }
#pragma unroll
    for (int s = 0; s < SORT_AHEAD; s++) {
      const unsigned same = __match_any_sync(0xffffffffu, digit[s]);
      if (digit[s] < RADIX_BUCKETS && lane == __ffs(same) - 1)
        place[warp][digit[s]] += __popc(same);
      __syncwarp();
    }
  }
  __syncthreads();
  // 2. per digit: the warps' exclusive scan, the tile's total published; the digit's start in
  // the output from the histogram (Hillis-Steele over the 256 digits)
  int *totals = state + SORT_PASS_TOTALS + ((i64)pass * tiles + tile) * RADIX_BUCKETS;
  if (threadIdx.x < RADIX_BUCKETS) {
    const int b = threadIdx.x;
    int run = 0;
    for (int w = 0; w < SORT_WARPS; w++) {
      const int c = place[w][b];
      place[w][b] = run;
      run += c;
    }
    sort_publish_total(&totals[b], run);
    digit_start[b] = state[SORT_HISTOGRAMS + pass * RADIX_BUCKETS + b];
  }
  __syncthreads();
  for (int off = 1; off < RADIX_BUCKETS; off *= 2) {  // inclusive
    const int b = threadIdx.x;
    const int o = b < RADIX_BUCKETS && b >= off ? digit_start[b - off] : 0;
    __syncthreads();
    if (b < RADIX_BUCKETS) digit_start[b] += o;
    __syncthreads();
  }
  // 3. the totals of the tiles before this one: thread (q, b) adds tiles q, q + 4, ... of digit b
  {
    const int b = threadIdx.x % RADIX_BUCKETS, q = threadIdx.x / RADIX_BUCKETS;
    const int *first = state + SORT_PASS_TOTALS + (i64)pass * tiles * RADIX_BUCKETS;
    earlier[q][b] =
        sort_sum_totals(first + b, q, tile, SORT_THREADS / RADIX_BUCKETS, RADIX_BUCKETS);
  }
  __syncthreads();
  if (threadIdx.x < RADIX_BUCKETS) {
    const int b = threadIdx.x;
    int base = digit_start[b] - state[SORT_HISTOGRAMS + pass * RADIX_BUCKETS + b];  // exclusive
    for (int q = 0; q < SORT_THREADS / RADIX_BUCKETS; q++) base += earlier[q][b];
    earlier[0][b] = base;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < SORT_WARPS * RADIX_BUCKETS; k += SORT_THREADS)
    places[k] += earlier[0][k % RADIX_BUCKETS];
  __syncthreads();
  // 4. every occurrence to its place, in order
  for (i64 g = lo; g < hi; g += SORT_AHEAD * WARP_SIZE) {
    i64 key[SORT_AHEAD];
    int val[SORT_AHEAD];
#pragma unroll
    for (int s = 0; s < SORT_AHEAD; s++) {
      const i64 i = g + s * WARP_SIZE + lane;
      key[s] = i < hi ? keys[i] : 0;
      val[s] = i < hi ? vals[i] : 0;
    }
#pragma unroll
    for (int s = 0; s < SORT_AHEAD; s++) {
      const int digit = g + s * WARP_SIZE + lane < hi ? radix_digit(key[s], shift) : RADIX_BUCKETS;
      const unsigned same = __match_any_sync(0xffffffffu, digit);
      if (digit < RADIX_BUCKETS) {
        const int at = place[warp][digit] + __popc(same & radix_lanes_below(lane));
        keys_out[at] = key[s];
        vals_out[at] = val[s];
      }
      __syncwarp();
      if (digit < RADIX_BUCKETS && lane == __ffs(same) - 1) place[warp][digit] += __popc(same);
      __syncwarp();
    }
  }
}

extern "C" __global__ void __launch_bounds__(SORT_THREADS)
table_grad_radix_pass(i64 *__restrict__ keys_out, int *__restrict__ vals_out,
                      const i64 *__restrict__ keys, const int *__restrict__ vals,
                      int *__restrict__ state, i64 n, i64 pass) {
  radix_pass_tile(keys_out, vals_out, keys, vals, state, n, pass, (int)gridDim.x);
}

__device__ __forceinline__ bool run_starts(const i64 *keys, i64 i, i64 hi) {
  return i < hi && (i == 0 || keys[i] != keys[i - 1]);
}

// The runs of equal ids of the sorted keys: rows_tensor[0] = U, rows_tensor[1 + r] = run r's
// id, distinct_begin[r] = where it begins, distinct_begin[U] = n. One of `tiles` blocks.
__device__ __forceinline__ void runs_tile(i64 *__restrict__ rows_tensor,
                                          int *__restrict__ distinct_begin,
                                          const i64 *__restrict__ keys, int *__restrict__ state,
                                          i64 n, int tiles) {
  __shared__ int before_warp[SORT_WARPS], before_tile;
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int tile = sort_claim_tile(&state[SORT_MAX_PASSES]);
  i64 lo, hi;
  sort_warp_range(n, tile, tiles, &lo, &hi);
  int in_warp = 0;
  for (i64 g = lo; g < hi; g += WARP_SIZE)
    in_warp += __popc(__ballot_sync(0xffffffffu, run_starts(keys, g + lane, hi)));
  if (lane == 0) before_warp[warp] = in_warp;
  __syncthreads();
  if (warp == 0) {  // the warps' exclusive scan, the tile's total, the tiles before it
    int run = 0;
    if (lane == 0) {
      for (int w = 0; w < SORT_WARPS; w++) {
        const int c = before_warp[w];
        before_warp[w] = run;
        run += c;
      }
      sort_publish_total(&state[SORT_RUN_TOTALS + tile], run);
    }
    __syncwarp();
    int earlier = sort_sum_totals(state + SORT_RUN_TOTALS, lane, tile, WARP_SIZE, 1);
    for (int off = 16; off > 0; off /= 2) earlier += __shfl_xor_sync(0xffffffffu, earlier, off);
    if (lane == 0) {
      before_tile = earlier;
      if (tile == tiles - 1) {  // the last tile knows U
        rows_tensor[0] = earlier + run;
        distinct_begin[earlier + run] = (int)n;
      }
    }
  }
  __syncthreads();
  int rank = before_tile + before_warp[warp];
  for (i64 g = lo; g < hi; g += WARP_SIZE) {
    const i64 i = g + lane;
    const bool starts = run_starts(keys, i, hi);
    const unsigned ballot = __ballot_sync(0xffffffffu, starts);
    if (starts) {
      const int r = rank + __popc(ballot & radix_lanes_below(lane));
      rows_tensor[1 + r] = keys[i];  // the ids follow the count U
      distinct_begin[r] = (int)i;
    }
    rank += __popc(ballot);
  }
}

extern "C" __global__ void __launch_bounds__(SORT_THREADS)
table_grad_runs(i64 *__restrict__ rows_tensor, int *__restrict__ distinct_begin,
                const i64 *__restrict__ keys, int *__restrict__ state, i64 n) {
  runs_tile(rows_tensor, distinct_begin, keys, state, n, (int)gridDim.x);
}
