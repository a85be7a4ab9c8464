/*
 * replay.c - a main() for the fuzz targets when they are not built with
 * libFuzzer: runs every input named on the command line (files, or
 * directories of files) through LLVMFuzzerTestOneInput once, in name
 * order. Arguments starting with '-' (libFuzzer options) are ignored, so
 * the same ctest command line serves both builds.
 *
 * Under the normal and the sanitizer builds this replays the seed corpus
 * and every saved crash as a regression test.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return -1;
        }
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap)
            break;
        cap *= 2;
        uint8_t *grown = realloc(buf, cap);
        if (!grown)
            free(buf);
        buf = grown;
    }
    fclose(f);
    /* An exact-size copy, as libFuzzer passes it. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv)
{
    int inputs = 0, failures = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (argv[i][0] == '-')
            continue;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            failures++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            failures += run_file(argv[i]) != 0;
            inputs++;
            continue;
        }
        struct dirent **names;
        int n = scandir(argv[i], &names, NULL, by_name);
        if (n < 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            failures++;
            continue;
        }
        for (int j = 0; j < n; j++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[j]->d_name);
            if (names[j]->d_name[0] != '.' && stat(path, &st) == 0 &&
                S_ISREG(st.st_mode)) {
                failures += run_file(path) != 0;
                inputs++;
            }
            free(names[j]);
        }
        free(names);
    }
    printf("replay: %d inputs, %d unreadable\n", inputs, failures);
    return failures ? 1 : 0;
}
