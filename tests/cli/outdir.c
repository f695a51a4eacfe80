/*
 * outdir.c - comparing `flexdiag generate --out` folders and killing runs midway (outdir.h).
 *
 * The comparison is independent of the writer: PNGs as bytes (a resumed or distributed run
 * must reproduce them exactly, not just decode to the same pixels), results.jsonl parsed line by
 * line with jansson (the timing fields must be present in both and are the only ones left out),
 * tokens.json as bytes (records are copied verbatim, so order and formatting must match too).
 */
#include "cli/outdir.h"

#include <dirent.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

/* ---- files ---- */

/* Whether name is a part or temp record file a run must not leave behind. */
static int leftover(const char *name) {
    return strstr(name, ".tmp.") || !strncmp(name, "results.jsonl.part-", 19) ||
           !strncmp(name, "tokens.json.part-", 17);
}

/* Every *.png under root/rel, as paths relative to root, appended to list; fails on leftovers. */
static void walk(const char *root, const char *rel, json_t *list) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s%s%s", root, *rel ? "/" : "", rel);
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot list %s", dir);
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[4096], path[8200];
        snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        snprintf(path, sizeof path, "%s/%s", root, sub);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        size_t n = strlen(e->d_name);
        if (leftover(e->d_name)) fail_msg("%s is left over", path);
        if (S_ISDIR(st.st_mode)) walk(root, sub, list);
        else if (n > 4 && !strcmp(e->d_name + n - 4, ".png"))
            json_array_append_new(list, json_string(sub));
    }
    closedir(d);
}

/* want/name and got/name hold the same bytes. */
static void assert_same_file(const char *want, const char *got, const char *name) {
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/%s", want, name);
    snprintf(b, sizeof b, "%s/%s", got, name);
    size_t na = 0, nb = 0;
    char *da = tu_read_file(a, &na), *db = tu_read_file(b, &nb);
    if (!da || !db) fail_msg("cannot read %s or %s", a, b);
    if (na != nb || memcmp(da, db, na)) fail_msg("%s differs from %s", b, a);
    free(da);
    free(db);
}

/* ---- results.jsonl ---- */

/* The records of dir/results.jsonl without their timing fields, as a JSON array. */
static json_t *records(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    size_t n = 0;
    char *text = tu_read_file(path, &n);
    if (!text) fail_msg("cannot read %s", path);
    json_t *all = json_array();
    int no = 0;
    for (char *line = text, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) fail_msg("%s ends in a partial line", path);
        *nl = 0;
        no++;
        json_t *r = json_loads(line, 0, NULL);
        if (!r) fail_msg("%s line %d does not parse", path, no);
        if (json_object_del(r, "block_s") || json_object_del(r, "images_in_block"))
            fail_msg("%s line %d lacks a timing field", path, no);
        json_array_append_new(all, r);
    }
    free(text);
    return all;
}

static void assert_same_records(const char *want, const char *got) {
    json_t *a = records(want), *b = records(got);
    if (json_array_size(a) != json_array_size(b))
        fail_msg("%s/results.jsonl has %zu records, %s/results.jsonl %zu", got,
                 json_array_size(b), want, json_array_size(a));
    for (size_t i = 0; i < json_array_size(a); i++) {
        if (json_equal(json_array_get(a, i), json_array_get(b, i))) continue;
        char *x = json_dumps(json_array_get(a, i), JSON_COMPACT);
        char *y = json_dumps(json_array_get(b, i), JSON_COMPACT);
        fail_msg("results.jsonl record %zu differs:\n  %s\n  %s", i, x, y);
    }
    json_decref(a);
    json_decref(b);
}

void od_assert_same_outputs(const char *dir, const char *want_name, const char *got_name) {
    char want[4200], got[4200];
    snprintf(want, sizeof want, "%s/%s", dir, want_name);
    snprintf(got, sizeof got, "%s/%s", dir, got_name);
    json_t *pa = json_array(), *pb = json_array();
    walk(want, "", pa);
    walk(got, "", pb);
    if (json_array_size(pa) == 0) fail_msg("%s holds no PNG", want);
    if (json_array_size(pa) != json_array_size(pb))
        fail_msg("%s holds %zu PNGs, %s %zu", got, json_array_size(pb), want,
                 json_array_size(pa));
    for (size_t i = 0; i < json_array_size(pa); i++)
        assert_same_file(want, got, json_string_value(json_array_get(pa, i)));
    json_decref(pa);
    json_decref(pb);
    assert_same_records(want, got);
    assert_same_file(want, got, "tokens.json");
}

/* ---- processes ---- */

char *od_generate_cmd(const char *dir, const char *launcher, const char *args) {
    const char *bin = getenv("FLEXDIAG_BIN");
    assert_non_null(bin);
    char *cmd = NULL;
    assert_true(asprintf(&cmd, "cd '%s' && exec %s '%s' generate --cpu --arch micro-janus %s "
                               "2>err.txt", dir, launcher, bin, args) > 0);
    return cmd;
}

int od_generate(const char *dir, const char *launcher, const char *args) {
    char *cmd = od_generate_cmd(dir, launcher, args);
    int rc = tu_system("%s", cmd);
    free(cmd);
    return rc;
}

void od_assert_err_has(const char *dir, const char *needle) {
    char path[4200];
    snprintf(path, sizeof path, "%s/err.txt", dir);
    char *err = tu_read_file(path, NULL);
    assert_non_null(err);
    if (!strstr(err, needle)) fail_msg("stderr lacks '%s':\n%s", needle, err);
    free(err);
}

pid_t od_spawn(const char *cmd) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

void od_wait_for(const char *path, pid_t pid) {
    int status = 0;
    for (int i = 0; i < 30000; i++) { /* 2 ms apart: a minute */
        if (access(path, F_OK) == 0) return;
        if (waitpid(pid, &status, WNOHANG) == pid)
            fail_msg("the run ended (status %d) before %s appeared", status, path);
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    fail_msg("%s did not appear within a minute", path);
}

int od_wait(pid_t pid) {
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
