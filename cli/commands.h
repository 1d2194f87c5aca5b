/* The commands of the specmoe tool, one function per command file (cli/cmd_*.c). main.c's command
 * table points at them; each command file includes this header only so the compiler checks its
 * definition against the declaration. Commands never call each other. */
#ifndef SPECMOE_CLI_COMMANDS_H
#define SPECMOE_CLI_COMMANDS_H

int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_analyze(int argc, char **argv);
int cmd_ssmoe(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bingham_z(int argc, char **argv);
int cmd_rl(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_report(int argc, char **argv);
/* rl subcommands in their own files (cli/cmd_rl_train.c) */
int cmd_rl_train(int argc, char **argv);
int cmd_rl_render(int argc, char **argv);

#endif
