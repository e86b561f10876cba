/*
 * logpipe.h - turns the byte stream of one worker's stdout or stderr into whole
 * lines, prefixed with the worker's rank for the console ("[rank3]:", or
 * "[host rank3]:" on multi-node runs) and unprefixed for its log file.
 *
 * Only whole lines are written, in batches of whole lines of at most PIPE_BUF
 * bytes per write(2), so lines never tear, even between agents sharing a
 * terminal. A line longer than DT_LOGPIPE_MAX_LINE is cut into pieces of that
 * size. The last few lines are kept for the failure summary.
 *
 * Status lines: a segment ended by '\r' (a progress bar, dtrun's live progress
 * line) is, on a terminal console, drawn in place ("\r" + prefix + text + erase
 * to end of line) and erased before the next whole line; on any other console it
 * is an ordinary line. Status lines never go to the log file or the tail. "\r\n"
 * is an ordinary line end.
 */
#ifndef DT_RUNTIME_LOGPIPE_H
#define DT_RUNTIME_LOGPIPE_H

#include <stddef.h>
#include <stdint.h>

#define DT_LOGPIPE_MAX_LINE (64 * 1024)
#define DT_LOGPIPE_TAIL_LINES 8
#define DT_LOGPIPE_TAIL_WIDTH 240

typedef struct dt_logpipe {
    char prefix[128];
    size_t prefix_len;
    int console_fd; /* -1: not shown on the console */
    int file_fd;    /* -1: no log file */
    char *partial;  /* bytes after the last newline seen */
    size_t plen, pcap;
    char tail[DT_LOGPIPE_TAIL_LINES][DT_LOGPIPE_TAIL_WIDTH];
    int tail_next, tail_n;
    uint64_t lines; /* whole lines seen */
    int console_tty; /* console_fd is a terminal: status lines drawn in place */
    int after_cr;    /* the last byte fed was a '\r' ending a status line */
} dt_logpipe_t;

/* console_fd / file_fd may be -1. The logpipe does not own or close them. */
void dt_logpipe_init(dt_logpipe_t *lp, const char *prefix, int console_fd, int file_fd);
/* Feeds bytes read from the worker; writes every line they complete. */
void dt_logpipe_feed(dt_logpipe_t *lp, const char *buf, size_t len);
/* End of stream: writes a last unterminated line, with a newline added. */
void dt_logpipe_flush(dt_logpipe_t *lp);
void dt_logpipe_free(dt_logpipe_t *lp);
/* The last lines kept (oldest first, each ending in '\n') into out; returns length. */
size_t dt_logpipe_tail(const dt_logpipe_t *lp, char *out, size_t len);

#endif /* DT_RUNTIME_LOGPIPE_H */
