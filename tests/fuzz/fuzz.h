/*
 * fuzz.h - what the fuzz targets share: the libFuzzer entry point, the
 * input framing of the targets that take several messages, and the check
 * that turns a broken invariant into a crash the fuzzer reports.
 *
 * One input may carry several messages (so that a put and the get that
 * reads it back can meet in one run). They are separated by FUZZ_SEP, four
 * bytes that start with 0xc1, the one byte msgpack never uses: a valid
 * message never contains it except inside a str or bin, and the seed
 * corpus avoids that. An input without a separator is one message.
 *
 * Each target is built twice over the same source: with clang's
 * -fsanitize=fuzzer (CTLRPC_FUZZ=ON, scripts/fuzz.sh) it is a libFuzzer
 * binary; in every other build it is linked with replay.c, a main() that
 * runs the seed corpus and the saved crashes once each, as a ctest.
 */
#ifndef CTLRPC_FUZZ_H
#define CTLRPC_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_SEP "\xc1" "CTL"
#define FUZZ_SEP_LEN 4

/* Most messages taken from one input; the rest of the input is ignored. */
#define FUZZ_MAX_MSGS 32

typedef struct fuzz_chunk {
    const uint8_t *data;
    size_t len;
} fuzz_chunk;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Split `data` at every FUZZ_SEP into at most `max` chunks (empty chunks
 * included). Returns the number of chunks. */
static inline size_t fuzz_split(const uint8_t *data, size_t len,
                                fuzz_chunk *out, size_t max)
{
    size_t n = 0;
    while (n < max) {
        const uint8_t *sep = len >= FUZZ_SEP_LEN
                                 ? memmem(data, len, FUZZ_SEP, FUZZ_SEP_LEN)
                                 : NULL;
        size_t take = sep ? (size_t)(sep - data) : len;
        out[n].data = data;
        out[n].len = take;
        n++;
        if (!sep)
            break;
        data = sep + FUZZ_SEP_LEN;
        len -= take + FUZZ_SEP_LEN;
    }
    return n;
}

/* A broken invariant: say which and abort, which libFuzzer reports as a
 * crash and saves the input that caused it. */
#define FUZZ_CHECK(cond, ...)                                                 \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "%s:%d: invariant broken: %s: ", __FILE__,        \
                    __LINE__, #cond);                                         \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
            abort();                                                          \
        }                                                                     \
    } while (0)

#endif /* CTLRPC_FUZZ_H */
