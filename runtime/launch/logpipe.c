/*
 * logpipe.c - whole-line, prefixed forwarding of a worker's output stream.
 */
#include "runtime/launch/logpipe.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mem.h"

/* A batch of whole lines for one destination; flushed before it would pass PIPE_BUF. */
typedef struct batch {
    int fd;
    char buf[PIPE_BUF];
    size_t len;
} batch_t;

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return; /* console gone (EPIPE) or disk full: drop, never block the agent */
        }
        p += w;
        n -= (size_t)w;
    }
}

static void batch_flush(batch_t *b) {
    if (b->fd >= 0 && b->len) write_all(b->fd, b->buf, b->len);
    b->len = 0;
}

/* Appends one line made of (a, b) plus a prefix and '\n'. */
static void batch_line(batch_t *bt, const char *pre, size_t prelen, const char *a, size_t alen,
                       const char *b, size_t blen) {
    if (bt->fd < 0) return;
    size_t need = prelen + alen + blen + 1;
    if (bt->len + need > sizeof bt->buf) batch_flush(bt);
    if (need > sizeof bt->buf) { /* one long line: a single write of its own */
        char *tmp = dt_xmalloc(need);
        if (prelen) memcpy(tmp, pre, prelen);
        if (alen) memcpy(tmp + prelen, a, alen);
        if (blen) memcpy(tmp + prelen + alen, b, blen);
        tmp[need - 1] = '\n';
        write_all(bt->fd, tmp, need);
        free(tmp);
        return;
    }
    /* (memcpy with a NULL source is undefined even for 0 bytes: partial starts NULL) */
    if (prelen) memcpy(bt->buf + bt->len, pre, prelen);
    if (alen) memcpy(bt->buf + bt->len + prelen, a, alen);
    if (blen) memcpy(bt->buf + bt->len + prelen + alen, b, blen);
    bt->buf[bt->len + need - 1] = '\n';
    bt->len += need;
}

static void keep_tail(dt_logpipe_t *lp, const char *a, size_t alen, const char *b, size_t blen) {
    char *t = lp->tail[lp->tail_next];
    size_t w = DT_LOGPIPE_TAIL_WIDTH - 1;
    size_t na = alen < w ? alen : w;
    if (na) memcpy(t, a, na);
    size_t nb = blen < w - na ? blen : w - na;
    if (nb) memcpy(t + na, b, nb);
    t[na + nb] = '\0';
    lp->tail_next = (lp->tail_next + 1) % DT_LOGPIPE_TAIL_LINES;
    if (lp->tail_n < DT_LOGPIPE_TAIL_LINES) lp->tail_n++;
}

/* A status line is on the terminal (shared by every logpipe of the agent). */
static int status_shown;

static void clear_status(batch_t *con) {
    static const char erase[] = "\r\033[K";
    if (!status_shown || con->fd < 0) return;
    if (con->len + sizeof erase - 1 > sizeof con->buf) batch_flush(con);
    memcpy(con->buf + con->len, erase, sizeof erase - 1);
    con->len += sizeof erase - 1;
    status_shown = 0;
}

void dt_logpipe_init(dt_logpipe_t *lp, const char *prefix, int console_fd, int file_fd) {
    memset(lp, 0, sizeof *lp);
    lp->console_tty = console_fd >= 0 && isatty(console_fd);
    snprintf(lp->prefix, sizeof lp->prefix, "%s", prefix ? prefix : "");
    lp->prefix_len = strlen(lp->prefix);
    lp->console_fd = console_fd;
    lp->file_fd = file_fd;
}

static void emit(dt_logpipe_t *lp, batch_t *con, batch_t *file, const char *line, size_t n) {
    if (con->fd >= 0 && lp->console_tty) clear_status(con);
    batch_line(con, lp->prefix, lp->prefix_len, lp->partial, lp->plen, line, n);
    batch_line(file, "", 0, lp->partial, lp->plen, line, n);
    keep_tail(lp, lp->partial, lp->plen, line, n);
    lp->plen = 0;
    lp->lines++;
}

/* A '\r'-ended segment: drawn in place on a terminal, else an ordinary line. */
static void emit_status(dt_logpipe_t *lp, batch_t *con, batch_t *file, const char *line, size_t n) {
    if (!lp->console_tty) {
        emit(lp, con, file, line, n);
        return;
    }
    if (con->fd >= 0) {
        batch_flush(con);
        size_t need = 1 + lp->prefix_len + lp->plen + n + 3;
        char *tmp = dt_xmalloc(need);
        size_t o = 0;
        tmp[o++] = '\r';
        memcpy(tmp + o, lp->prefix, lp->prefix_len), o += lp->prefix_len;
        if (lp->plen) memcpy(tmp + o, lp->partial, lp->plen), o += lp->plen;
        if (n) memcpy(tmp + o, line, n), o += n;
        memcpy(tmp + o, "\033[K", 3), o += 3;
        write_all(con->fd, tmp, o);
        free(tmp);
        status_shown = 1;
    }
    lp->plen = 0;
}

void dt_logpipe_feed(dt_logpipe_t *lp, const char *buf, size_t len) {
    batch_t con = {.fd = lp->console_fd}, file = {.fd = lp->file_fd};
    if (len > 0 && lp->after_cr && buf[0] == '\n') { /* "\r\n" split across reads */
        buf++, len--;
    }
    lp->after_cr = 0;
    while (len > 0) {
        const char *nl = memchr(buf, '\n', len);
        const char *cr = memchr(buf, '\r', nl ? (size_t)(nl - buf) : len);
        if (cr && !(cr + 1 == nl)) { /* a status line (not "\r\n") */
            emit_status(lp, &con, &file, buf, (size_t)(cr - buf));
            len -= (size_t)(cr - buf) + 1;
            buf = cr + 1;
            if (len == 0) lp->after_cr = 1;
            continue;
        }
        if (cr) { /* "\r\n": an ordinary line end */
            emit(lp, &con, &file, buf, (size_t)(cr - buf));
            len -= (size_t)(nl - buf) + 1;
            buf = nl + 1;
            continue;
        }
        if (nl) {
            emit(lp, &con, &file, buf, (size_t)(nl - buf));
            len -= (size_t)(nl - buf) + 1;
            buf = nl + 1;
            continue;
        }
        /* No newline: keep the rest, cutting lines that grow past the limit. */
        size_t room = DT_LOGPIPE_MAX_LINE - lp->plen;
        if (len >= room) {
            emit(lp, &con, &file, buf, room);
            buf += room;
            len -= room;
            continue;
        }
        if (lp->plen + len > lp->pcap) {
            lp->pcap = lp->pcap ? lp->pcap * 2 : 256;
            while (lp->pcap < lp->plen + len) lp->pcap *= 2;
            lp->partial = dt_xrealloc(lp->partial, lp->pcap);
        }
        memcpy(lp->partial + lp->plen, buf, len);
        lp->plen += len;
        len = 0;
    }
    batch_flush(&con);
    batch_flush(&file);
}

void dt_logpipe_flush(dt_logpipe_t *lp) {
    if (lp->plen == 0) return;
    batch_t con = {.fd = lp->console_fd}, file = {.fd = lp->file_fd};
    emit(lp, &con, &file, "", 0);
    batch_flush(&con);
    batch_flush(&file);
}

void dt_logpipe_free(dt_logpipe_t *lp) {
    free(lp->partial);
    lp->partial = NULL;
    lp->plen = lp->pcap = 0;
}

size_t dt_logpipe_tail(const dt_logpipe_t *lp, char *out, size_t len) {
    size_t o = 0;
    if (len == 0) return 0;
    int start = (lp->tail_next - lp->tail_n + DT_LOGPIPE_TAIL_LINES) % DT_LOGPIPE_TAIL_LINES;
    for (int i = 0; i < lp->tail_n; i++) {
        const char *t = lp->tail[(start + i) % DT_LOGPIPE_TAIL_LINES];
        int n = snprintf(out + o, len - o, "%s\n", t);
        if (n < 0 || (size_t)n >= len - o) {
            o = len - 1;
            break;
        }
        o += (size_t)n;
    }
    out[o] = '\0';
    return o;
}
