// plan_emu_kernels.cpp: every generated kernel of one model, compiled for the CPU
// (cuda_on_cpu.h, prelude_on_cpu.h) and looked up by name, for plan_emu.c. The script
// tests/codegen/plan_emu.sh writes model_kernels.inc (the source without its prelude and
// without extern "C") and kernel_table.inc ({"name", (void *)&name} per kernel).
#include "cuda_on_cpu.h"
#include "prelude_on_cpu.h"
#include "model_kernels.inc"

struct KernelEntry {
  const char *name;
  void *fn;
};
static const KernelEntry kernel_table[] = {
#include "kernel_table.inc"
    {nullptr, nullptr}};

extern "C" void *emu_find(const char *name) {
  for (const KernelEntry *k = kernel_table; k->name; k++)
    if (strcmp(k->name, name) == 0) return k->fn;
  return nullptr;
}

// Every kernel parameter is a pointer or an i64 (the INTEGER class of the x86-64 and AArch64
// calling conventions), so one call shape with 24 of them serves every kernel: a kernel ignores
// the ones past its own.
typedef void (*AnyKernel)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

extern "C" void emu_launch(void *fn, unsigned grid, unsigned threads, const uint64_t *a) {
  AnyKernel k = (AnyKernel)fn;
  launch(grid, threads, [&] {
    k(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15],
      a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23]);
  });
}
