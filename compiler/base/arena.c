// arena.c: the bump allocator behind every AST and IR object. Memory comes in blocks of
// at least ARENA_BLOCK bytes; a request larger than that gets a block of its own. Nothing is
// freed until arena_free, which releases every block at once.
#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"           // defines: Arena, arena_alloc
#include "internal_error.h"  // defines: GEMC_ASSERT, gemc_internal_error

enum { ARENA_BLOCK = 64 * 1024 };

struct ArenaBlock {
  ArenaBlock *next;  // the older block
  size_t used, cap;  // bytes of data[] handed out, and available
  max_align_t data[];
};

static size_t align_up(size_t n) {
  size_t a = alignof(max_align_t);
  GEMC_ASSERT(n <= SIZE_MAX - a);
  return (n + a - 1) & ~(a - 1);
}

static ArenaBlock *new_block(size_t cap) {
  GEMC_ASSERT(cap <= SIZE_MAX - sizeof(ArenaBlock));
  ArenaBlock *b = calloc(1, sizeof(ArenaBlock) + cap);
  if (!b) gemc_internal_error(__FILE__, __LINE__, "out of memory");
  b->cap = cap;
  return b;
}

void *arena_alloc(Arena *a, size_t size) {
  size = align_up(size ? size : 1);
  ArenaBlock *b = a->head;
  if (!b || b->cap - b->used < size) {
    b = new_block(size > ARENA_BLOCK ? size : ARENA_BLOCK);
    // A big block goes behind the current one so the current one keeps filling up.
    if (a->head && size > ARENA_BLOCK) {
      b->next = a->head->next;
      a->head->next = b;
    } else {
      b->next = a->head;
      a->head = b;
    }
  }
  void *p = (char *)b->data + b->used;
  b->used += size;
  return p;  // zeroed: blocks come from calloc and are never reused
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
  GEMC_ASSERT(n < SIZE_MAX);
  char *p = arena_alloc(a, n + 1);
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

void *arena_grow(Arena *a, const void *old, size_t n, size_t cap, size_t elem) {
  GEMC_ASSERT(n <= cap);
  GEMC_ASSERT(elem == 0 || cap <= SIZE_MAX / elem);
  void *p = arena_alloc(a, cap * elem);
  if (n > 0) memcpy(p, old, n * elem);
  return p;
}

void arena_free(Arena *a) {
  ArenaBlock *b = a->head;
  while (b) {
    ArenaBlock *next = b->next;
    free(b);
    b = next;
  }
  a->head = NULL;
}
