/*
 * outdir.h - helpers of the scale-out and resume tests (test_cli_mpi.c, test_cli_resume.c):
 * comparing two `flexdiag generate --out` folders, running a command in the background and
 * killing it midway. Failures are cmocka failures naming the file and the difference.
 */
#ifndef FLEXDIAG_TEST_CLI_OUTDIR_H
#define FLEXDIAG_TEST_CLI_OUTDIR_H

#include <sys/types.h>

/* Folder dir/got holds what folder dir/want holds: the same PNGs (paths and bytes), results.jsonl with
 * the same records in the same order, equal except the timing fields block_s and
 * images_in_block (the wall time and size of the block that made an image differ between runs
 * by design), tokens.json byte for byte; and got has no part or temp record file left
 * (results.jsonl.part-*, tokens.json.part-*, *.tmp.*). */
void od_assert_same_outputs(const char *dir, const char *want, const char *got);

/* The command line of `flexdiag generate` on micro-janus on the CPU run in dir with args, after
 * launcher ("" or e.g. "mpirun -n 2 --oversubscribe"), stderr to dir/err.txt; malloc'ed. exec
 * makes the shell's pid the launcher's (od_spawn). */
char *od_generate_cmd(const char *dir, const char *launcher, const char *args);
/* Run it; its exit status. */
int od_generate(const char *dir, const char *launcher, const char *args);
/* dir/err.txt contains needle. */
void od_assert_err_has(const char *dir, const char *needle);

/* `sh -c cmd` in the background (stdin from /dev/null); its pid. */
pid_t od_spawn(const char *cmd);
/* Wait until path exists; fails the test when pid ends first or after a minute. */
void od_wait_for(const char *path, pid_t pid);
/* Wait for pid; its exit status as a shell reports it (128 + signal when killed). */
int od_wait(pid_t pid);

#endif /* FLEXDIAG_TEST_CLI_OUTDIR_H */
