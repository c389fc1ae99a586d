// artifact.h: the AOT artifact `gemc build FILE --arch sm_90a,sm_100a -o model.gemb` writes
// and `gemc train --artifact model.gemb` trains from without NVRTC. One file holds the gemc
// version, the model key and name, and per arch the plan text, the CUDA source and the cubin
// (codegen may lower differently for each arch).
//
// Format (little-endian): magic "GEMCART1", u32 format version, u32 section count, then each
// section as u32 tag, u32 CRC-32 of its data, u64 length, data; last a u32 CRC-32 of every
// byte before it. Tags: VERSION (the gemc version string), MODEL (u64 key + name), and per arch
// PLAN, SOURCE and CUBIN, each the arch string, a NUL, then the text or the image.
// docs/gpu.md describes it.
// defines: Artifact, ArtifactCubin, artifact_write, artifact_read, artifact_check, artifact_free
#ifndef GEMC_ARTIFACT_H
#define GEMC_ARTIFACT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { ARTIFACT_FORMAT = 1, ARTIFACT_MAX_ARCHS = 8 };

typedef struct ArtifactCubin {
  char arch[16];   // "sm_90a"
  char *plan_text; // plan_print's text for this arch
  char *source;    // the CUDA C for this arch
  void *image;     // the cubin
  size_t size;
} ArtifactCubin;

typedef struct Artifact {
  char gemc_version[32];
  uint64_t model_key;   // train_model_key of the IR it was built from
  char *model_name;
  ArtifactCubin cubins[ARTIFACT_MAX_ARCHS];
  int ncubins;
} Artifact;

// Writes atomically (temporary file, fsync, rename). The artifact's strings and images are
// only read.
bool artifact_write(const char *path, const Artifact *a, char *err, size_t err_size);
// Reads and verifies every checksum; a truncated, corrupted or foreign file is an error that
// says so. On success the artifact owns malloc'd copies (artifact_free).
bool artifact_read(const char *path, Artifact *a, char *err, size_t err_size);
void artifact_free(Artifact *a);

// Checks that `a` fits this run: built by `gemc_version`, for the model with `model_key`, and
// holding a cubin for `arch` (*cubin then points at it). Otherwise a clear message: which
// version or model it was built for, or which archs it has.
bool artifact_check(const Artifact *a, uint64_t model_key, const char *model_name,
                    const char *gemc_version, const char *arch, const ArtifactCubin **cubin,
                    char *err, size_t err_size);

#endif
