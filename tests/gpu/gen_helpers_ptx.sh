#!/bin/sh
# gen_helpers_ptx.sh: regenerates runtime/gpu/gpu_helpers_ptx.h from runtime/gpu/gpu_helpers.cu (needs
# nvcc and python3). Run it from the repository root after editing the .cu file.
set -e
nvcc -ptx -arch=compute_90 -o /tmp/gemc_helpers.ptx runtime/gpu/gpu_helpers.cu
python3 - <<'PY'
ptx = open('/tmp/gemc_helpers.ptx').read().split('\n')
head = open('runtime/gpu/gpu_helpers_ptx.h').read().split('static const char')[0]
body = ['static const char gpu_helpers_ptx[] ='] + [
    '    "' + l.replace('\\', '\\\\').replace('"', '\\"').replace('\t', '\\t') + '\\n"' for l in ptx]
body[-1] += ';'
open('runtime/gpu/gpu_helpers_ptx.h', 'w').write(head + '\n'.join(body) + '\n\n#endif\n')
PY
