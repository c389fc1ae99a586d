// version.h: gemc's version, written into artifacts and JIT cache keys and printed by --version.
// defines: GEMC_VERSION
#ifndef GEMC_VERSION_H
#define GEMC_VERSION_H

#define GEMC_VERSION "0.1.0"

#endif
