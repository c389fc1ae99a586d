// commands.h: the gemc commands that run a model. Each parses the words after its name
// (CliOptions.rest) itself, since its options are its own; global options given before the
// command (--arch, -q, --Werror) apply as well. docs/cli.md and docs/train.md document them.
// defines: cmd_train, cmd_data, cmd_emit, cmd_build, cmd_bench, cmd_tune,
//          cmd_launch
#ifndef GEMC_COMMANDS_H
#define GEMC_COMMANDS_H

#include "cli.h"

// gemc train FILE [options]: returns the exit code (internal_error.h).
int cmd_train(const CliOptions *o);
// gemc data convert MODEL.gem IN -o OUT [--sep tab|comma]
int cmd_data(const CliOptions *o);
// gemc emit FILE [--arch A] [--emit=cu|plan|ptx|cubin] [-o DIR]
int cmd_emit(const CliOptions *o);
// gemc build FILE [--arch sm_90a,sm_100a] -o MODEL.gemb
int cmd_build(const CliOptions *o);
// gemc bench gdpa [--act ACT] [--reps N] [--quick]: exits 1 with "no GPU: ..." without a GPU
int cmd_bench(const CliOptions *o);
// gemc tune FILE [--arch A] [--reps N] [--batch B]: exits 1 with "gemc tune needs a GPU: ..."
// without a GPU
int cmd_tune(const CliOptions *o);
// gemc launch -n N [--nnodes M --node-rank R --master HOST:PORT] train FILE [train options]:
// the exit code of the first rank that failed, or 0 (cmd_launch.c)
int cmd_launch(const CliOptions *o);

#endif
