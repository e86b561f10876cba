/*
 * test_logpipe.c - whole-line forwarding: prefixes on the console, none in the
 * file, lines split across reads joined, long lines cut, the stderr tail.
 */
#include <criterion/criterion.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/launch/logpipe.h"

/* Reads everything written so far to a pipe. */
/* Reads a terminal's master side until want bytes came or nothing more arrives for
 * 2 s: the writes reach the master as they were made, and one read may return only
 * the first of them. */
static size_t read_pty(int fd, char *buf, size_t cap, size_t want) {
    size_t n = 0;
    while (n < want && n < cap - 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 2000) <= 0) break;
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    return n;
}

static size_t slurp(int fd, char *buf, size_t cap) {
    size_t n = 0;
    ssize_t r;
    while (n < cap - 1 && (r = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)r;
    buf[n] = '\0';
    return n;
}

Test(logpipe, joins_split_lines_and_prefixes) {
    int con[2], file[2];
    cr_assert_eq(pipe(con), 0);
    cr_assert_eq(pipe(file), 0);
    dt_logpipe_t lp;
    dt_logpipe_init(&lp, "[rank3]:", con[1], file[1]);
    dt_logpipe_feed(&lp, "hel", 3);
    dt_logpipe_feed(&lp, "lo\nwor", 6);
    dt_logpipe_feed(&lp, "ld\n\nlast", 8);
    dt_logpipe_flush(&lp);
    close(con[1]);
    close(file[1]);
    char buf[1024];
    slurp(con[0], buf, sizeof buf);
    cr_assert_str_eq(buf, "[rank3]:hello\n[rank3]:world\n[rank3]:\n[rank3]:last\n");
    slurp(file[0], buf, sizeof buf);
    cr_assert_str_eq(buf, "hello\nworld\n\nlast\n");
    cr_assert_eq(lp.lines, 4);
    char tail[4096];
    dt_logpipe_tail(&lp, tail, sizeof tail);
    cr_assert_str_eq(tail, "hello\nworld\n\nlast\n");
    dt_logpipe_free(&lp);
    close(con[0]);
    close(file[0]);
}

Test(logpipe, tail_keeps_last_lines_and_long_lines_are_cut) {
    FILE *tmp = tmpfile();
    int fd = fileno(tmp);
    dt_logpipe_t lp;
    dt_logpipe_init(&lp, "[r]:", fd, -1);
    char line[32];
    for (int i = 0; i < 20; i++) {
        int n = snprintf(line, sizeof line, "line %d\n", i);
        dt_logpipe_feed(&lp, line, (size_t)n);
    }
    char tail[4096];
    dt_logpipe_tail(&lp, tail, sizeof tail);
    cr_assert(strncmp(tail, "line 12\n", 8) == 0, "tail starts with '%.10s'", tail);
    cr_assert(strstr(tail, "line 19\n"));
    cr_assert_null(strstr(tail, "line 11\n"));
    /* A line longer than the limit comes out in pieces, each prefixed. */
    size_t big = DT_LOGPIPE_MAX_LINE + 100;
    char *b = malloc(big);
    memset(b, 'x', big);
    dt_logpipe_feed(&lp, b, big);
    dt_logpipe_feed(&lp, "\n", 1);
    free(b);
    fflush(tmp);
    off_t end = lseek(fd, 0, SEEK_END);
    /* 20 short lines + 2 pieces: every prefix accounted for */
    size_t expect = 0;
    for (int i = 0; i < 20; i++) expect += 4 + (size_t)snprintf(line, sizeof line, "line %d\n", i);
    expect += 2 * 4 + big + 2;
    cr_assert_eq((size_t)end, expect);
    cr_assert_eq(lp.lines, 22);
    dt_logpipe_free(&lp);
    fclose(tmp);
}

Test(logpipe, carriage_returns_on_a_pipe_are_ordinary_lines) {
    int con[2], file[2];
    cr_assert_eq(pipe(con), 0);
    cr_assert_eq(pipe(file), 0);
    dt_logpipe_t lp;
    dt_logpipe_init(&lp, "[rank0]:", con[1], file[1]);
    dt_logpipe_feed(&lp, "10%\r20%\rdone\r", 13);
    dt_logpipe_feed(&lp, "\nwin\r\nend\n", 10); /* "\r\n" split across reads, and whole */
    close(con[1]);
    close(file[1]);
    char buf[1024];
    slurp(con[0], buf, sizeof buf);
    cr_assert_str_eq(buf, "[rank0]:10%\n[rank0]:20%\n[rank0]:done\n[rank0]:win\n[rank0]:end\n");
    slurp(file[0], buf, sizeof buf);
    cr_assert_str_eq(buf, "10%\n20%\ndone\nwin\nend\n");
    dt_logpipe_free(&lp);
    close(con[0]);
    close(file[0]);
}

#include <pty.h>

Test(logpipe, status_lines_on_a_terminal_are_drawn_in_place) {
    int master, slave, file[2];
    cr_assert_eq(openpty(&master, &slave, NULL, NULL, NULL), 0);
    cr_assert_eq(pipe(file), 0);
    struct termios tio; /* raw: bytes arrive as written */
    tcgetattr(slave, &tio);
    cfmakeraw(&tio);
    tcsetattr(slave, TCSANOW, &tio);
    dt_logpipe_t lp;
    dt_logpipe_init(&lp, "[rank0]:", slave, file[1]);
    cr_assert(lp.console_tty);
    dt_logpipe_feed(&lp, "step 1\rstep 2\r", 14);
    dt_logpipe_feed(&lp, "final\n", 6);
    close(file[1]);
    char buf[1024];
    const char *want = "\r[rank0]:step 1\033[K\r[rank0]:step 2\033[K\r\033[K[rank0]:final\n";
    read_pty(master, buf, sizeof buf, strlen(want));
    cr_assert_str_eq(buf, want);
    slurp(file[0], buf, sizeof buf);
    cr_assert_str_eq(buf, "final\n", "status lines stay out of the log file");
    char tail[256];
    dt_logpipe_tail(&lp, tail, sizeof tail);
    cr_assert_str_eq(tail, "final\n");
    dt_logpipe_free(&lp);
    close(master);
    close(slave);
    close(file[0]);
}
