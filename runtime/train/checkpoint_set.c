// checkpoint_set.c: the manifest and the shard files of checkpoint_set.h. The manifest is a
// checkpoint file itself (checkpoint.h's format, checksummed; its header's step is 0, as it
// holds no history): entries "set.step", "set.id" and "set.world", and one entry
// "shard:FILE" per rank holding that file's size.
#include "checkpoint_set.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"
#include "checkpoint.h"

void checkpoint_shard_file(char *buf, size_t size, const CkptSet *set, int rank) {
  snprintf(buf, size, "shard-%" PRId64 "-%016" PRIx64 "-%d-of-%d.gemc", set->step, set->id,
           rank, set->world);
}

static int64_t file_size(const char *dir, const char *file) {
  char path[4200];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", dir, file);
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (int64_t)st.st_size : -1;
}

// Removes every shard but those of the save `keep` (NULL: all).
static void remove_shards(const char *dir, const CkptSet *keep) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    long long step;
    unsigned long long id;
    int rank, world, used = 0;
    if (sscanf(e->d_name, "shard-%lld-%16llx-%d-of-%d.gemc%n", &step, &id, &rank, &world,
               &used) != 4 ||
        e->d_name[used] != '\0' || (keep && step == keep->step && id == keep->id))
      continue;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
}

bool checkpoint_set_commit(const char *dir, const char *model, uint64_t model_key,
                           const CkptSet *set, char *err, size_t err_size) {
  int world = set->world;
  int64_t step = set->step;
  CkptEntry *e = xcalloc((size_t)world + 3, sizeof *e);
  int64_t *sizes = xcalloc((size_t)world + 1, sizeof *sizes);
  char (*names)[128] = xcalloc((size_t)world, sizeof *names);
  bool ok = true;
  int64_t w = world, at = step;
  uint64_t id = set->id;
  e[0] = (CkptEntry){"set.world", &w, sizeof w, CKPT_ANY};
  e[world + 1] = (CkptEntry){"set.step", &at, sizeof at, CKPT_ANY};
  e[world + 2] = (CkptEntry){"set.id", &id, sizeof id, CKPT_ANY};
  for (int r = 0; ok && r < world; r++) {
    char file[96];
    checkpoint_shard_file(file, sizeof file, set, r);
    sizes[r] = file_size(dir, file);
    if (sizes[r] < 0)
      ok = fail(err, err_size, "the checkpoint set of step %" PRId64 " in %s has no %s: not "
                "made valid; the previous checkpoint stays", step, dir, file);
    snprintf(names[r], sizeof names[r], "shard:%s", file);
    e[r + 1] = (CkptEntry){names[r], &sizes[r], sizeof sizes[r], CKPT_ANY};
  }
  ok = ok && checkpoint_save_named(dir, CHECKPOINT_MANIFEST, model, model_key, 0, e,
                                   world + 3, err, err_size);
  if (ok) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, CHECKPOINT_FILE);
    unlink(path);
    remove_shards(dir, set);
  }
  free(e);
  free(sizes);
  free(names);
  return ok;
}

void checkpoint_set_remove(const char *dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, CHECKPOINT_MANIFEST);
  unlink(path);
  remove_shards(dir, NULL);
}

static bool any_shard(const char *dir) {
  DIR *d = opendir(dir);
  bool found = false;
  for (struct dirent *e; d && !found && (e = readdir(d)) != NULL;)
    found = strncmp(e->d_name, "shard-", 6) == 0;
  if (d) closedir(d);
  return found;
}

// Reads and checks the manifest: every shard there at its size.
static bool read_manifest(const char *dir, CkptSet *set, char *err, size_t err_size) {
  CkptInfo info;
  CkptFile *f = checkpoint_open_named(dir, CHECKPOINT_MANIFEST, &info, err, err_size);
  if (!f) return false;
  int64_t w = 0, step = -1;
  uint64_t id = 0;
  bool ok = checkpoint_read_entry(f, "set.world", &w, sizeof w, err, err_size) &&
            checkpoint_read_entry(f, "set.step", &step, sizeof step, err, err_size) &&
            checkpoint_read_entry(f, "set.id", &id, sizeof id, err, err_size);
  if (ok && (w < 1 || w > (1 << 20) || info.nentries != w + 3 || step < 0))
    ok = fail(err, err_size, "%s/%s is corrupt: a world of %" PRId64 " ranks with %d entries",
              dir, CHECKPOINT_MANIFEST, w, info.nentries);
  set->step = step;
  set->id = id;
  set->world = (int)w;
  for (int r = 0; ok && r < w; r++) {
    char file[80], name[112];
    int64_t want = 0;
    checkpoint_shard_file(file, sizeof file, set, r);
    snprintf(name, sizeof name, "shard:%s", file);
    ok = checkpoint_read_entry(f, name, &want, sizeof want, err, err_size);
    int64_t got = ok ? file_size(dir, file) : 0;
    if (ok && got != want)
      ok = fail(err, err_size, "the checkpoint set of step %" PRId64 " in %s (%" PRId64
                " ranks) %s %s%s: refused", step, dir, w,
                got < 0 ? "is missing" : "has a truncated or replaced", file,
                got < 0 ? "" : " (its size differs from the manifest's)");
  }
  checkpoint_close(f);
  checkpoint_info_free(&info);
  return ok;
}

int checkpoint_set_find(const char *dir, CkptSet *set, char *err, size_t err_size) {
  bool single = file_size(dir, CHECKPOINT_FILE) >= 0;
  bool manifest = file_size(dir, CHECKPOINT_MANIFEST) >= 0;
  if (!manifest) {
    if (single) return 0;
    if (any_shard(dir)) {
      fail(err, err_size, "%s holds shards of a distributed checkpoint but no %s: its save did "
           "not finish, so the set is not valid; refused", dir, CHECKPOINT_MANIFEST);
      return -1;
    }
    return 0;  // checkpoint_open says there is no checkpoint
  }
  if (!read_manifest(dir, set, err, err_size)) return -1;
  if (single) {
    CkptInfo info;
    if (checkpoint_info(dir, &info, err, err_size)) {
      bool newer = info.step > set->step;
      checkpoint_info_free(&info);
      if (newer) return 0;
    }
  }
  return 1;
}
