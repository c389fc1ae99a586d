// clock.h: seconds on the monotonic clock, for timing and deadlines (never the wall date).
// defines: monotonic_seconds
#ifndef GEMC_CLOCK_H
#define GEMC_CLOCK_H

double monotonic_seconds(void);

#endif
