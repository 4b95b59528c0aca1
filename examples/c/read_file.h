/* read_file.h: the whole of a file in a malloc'd buffer (for the examples). */
#ifndef KEEL_EXAMPLE_READ_FILE_H
#define KEEL_EXAMPLE_READ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The whole file at path in a malloc'd buffer (*len bytes), or NULL. */
static inline uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n)) != NULL) {
            if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else {
                *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

#endif
