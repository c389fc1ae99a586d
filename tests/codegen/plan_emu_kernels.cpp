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
// calling conventions), so one call shape with EMU_MAX_ARGS of them serves every kernel: a
// kernel ignores the ones past its own (the caller owns the stack arguments). plan_emu.c
// refuses a launch with more.
enum { EMU_MAX_ARGS = 96 };
typedef void (*AnyKernel)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

extern "C" int emu_max_args(void) { return EMU_MAX_ARGS; }

extern "C" void emu_launch(void *fn, unsigned grid, unsigned threads, unsigned smem,
                           const uint64_t *a) {
  AnyKernel k = (AnyKernel)fn;
  emu_poison_bytes = smem < sizeof emu_dynamic_smem ? smem : sizeof emu_dynamic_smem;
  launch(grid, threads, [&] {
    k(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
      a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15],
      a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23],
      a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31],
      a[32], a[33], a[34], a[35], a[36], a[37], a[38], a[39],
      a[40], a[41], a[42], a[43], a[44], a[45], a[46], a[47],
      a[48], a[49], a[50], a[51], a[52], a[53], a[54], a[55],
      a[56], a[57], a[58], a[59], a[60], a[61], a[62], a[63],
      a[64], a[65], a[66], a[67], a[68], a[69], a[70], a[71],
      a[72], a[73], a[74], a[75], a[76], a[77], a[78], a[79],
      a[80], a[81], a[82], a[83], a[84], a[85], a[86], a[87],
      a[88], a[89], a[90], a[91], a[92], a[93], a[94], a[95]);
  });
}
