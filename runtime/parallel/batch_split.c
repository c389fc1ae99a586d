// batch_split.c: the token-balanced split of batch_split.h.
#include "batch_split.h"


int64_t batch_example_work(const Batch *b, int64_t i) {
  int64_t w = 1;
  for (int j = 0; j < b->njagged; j++) w += b->offsets[j][i + 1] - b->offsets[j][i];
  return w;
}

void batch_split(const Batch *b, int world, int64_t *first) {
  int64_t B = b->B, total = 0;
  for (int64_t i = 0; i < B; i++) total += batch_example_work(b, i);
  first[0] = 0;
  int64_t i = 0, done = 0;  // done: the work of examples [0, i)
  for (int r = 1; r < world; r++) {
    // The cut nearest to r/world of the work, leaving each rank at least one example.
    double target = (double)total * r / world;
    int64_t lo = first[r - 1] + 1, hi = B - (world - r);
    while (i < hi && (double)(done + batch_example_work(b, i)) <= target)
      done += batch_example_work(b, i++);
    int64_t cut = i;
    if (i < hi && (double)done + 0.5 * (double)batch_example_work(b, i) < target) {
      done += batch_example_work(b, i++);
      cut = i;
    }
    if (cut < lo) cut = lo;
    if (cut > hi) cut = hi;
    while (i < cut) done += batch_example_work(b, i++);
    while (i > cut) done -= batch_example_work(b, --i);
    first[r] = cut;
  }
  first[world] = B;
}
