// version.h: gemc's version, written into artifacts and JIT cache keys and printed by --version.
// defines: GEMC_VERSION
#ifndef GEMC_VERSION_H
#define GEMC_VERSION_H

#define GEMC_VERSION "0.2.0"  // 0.2: ordered tile lists (4 ints an entry) in the plan

#endif
