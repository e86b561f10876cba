/*
 * fuzz_file.h - what the file-parser fuzz targets share: a private folder made
 * once per process (in /dev/shm when there is one: a write per input costs
 * microseconds there) and a way to put the input there under the name the
 * parser looks for. Header-only: each target is built from its own list of
 * sources (Makefile, `make fuzz`).
 */
#ifndef DT_TESTS_FUZZ_FILE_H
#define DT_TESTS_FUZZ_FILE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

/* The folder, made on first use; logs quietened (a warning per input would be
 * most of the run's time). */
static const char *fuzz_dir(void) {
    static char dir[256];
    if (!dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(dir, sizeof dir, "%s/dtrun-fuzz-XXXXXX", base);
        if (!mkdtemp(dir)) abort();
        dt_log_set_level(DT_LOG_OFF);
    }
    return dir;
}

/* dir/name as a path (static buffer per call site is the caller's). */
static void fuzz_path(char *buf, size_t len, const char *name) {
    snprintf(buf, len, "%s/%s", fuzz_dir(), name);
}

/* Writes data to dir/name (replacing it); aborts on failure (the harness's fault). */
static void fuzz_write(const char *name, const void *data, size_t size) {
    char path[512];
    fuzz_path(path, sizeof path, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) abort();
    const char *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n <= 0) abort();
        p += n;
        size -= (size_t)n;
    }
    close(fd);
}

#endif /* DT_TESTS_FUZZ_FILE_H */
