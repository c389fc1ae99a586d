// batch_pipeline.c: the producer thread and its ring (batch_pipeline.h). One mutex guards the
// ring; one condition variable wakes whoever waits (the producer for a free item or a resume,
// the trainer for its item, a pause for the producer to go idle).
#include "batch_pipeline.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"
#include "clock.h"

enum { ITEM_FREE, ITEM_BUSY, ITEM_READY, ITEM_TAKEN };

struct BatchPipeline {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  PipelineItem *items;
  int depth;
  int64_t stride;
  int64_t next_cursor;     // the cursor the producer makes next
  uint64_t generation;     // bumped when the stream restarts: older items are dropped
  bool started, paused, stop;
  int busy;                // the producer is making an item
  PipelineProduce produce;
  void *ctx;
};

static PipelineItem *free_item(BatchPipeline *p) {
  for (int i = 0; i < p->depth; i++)
    if (p->items[i].state == ITEM_FREE) return &p->items[i];
  return NULL;
}

static void *producer_main(void *arg) {
  BatchPipeline *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    PipelineItem *it = NULL;
    while (!p->stop && (p->paused || !p->started || !(it = free_item(p))))
      pthread_cond_wait(&p->cv, &p->mu);
    if (p->stop) break;
    it->state = ITEM_BUSY;
    it->cursor = p->next_cursor;
    it->generation = p->generation;
    p->next_cursor += p->stride;
    p->busy++;
    pthread_mutex_unlock(&p->mu);
    it->err[0] = '\0';
    bool ok = p->produce(p->ctx, it->cursor, &it->batch, &it->staged, &it->make_s,
                         &it->stage_s, it->err, sizeof it->err);
    pthread_mutex_lock(&p->mu);
    p->busy--;
    it->ok = ok;
    it->state = it->generation == p->generation ? ITEM_READY : ITEM_FREE;
    pthread_cond_broadcast(&p->cv);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

BatchPipeline *pipeline_new(int depth, const Schema *s, int64_t B, int64_t stride,
                            PipelineProduce produce, void *ctx) {
  BatchPipeline *p = xcalloc(1, sizeof *p);
  p->depth = depth < 1 ? 1 : depth;
  p->stride = stride;
  p->produce = produce;
  p->ctx = ctx;
  p->items = xcalloc((size_t)p->depth, sizeof *p->items);
  for (int i = 0; i < p->depth; i++) batch_alloc(&p->items[i].batch, s, B);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  if (pthread_create(&p->thread, NULL, producer_main, p) != 0) {
    for (int i = 0; i < p->depth; i++) batch_free(&p->items[i].batch);
    free(p->items);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
    return NULL;
  }
  return p;
}

// The current generation's item of `cursor` (made or being made), or NULL.
static PipelineItem *find_item(BatchPipeline *p, int64_t cursor) {
  for (int i = 0; i < p->depth; i++) {
    PipelineItem *it = &p->items[i];
    if ((it->state == ITEM_BUSY || it->state == ITEM_READY) &&
        it->generation == p->generation && it->cursor == cursor)
      return it;
  }
  return NULL;
}

PipelineItem *pipeline_take(BatchPipeline *p, int64_t cursor, double *wait_s) {
  double t0 = monotonic_seconds();
  pthread_mutex_lock(&p->mu);
  p->paused = false;  // a take needs the producer
  PipelineItem *it;
  for (;;) {
    // Items made for cursors the trainer has passed will never be asked for (checked on every
    // wake: one still being made when the take began may have become ready since).
    for (int i = 0; i < p->depth; i++) {
      PipelineItem *x = &p->items[i];
      if (x->state == ITEM_READY && (x->generation != p->generation || x->cursor < cursor))
        x->state = ITEM_FREE;
    }
    if ((it = find_item(p, cursor)) && it->state == ITEM_READY) break;
    if (!it && !(p->started && p->next_cursor == cursor)) {
      // Not made, and not next: start the stream again at `cursor`.
      p->generation++;
      p->next_cursor = cursor;
      p->started = true;
      for (int i = 0; i < p->depth; i++)
        if (p->items[i].state == ITEM_READY) p->items[i].state = ITEM_FREE;
    }
    pthread_cond_broadcast(&p->cv);
    pthread_cond_wait(&p->cv, &p->mu);
  }
  it->state = ITEM_TAKEN;
  pthread_mutex_unlock(&p->mu);
  if (wait_s) *wait_s = monotonic_seconds() - t0;
  return it;
}

void pipeline_release(BatchPipeline *p, PipelineItem *it) {
  pthread_mutex_lock(&p->mu);
  it->state = ITEM_FREE;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void pipeline_pause(BatchPipeline *p) {
  pthread_mutex_lock(&p->mu);
  p->paused = true;
  while (p->busy > 0) pthread_cond_wait(&p->cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void pipeline_reset(BatchPipeline *p) {
  pthread_mutex_lock(&p->mu);
  p->generation++;
  p->started = false;
  for (int i = 0; i < p->depth; i++)
    if (p->items[i].state == ITEM_READY) p->items[i].state = ITEM_FREE;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void pipeline_resume(BatchPipeline *p) {
  pthread_mutex_lock(&p->mu);
  p->paused = false;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void pipeline_free(BatchPipeline *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  pthread_join(p->thread, NULL);
  for (int i = 0; i < p->depth; i++) {
    batch_free(&p->items[i].batch);
    gpu_staged_free(&p->items[i].staged);
  }
  free(p->items);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}
