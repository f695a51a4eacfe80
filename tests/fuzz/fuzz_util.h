/*
 * fuzz_util.h - what the file-parser fuzz targets share (fuzz_config.c, fuzz_tokenizer.c,
 * fuzz_npy.c, fuzz_score_input.c, fuzz_prompts.c): an aborting property check, a private temp
 * folder removed at exit, file writing, and a capture of what a parser prints on stderr so a
 * target can check its message without flooding the fuzzer's log. Compiled into both the
 * libFuzzer binaries and the corpus replays (replay.c).
 */
#ifndef FLEXDIAG_TESTS_FUZZ_UTIL_H
#define FLEXDIAG_TESTS_FUZZ_UTIL_H

#include <stddef.h>

/* Abort naming the expression and detail (a message of the code under test, or "") when x is
 * false: libFuzzer saves the input as a crash, the replay test fails. */
#define FUZZ_CHECK(x, detail)                                                                      \
    do {                                                                                           \
        if (!(x)) fuzz_fail(__FILE__, __LINE__, #x, (detail));                                     \
    } while (0)

_Noreturn void fuzz_fail(const char *file, int line, const char *expr, const char *detail);

/* A new folder $TMPDIR/flexdiag-<tag>-XXXXXX (malloc'ed path), removed with its files at exit. */
char *fuzz_tempdir(const char *tag);
/* "<dir>/<name>", malloc'ed. */
char *fuzz_path(const char *dir, const char *name);
/* Replace path's contents with data[0..n). */
void fuzz_write(const char *path, const void *data, size_t n);

/* Send the stdio stream stderr to memory until fuzz_stderr_end. File descriptor 2 is left
 * alone, so sanitizer and libFuzzer reports still reach the log. */
void fuzz_stderr_begin(void);
/* Restore stderr; returns what was printed since fuzz_stderr_begin (NUL-terminated, valid
 * until the next fuzz_stderr_begin). */
const char *fuzz_stderr_end(void);

#endif /* FLEXDIAG_TESTS_FUZZ_UTIL_H */
