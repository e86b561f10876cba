/*
 * launch_probe.c - a worker program for the launcher's integration tests.
 *
 *   launch_probe lines N       N lines on stdout and N on stderr, each written in
 *                              three pieces, to catch torn or mixed lines
 *   launch_probe trap FILE     appends "RANK got SIGNAME" to FILE on SIGTERM, SIGINT,
 *                              SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, then exits 0;
 *                              says "ready" on stdout
 *   launch_probe errorfile     writes a torchrun-style error file, exits 1
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *trap_file;
static volatile sig_atomic_t got;

static void on_sig(int sig) { got = sig; }

static void put(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

int main(int argc, char **argv) {
    const char *rank = getenv("RANK") ? getenv("RANK") : "?";
    if (argc >= 3 && !strcmp(argv[1], "lines")) {
        int n = atoi(argv[2]);
        char line[256];
        for (int i = 0; i < n; i++) {
            for (int fd = 1; fd <= 2; fd++) {
                int len = snprintf(line, sizeof line,
                                   "R%s %s L%d abcdefghijklmnopqrstuvwxyz0123456789 END\n", rank,
                                   fd == 1 ? "out" : "err", i);
                int a = len / 3, b = 2 * len / 3;
                put(fd, line, (size_t)a);
                put(fd, line + a, (size_t)(b - a));
                put(fd, line + b, (size_t)(len - b));
            }
        }
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "trap")) {
        trap_file = argv[2];
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sig;
        int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
        printf("ready\n");
        fflush(stdout);
        for (int t = 0; t < 3000; t++) { /* at most 30 s */
            if (got) {
                FILE *f = fopen(trap_file, "a");
                if (f) {
                    fprintf(f, "%s got SIG%s\n", rank, sigabbrev_np(got));
                    fclose(f);
                }
                return 0;
            }
            usleep(10000);
        }
        return 4;
    }
    if (argc >= 2 && !strcmp(argv[1], "errorfile")) {
        const char *path = getenv("TORCHELASTIC_ERROR_FILE");
        FILE *f = path ? fopen(path, "w") : NULL;
        if (!f) return 2;
        fprintf(f, "{\"message\": {\"message\": \"ValueError: bad batch\", \"extraInfo\": "
                   "{\"py_callstack\": \"Traceback (most recent call last):\\n  File "
                   "\\\"train.py\\\", line 7\\nValueError: bad batch on rank %s\", "
                   "\"timestamp\": \"1700000000\"}}}\n", rank);
        fclose(f);
        return 1;
    }
    fprintf(stderr, "usage: launch_probe lines N | trap FILE | errorfile\n");
    return 2;
}
