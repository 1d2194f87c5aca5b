/* specmoe bingham-z: GrMoE's check of the Bingham normaliser (Sec. 6.4.4). It is a paper study, so
 * its parse/run/report live in experiments/grmoe/bingham.c; this file is its command. */
#include "commands.h"
#include "common.h"
#include "experiments/experiments.h"

int cmd_bingham_z(int argc, char **argv) { return exp_grmoe_bingham(argc, argv); }
