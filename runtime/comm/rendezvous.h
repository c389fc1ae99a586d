// rendezvous.h: how the ranks of a GPU world share NCCL's unique id before NCCL can connect
// them: rank 0 listens at MASTER_ADDR:MASTER_PORT (TCP), every other rank connects, says its
// rank and world size, and receives rank 0's bytes. torchrun and `gemc launch --via env` set
// those variables. Every step has a deadline, so a missing rank is an error, never a hang.
// defines: rendezvous_share
#ifndef GEMC_RENDEZVOUS_H
#define GEMC_RENDEZVOUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Rank 0 sends blob[size] to every other rank, which receives it into blob. A world of one
// does nothing. Every rank says `job` (RankEnv.job): rank 0 turns away a peer of another job
// (with a note on stderr) and goes on waiting for its own. False with a message (naming the
// address, and the ranks that did not come) when the deadline passes or a peer of this job
// sends something else.
bool rendezvous_share(const char *addr, int port, int rank, int world, uint64_t job, void *blob,
                      size_t size, double timeout_s, char *err, size_t err_size);

#endif
