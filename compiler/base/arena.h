// arena.h: a bump allocator that owns every AST and IR object of one compilation.
// defines: Arena, arena_alloc, arena_strdup, arena_strndup, arena_free
#ifndef GEMC_ARENA_H
#define GEMC_ARENA_H

#include <stddef.h>

typedef struct ArenaBlock ArenaBlock;

typedef struct Arena {
  ArenaBlock *head;  // newest block first
} Arena;

// Zeroed memory that lives until arena_free. Never returns NULL (out of memory is an
// internal error).
void *arena_alloc(Arena *a, size_t size);
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
// Grows an array owned by the arena: returns a copy of `old` (n elements of `elem`)
// with room for `cap` elements.
void *arena_grow(Arena *a, const void *old, size_t n, size_t cap, size_t elem);
void arena_free(Arena *a);

#endif
