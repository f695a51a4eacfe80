/*
 * replay.c - corpus replay for the fuzz targets: a main() that feeds every regular file of the
 * folders given on the command line, in name order, to the target's LLVMFuzzerTestOneInput.
 * Linked with each target's source into a normal (non-libFuzzer) executable and registered in
 * the 'format' suite, so saved corpora and past crash inputs run in CI under any compiler and
 * under the ASan/UBSan build. An empty or missing corpus folder fails the test, so a broken path
 * cannot pass silently.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Replay every regular file of folder; returns the count, or -1 when it cannot be listed. */
static int replay_folder(const char *folder) {
    struct dirent **ents;
    int n = scandir(folder, &ents, NULL, alphasort), done = 0;
    if (n < 0) {
        fprintf(stderr, "replay: cannot list %s\n", folder);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char *p = NULL;
        struct stat sb;
        if (asprintf(&p, "%s/%s", folder, ents[i]->d_name) > 0 && stat(p, &sb) == 0 &&
            S_ISREG(sb.st_mode)) {
            size_t len = 0;
            uint8_t *buf = tu_read_file(p, &len);
            if (!buf) {
                fprintf(stderr, "replay: cannot read %s\n", p);
                exit(1);
            }
            LLVMFuzzerTestOneInput(buf, len);
            free(buf);
            done++;
        }
        free(p);
        free(ents[i]);
    }
    free(ents);
    return done;
}

int main(int argc, char **argv) {
    int total = 0;
    for (int i = 1; i < argc; i++) {
        int n = replay_folder(argv[i]);
        if (n < 0) return 1;
        fprintf(stderr, "replay: %d inputs from %s\n", n, argv[i]);
        total += n;
    }
    if (total == 0) {
        fprintf(stderr, "replay: no corpus inputs given (usage: %s FOLDER...)\n", argv[0]);
        return 1;
    }
    return 0;
}
