// artifact.c: writes, reads, verifies and matches the AOT artifact of artifact.h.
#include "artifact.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32.h"
#include "file_io.h"

static const char MAGIC[8] = {'G', 'E', 'M', 'C', 'A', 'R', 'T', '1'};
enum { TAG_VERSION = 1, TAG_MODEL = 2, TAG_PLAN = 3, TAG_SOURCE = 4, TAG_CUBIN = 5 };

// --- writing ----------------------------------------------------------------------------

typedef struct Out {
  unsigned char *data;
  size_t len, cap;
} Out;

static void out_put(Out *o, const void *p, size_t n) {
  if (o->len + n > o->cap) {
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + n) cap *= 2;
    o->data = realloc(o->data, cap);
    o->cap = cap;
  }
  memcpy(o->data + o->len, p, n);
  o->len += n;
}
static void out_u32(Out *o, uint32_t v) {
  unsigned char b[4];
  for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
  out_put(o, b, 4);
}
static void out_u64(Out *o, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
  out_put(o, b, 8);
}
// A section from two pieces (either may be empty).
static void out_section(Out *o, uint32_t tag, const void *a, size_t na, const void *b, size_t nb) {
  out_u32(o, tag);
  out_u32(o, crc32_update(crc32_update(0, a, na), b, nb));
  out_u64(o, na + nb);
  out_put(o, a, na);
  out_put(o, b, nb);
}

bool artifact_write(const char *path, const Artifact *a, char *err, size_t err_size) {
  Out o = {0};
  out_put(&o, MAGIC, 8);
  out_u32(&o, ARTIFACT_FORMAT);
  out_u32(&o, (uint32_t)(2 + 3 * a->ncubins));
  out_section(&o, TAG_VERSION, a->gemc_version, strlen(a->gemc_version), NULL, 0);
  unsigned char key[8];
  for (int i = 0; i < 8; i++) key[i] = (unsigned char)(a->model_key >> (8 * i));
  const char *name = a->model_name ? a->model_name : "";
  out_section(&o, TAG_MODEL, key, 8, name, strlen(name));
  for (int i = 0; i < a->ncubins; i++) {
    const ArtifactCubin *c = &a->cubins[i];
    const char *plan = c->plan_text ? c->plan_text : "", *src = c->source ? c->source : "";
    out_section(&o, TAG_PLAN, c->arch, strlen(c->arch) + 1, plan, strlen(plan));
    out_section(&o, TAG_SOURCE, c->arch, strlen(c->arch) + 1, src, strlen(src));
    out_section(&o, TAG_CUBIN, c->arch, strlen(c->arch) + 1, c->image, c->size);
  }
  out_u32(&o, crc32_update(0, o.data, o.len));
  bool ok = file_write_atomic(path, o.data, o.len, err, err_size);
  free(o.data);
  return ok;
}

// --- reading ----------------------------------------------------------------------------

static uint32_t rd_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t rd_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static char *dup_text(const unsigned char *p, size_t n) {
  char *s = malloc(n + 1);
  memcpy(s, p, n);
  s[n] = 0;
  return s;
}

// The reader's cap: an artifact holds a plan and a cubin per arch, far below it.
static const int64_t MAX_ARTIFACT_BYTES = (int64_t)1 << 30;  // 1 GiB

static bool read_all(const char *path, unsigned char **data, size_t *n, char *reason,
                     size_t err_size) {
  char *text = NULL;
  if (!file_read_all(path, "artifact", MAX_ARTIFACT_BYTES, &text, n, reason, err_size))
    return false;
  *data = (unsigned char *)text;
  return true;
}

static bool corrupt(const char *path, const char *what, char *err, size_t err_size) {
  snprintf(err, err_size, "artifact %s is corrupted (%s); rebuild it with `gemc build`", path,
           what);
  return false;
}

bool artifact_read(const char *path, Artifact *a, char *err, size_t err_size) {
  memset(a, 0, sizeof *a);
  unsigned char *d;
  size_t n;
  if (!read_all(path, &d, &n, err, err_size)) return false;
  bool ok = false;
  if (n < 8 || memcmp(d, MAGIC, 8) != 0) {
    snprintf(err, err_size, "%s is not a gemc artifact (bad magic)", path);
    goto done;
  }
  if (n < 20) {
    corrupt(path, "truncated", err, err_size);
    goto done;
  }
  if (rd_u32(d + 8) != ARTIFACT_FORMAT) {
    snprintf(err, err_size, "artifact %s has format %u; this gemc reads format %d: rebuild it "
             "with this gemc's `gemc build`", path, rd_u32(d + 8), ARTIFACT_FORMAT);
    goto done;
  }
  if (rd_u32(d + n - 4) != crc32_update(0, d, n - 4)) {
    corrupt(path, "file checksum mismatch or truncated", err, err_size);
    goto done;
  }
  uint32_t nsections = rd_u32(d + 12);
  size_t pos = 16, end = n - 4;
  for (uint32_t s = 0; s < nsections; s++) {
    if (end - pos < 16) {
      corrupt(path, "section header past the end", err, err_size);
      goto done;
    }
    uint32_t tag = rd_u32(d + pos), crc = rd_u32(d + pos + 4);
    uint64_t len = rd_u64(d + pos + 8);
    pos += 16;
    if (len > end - pos) {
      corrupt(path, "section past the end", err, err_size);
      goto done;
    }
    const unsigned char *p = d + pos;
    if (crc32_update(0, p, len) != crc) {
      corrupt(path, "section checksum mismatch", err, err_size);
      goto done;
    }
    pos += len;
    switch (tag) {
    case TAG_VERSION:
      snprintf(a->gemc_version, sizeof a->gemc_version, "%.*s", (int)(len < 31 ? len : 31),
               (const char *)p);
      break;
    case TAG_MODEL:
      if (len < 8) {
        corrupt(path, "short model section", err, err_size);
        goto done;
      }
      a->model_key = rd_u64(p);
      free(a->model_name);
      a->model_name = dup_text(p + 8, len - 8);
      break;
    case TAG_PLAN:
    case TAG_SOURCE:
    case TAG_CUBIN: {
      const unsigned char *nul = memchr(p, 0, len);
      if (!nul || nul - p >= 16) {
        corrupt(path, "bad per-arch section", err, err_size);
        goto done;
      }
      ArtifactCubin *c = NULL;
      for (int i = 0; i < a->ncubins && !c; i++)
        if (strcmp(a->cubins[i].arch, (const char *)p) == 0) c = &a->cubins[i];
      if (!c) {
        if (a->ncubins == ARTIFACT_MAX_ARCHS) {
          corrupt(path, "too many archs", err, err_size);
          goto done;
        }
        c = &a->cubins[a->ncubins++];
        memcpy(c->arch, p, (size_t)(nul - p) + 1);
      }
      size_t bytes = len - (size_t)(nul - p) - 1;
      if (tag == TAG_CUBIN) {
        free(c->image);
        c->size = bytes;
        c->image = malloc(bytes ? bytes : 1);
        memcpy(c->image, nul + 1, bytes);
      } else {
        char **field = tag == TAG_PLAN ? &c->plan_text : &c->source;
        free(*field);
        *field = dup_text(nul + 1, bytes);
      }
      break;
    }
    default:
      break;  // a later format's optional section
    }
  }
  bool complete = a->gemc_version[0] && a->model_name;
  for (int i = 0; i < a->ncubins; i++)
    complete = complete && a->cubins[i].plan_text && a->cubins[i].source && a->cubins[i].image;
  if (!complete) {
    corrupt(path, "a required section is missing", err, err_size);
    goto done;
  }
  ok = true;
done:
  free(d);
  if (!ok) artifact_free(a);
  return ok;
}

void artifact_free(Artifact *a) {
  free(a->model_name);
  for (int i = 0; i < a->ncubins; i++) {
    free(a->cubins[i].image);
    free(a->cubins[i].plan_text);
    free(a->cubins[i].source);
  }
  memset(a, 0, sizeof *a);
}

bool artifact_check(const Artifact *a, uint64_t model_key, const char *model_name,
                    const char *gemc_version, const char *arch, const ArtifactCubin **cubin,
                    char *err, size_t err_size) {
  if (strcmp(a->gemc_version, gemc_version) != 0) {
    snprintf(err, err_size, "the artifact was built by gemc %s, this is gemc %s: rebuild it "
             "with `gemc build`", a->gemc_version, gemc_version);
    return false;
  }
  if (a->model_key != model_key) {
    snprintf(err, err_size, "the artifact was built for another model (%s, key %016llx), not "
             "%s (key %016llx): rebuild it from this model", a->model_name,
             (unsigned long long)a->model_key, model_name ? model_name : "this one",
             (unsigned long long)model_key);
    return false;
  }
  char have[160] = "";
  size_t used = 0;
  for (int i = 0; i < a->ncubins; i++) {
    if (strcmp(a->cubins[i].arch, arch) == 0) {
      if (cubin) *cubin = &a->cubins[i];
      return true;
    }
    int w = snprintf(have + used, sizeof have - used, "%s%s", i ? ", " : "", a->cubins[i].arch);
    if (w > 0 && (size_t)w < sizeof have - used) used += (size_t)w;
  }
  snprintf(err, err_size, "the artifact has no cubin for this GPU's arch %s (it has: %s); "
           "rebuild it with `gemc build --arch %s`", arch, a->ncubins ? have : "none", arch);
  return false;
}
