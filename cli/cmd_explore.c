/* cmd_explore.c: placeholder until written */
#include "cli/cli.h"
int cmd_explore(int argc, char **argv) { (void)argc; (void)argv; return 2; }
