/*
 * tokenize_run.c - `dtrun tokenize`'s pipeline (tokenize_run.h).
 *
 * One producer cursor (under the lock) cuts the inputs into pieces: a slice of a
 * text document cut at dt_tok_split_point, or a run of whole jsonl lines. Worker
 * threads take the next piece, encode it with their own dt_tok_enc_t and mark it
 * done; the calling thread writes done pieces strictly in order (so the shards
 * are the same bytes whatever the job count) and draws progress. At most `window`
 * pieces are in flight, which bounds memory; files are mapped, not read whole.
 * stdin is streamed: each of its pieces is read into a buffer of its own, cut at a
 * line end (jsonl) or a cut point (text) with the bytes after the cut carried to
 * the next, so `zstdcat corpus.jsonl.zst | dtrun tokenize -` holds a window of
 * pieces, never the whole stream.
 */
#include "runtime/tokenize/tokenize_run.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs_safe.h" /* defines: dt_fs_open_regular */
#include "common/mem.h"
#include "runtime/tokenize/shard.h"
#include "runtime/tokenize/tokenize_out.h"

#define PIECE_MAX (1u << 20)
#define PIECE_MIN (64u << 10)

typedef struct source {
    const char *path;
    int jsonl, is_stdin;
    const char *data; /* the whole input (mapped or read) */
    size_t len;
    void *map;        /* munmap(map, len) when set */
    int opened;       /* data valid */
    int cut_all;      /* every piece of it produced */
    int pending;      /* produced pieces not yet written */
    /* stdin: bytes read and not yet in a piece, end of stream, bytes cut so far */
    char *carry;
    size_t carry_len, carry_cap;
    int eof;
    uint64_t consumed;
} source;

typedef enum { PIECE_FREE, PIECE_BUSY, PIECE_DONE } piece_state;

typedef struct piece {
    piece_state state;
    uint64_t seq;
    int src;
    size_t off, len;  /* byte range in the source */
    char *buf;        /* stdin: the piece's own bytes (off is its offset in the stream) */
    uint64_t line;    /* jsonl: line number of its first line (1-based) */
    int doc_start;    /* text: the piece begins the document */
    dt_tok_ids ids;
    dt_tok_mask mask; /* --chat: a byte per id */
    uint64_t docs, empty_docs;
    uint64_t invalid;
    char first_invalid[512];
    dt_status_t st;
    char err[1024];
} piece;

typedef struct run {
    const dt_tokenize_opts *o;
    source *srcs;
    piece *slots;
    int window;
    size_t piece_bytes;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    /* producer cursor */
    int cur;          /* source being cut */
    size_t pos;       /* next byte in it */
    uint64_t line;    /* jsonl: line number at pos */
    uint64_t produced, written;
    int exhausted;    /* no more pieces */
    int stop;         /* an error or a cancel: workers leave */
    double produce_s; /* time spent cutting pieces (under the lock: serial) */
    dt_status_t prod_st;
    char prod_err[1024];
} run;

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Reads stdin until s->carry holds at least `want` bytes or the stream ends.
 * Polls `cancel` every 100 ms: a signal may land on another thread and leave
 * this read blocked. */
static dt_status_t stdin_fill(source *s, size_t want, volatile sig_atomic_t *cancel) {
    while (!s->eof && s->carry_len < want) {
        if (s->carry_cap < want + (1u << 16)) {
            s->carry_cap = want + (1u << 16);
            s->carry = dt_xrealloc(s->carry, s->carry_cap);
        }
        if (cancel && *cancel) return dt_error(DT_STATUS_CANCELED, "stdin: stopped by a signal while reading");
        struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
        int pr = poll(&pfd, 1, 100);
        if (pr == 0 || (pr < 0 && errno == EINTR)) continue;
        ssize_t k = read(STDIN_FILENO, s->carry + s->carry_len, s->carry_cap - s->carry_len);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return dt_error(DT_STATUS_IO, "stdin: read failed: %s", strerror(errno));
        if (k == 0) s->eof = 1;
        s->carry_len += (size_t)k;
    }
    return DT_STATUS_OK;
}

/* Maps a file (stdin is read piece by piece: produce_stdin). */
static dt_status_t source_open(source *s) {
    if (s->is_stdin) {
        s->data = "";
    } else {
        /* a FIFO, device or directory is refused without blocking (stdin is "-") */
        int fd;
        struct stat sb;
        DT_CHECK(dt_fs_open_regular(s->path, O_RDONLY | O_CLOEXEC, 0, &fd, &sb));
        s->len = (size_t)sb.st_size;
        if (s->len > 0) {
            void *m = mmap(NULL, s->len, PROT_READ, MAP_PRIVATE, fd, 0);
            if (m == MAP_FAILED) {
                close(fd);
                return dt_error(DT_STATUS_IO, "%s: mmap failed: %s", s->path, strerror(errno));
            }
            madvise(m, s->len, MADV_SEQUENTIAL);
            s->map = m;
            s->data = m;
        } else {
            s->data = "";
        }
        close(fd);
    }
    s->opened = 1;
    return DT_STATUS_OK;
}

static void source_close(source *s) {
    if (s->map) munmap(s->map, s->len);
    free(s->carry);
    s->carry = NULL;
    s->carry_len = s->carry_cap = 0;
    s->map = NULL;
    s->data = NULL;
    s->opened = 0;
}

/* The next piece of stdin into p (lock held): 1, or 0 at the end of the stream
 * (or on a read error, in r->prod_st). */
static int produce_stdin(run *r, source *s, piece *p) {
    const dt_tokenize_opts *o = r->o;
    size_t want = r->piece_bytes + r->piece_bytes / 2, cut = 0;
    for (;;) {
        dt_status_t st = stdin_fill(s, want, o->cancel);
        if (st != DT_STATUS_OK) {
            r->prod_st = st;
            snprintf(r->prod_err, sizeof r->prod_err, "%s", dt_error_detail());
            return 0;
        }
        if (s->eof) {
            cut = s->carry_len;
            break;
        }
        if (s->jsonl) { /* the last whole line in the buffer */
            const char *nl = s->carry + s->carry_len;
            while (nl > s->carry && nl[-1] != '\n') nl--;
            cut = (size_t)(nl - s->carry);
        } else {
            cut = dt_tok_split_point(o->tok, s->carry, s->carry_len, r->piece_bytes);
            if (cut == s->carry_len) cut = 0; /* no cut point yet: it may be in what follows */
        }
        if (cut > 0) break;
        if (s->carry_len >= DT_TOKENIZE_STDIN_STRETCH_MAX) { /* bounded memory: refuse, never hold it all */
            if (s->jsonl)
                r->prod_st = dt_error(DT_STATUS_INVALID, "stdin: line %llu is longer than %u MiB (a pipe is read in "
                                      "bounded memory)", (unsigned long long)r->line,
                                      DT_TOKENIZE_STDIN_STRETCH_MAX >> 20);
            else
                r->prod_st = dt_error(DT_STATUS_INVALID, "stdin: %u MiB from byte %llu on without a point where the "
                                      "text can be cut without changing the ids (a pipe is read in bounded memory): "
                                      "give it as a file, or as documents (--format jsonl)",
                                      DT_TOKENIZE_STDIN_STRETCH_MAX >> 20, (unsigned long long)s->consumed);
            snprintf(r->prod_err, sizeof r->prod_err, "%s", dt_error_detail());
            return 0;
        }
        want = s->carry_len * 2; /* a line or a stretch without a cut point longer than the buffer */
        if (want > DT_TOKENIZE_STDIN_STRETCH_MAX) want = DT_TOKENIZE_STDIN_STRETCH_MAX;
    }
    /* A text document is a piece even when empty (counted as such); a jsonl
     * stream's end is not. */
    if (cut == 0 && (s->jsonl || s->consumed > 0)) return 0;
    memset(p, 0, sizeof *p);
    p->src = r->cur;
    p->buf = dt_xmalloc(cut + 1);
    memcpy(p->buf, s->carry, cut);
    memmove(s->carry, s->carry + cut, s->carry_len - cut);
    s->carry_len -= cut;
    p->off = (size_t)s->consumed;
    p->len = cut;
    p->line = r->line;
    p->doc_start = s->consumed == 0;
    if (s->jsonl)
        for (const char *q = p->buf, *end = p->buf + cut; (q = memchr(q, '\n', (size_t)(end - q))); q++) r->line++;
    s->consumed += cut;
    s->pending++;
    return 1;
}

/* The next piece at the cursor into p (lock held). Returns 0 when none is left. */
static int produce(run *r, piece *p) {
    const dt_tokenize_opts *o = r->o;
    while (r->cur < o->n_inputs) {
        source *s = &r->srcs[r->cur];
        if (!s->opened) {
            dt_status_t st = source_open(s);
            if (st != DT_STATUS_OK) {
                r->prod_st = st;
                snprintf(r->prod_err, sizeof r->prod_err, "%s", dt_error_detail());
                return 0;
            }
            r->pos = 0;
            r->line = 1;
        }
        if (s->is_stdin) {
            if (produce_stdin(r, s, p)) return 1;
            if (r->prod_st != DT_STATUS_OK) return 0;
            s->cut_all = 1;
            if (s->pending == 0) source_close(s);
            r->cur++;
            continue;
        }
        size_t rem = s->len - r->pos;
        /* A text document is a piece even when empty (it is counted as such);
         * a jsonl file's end is not. */
        if (rem == 0 && (s->jsonl || r->pos > 0)) {
            s->cut_all = 1;
            if (s->pending == 0) source_close(s);
            r->cur++;
            continue;
        }
        size_t cut = rem;
        const char *at = s->data + r->pos;
        if (s->jsonl) {
            if (rem > r->piece_bytes) {
                const char *nl = memchr(at + r->piece_bytes - 1, '\n', rem - r->piece_bytes + 1);
                cut = nl ? (size_t)(nl - at) + 1 : rem;
            }
        } else if (rem > r->piece_bytes + r->piece_bytes / 2) {
            cut = dt_tok_split_point(o->tok, at, rem, r->piece_bytes);
        }
        memset(p, 0, sizeof *p);
        p->src = r->cur;
        p->off = r->pos;
        p->len = cut;
        p->line = r->line;
        p->doc_start = r->pos == 0;
        if (s->jsonl)
            for (const char *q = at, *end = at + cut; (q = memchr(q, '\n', (size_t)(end - q))); q++) r->line++;
        r->pos += cut;
        s->pending++;
        if (r->pos == s->len) {
            /* Leaving it: the next call moves on (and closes it once written). */
            s->cut_all = 1;
            r->cur++;
        }
        return 1;
    }
    return 0;
}

/* The offset of the first byte of text that is not part of valid UTF-8 (len if none). */
static size_t first_invalid_utf8(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 && c >= 0xC2 ? 2 : (c >> 4) == 0xE ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (n == 0 || i + n > len) return i;
        for (size_t k = 1; k < n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        if (n == 3 && ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] >= 0xA0))) return i;
        if (n == 4 && ((c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] >= 0x90))) return i;
        i += n;
    }
    return len;
}

/* Adds what the encoder counted as invalid UTF-8 during one encode call of
 * text[0..len). The encoder's first offset is its first ever, so once it has seen
 * some, the piece's first is found by scanning (rare: only text with invalid bytes). */
static void note_invalid(piece *p, const dt_tok_stats *before, const dt_tok_stats *after, const char *path,
                         const char *text, size_t len, uint64_t base, uint64_t line) {
    uint64_t n = after->invalid_utf8 - before->invalid_utf8;
    if (n == 0) return;
    if (p->invalid == 0) {
        if (line) {
            snprintf(p->first_invalid, sizeof p->first_invalid, "%s:line %llu", path, (unsigned long long)line);
        } else {
            uint64_t at = before->invalid_utf8 == 0 && after->first_invalid_offset >= 0
                              ? (uint64_t)after->first_invalid_offset
                              : (uint64_t)first_invalid_utf8((const unsigned char *)text, len);
            snprintf(p->first_invalid, sizeof p->first_invalid, "%s:offset %llu", path,
                     (unsigned long long)(base + at));
        }
    }
    p->invalid += n;
}

static void piece_fail(piece *p, dt_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void piece_fail(piece *p, dt_status_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    p->st = st;
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
}

/* 1 when the string `field` of the JSON line holds a \u0000 escape: cJSON decodes it
 * to a NUL, which ends `parsed` (its value) early. Only lines with such an escape
 * outside a \\ pair are parsed again, with each one made \u0001: a longer value
 * then is one that held a NUL. */
static int text_has_nul(const char *line, size_t len, const char *field, const char *parsed) {
    char *copy = NULL;
    for (size_t i = 0; i + 1 < len; i++) {
        if (line[i] != '\\') continue;
        if (line[i + 1] == 'u' && i + 6 <= len && !memcmp(line + i + 2, "0000", 4)) {
            if (!copy) copy = memcpy(dt_xmalloc(len), line, len);
            copy[i + 5] = '1';
        }
        i++; /* the escaped character */
    }
    if (!copy) return 0;
    cJSON *j = cJSON_ParseWithLength(copy, len);
    const cJSON *f = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, field) : NULL;
    int nul = cJSON_IsString(f) && strlen(f->valuestring) != strlen(parsed);
    cJSON_Delete(j);
    free(copy);
    return nul;
}

/* Encodes one jsonl line (a document) into p; blank lines are skipped. */
static void encode_jsonl_line(run *r, dt_tok_enc_t *e, piece *p, const char *path, const char *line, size_t len,
                              uint64_t lineno) {
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++;
    if (i == len) return;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    if (!j) {
        const char *ep = cJSON_GetErrorPtr();
        unsigned long long col = ep && ep >= line && ep <= line + len ? (unsigned long long)(ep - line) + 1 : 1;
        piece_fail(p, DT_STATUS_FORMAT, "%s:%llu: not a JSON line (parse error near column %llu)", path,
                   (unsigned long long)lineno, col);
        return;
    }
    for (; end && end < line + len; end++)
        if (*end != ' ' && *end != '\t' && *end != '\r') {
            piece_fail(p, DT_STATUS_FORMAT, "%s:%llu: trailing characters after the JSON value", path,
                       (unsigned long long)lineno);
            cJSON_Delete(j);
            return;
        }
    if (r->o->chat_mode) {
        size_t n0 = p->ids.n;
        dt_status_t st = cJSON_IsObject(j) ? dt_tokenize_chat_doc(r->o, e, j, &p->ids, &p->mask)
                                           : dt_error(DT_STATUS_FORMAT, "not a JSON object");
        if (st != DT_STATUS_OK) piece_fail(p, st, "%s:%llu: %s", path, (unsigned long long)lineno, dt_error_detail());
        else if (p->ids.n > n0) p->docs++;
        else p->empty_docs++;
        cJSON_Delete(j);
        return;
    }
    const cJSON *f = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, r->o->field) : NULL;
    if (!cJSON_IsString(f)) {
        piece_fail(p, DT_STATUS_FORMAT,
                   "%s:%llu: %s \"%s\" (each line must be a JSON object with that string%s)",
                   path, (unsigned long long)lineno,
                   !cJSON_IsObject(j) ? "not an object, so no field" : f ? "a non-string field" : "no field",
                   r->o->field, r->o->field_hint ? r->o->field_hint : "");
        cJSON_Delete(j);
        return;
    }
    /* valuestring is NUL-terminated: a \u0000 inside it would end the document
     * there, silently. Refused, naming the line. */
    if (text_has_nul(line, len, r->o->field, f->valuestring)) {
        piece_fail(p, DT_STATUS_FORMAT, "%s:%llu: field \"%s\" holds a \\u0000 (a NUL character): refusing to cut "
                   "the document there (remove or replace it)", path, (unsigned long long)lineno, r->o->field);
        cJSON_Delete(j);
        return;
    }
    size_t n = strlen(f->valuestring);
    if (n == 0) {
        p->empty_docs++;
    } else {
        dt_tok_ids_push(&p->ids, r->o->doc_token);
        dt_tok_stats before = dt_tok_enc_stats(e), after;
        dt_status_t st = dt_tok_encode(e, f->valuestring, n, 1, &p->ids);
        if (st != DT_STATUS_OK) {
            piece_fail(p, st, "%s:%llu: %s", path, (unsigned long long)lineno, dt_error_detail());
        } else {
            after = dt_tok_enc_stats(e);
            note_invalid(p, &before, &after, path, f->valuestring, n, 0, lineno);
            p->docs++;
        }
    }
    cJSON_Delete(j);
}

static void encode_piece(run *r, dt_tok_enc_t *e, piece *p) {
    const source *s = &r->srcs[p->src];
    const char *text = p->buf ? p->buf : s->data + p->off;
    const char *path = s->is_stdin ? "stdin" : s->path;
    if (s->jsonl) {
        uint64_t lineno = p->line;
        const char *q = text, *end = text + p->len;
        while (q < end && p->st == DT_STATUS_OK) {
            const char *nl = memchr(q, '\n', (size_t)(end - q));
            const char *le = nl ? nl : end;
            encode_jsonl_line(r, e, p, path, q, (size_t)(le - q), lineno++);
            q = nl ? nl + 1 : end;
        }
        return;
    }
    if (p->len == 0) { /* an empty document */
        p->empty_docs++;
        return;
    }
    if (p->doc_start) {
        dt_tok_ids_push(&p->ids, r->o->doc_token);
        p->docs++;
    }
    dt_tok_stats before = dt_tok_enc_stats(e), after;
    dt_status_t st = dt_tok_encode(e, text, p->len, p->doc_start, &p->ids);
    if (st != DT_STATUS_OK) {
        piece_fail(p, st, "%s:offset %llu: %s", path, (unsigned long long)p->off, dt_error_detail());
        return;
    }
    after = dt_tok_enc_stats(e);
    note_invalid(p, &before, &after, path, text, p->len, p->off, 0);
}

static void *worker_main(void *arg) {
    run *r = arg;
    dt_tok_enc_t *e = dt_tok_enc_new(r->o->tok);
    dt_tok_enc_set_cancel(e, r->o->cancel);
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->stop || r->exhausted) break;
        if (r->produced >= r->written + (uint64_t)r->window) {
            pthread_cond_wait(&r->cv_work, &r->mu);
            continue;
        }
        piece *p = &r->slots[r->produced % (uint64_t)r->window];
        piece next;
        double t0 = dt_now_s();
        int more = produce(r, &next);
        r->produce_s += dt_now_s() - t0;
        if (!more) {
            r->exhausted = 1;
            if (r->prod_st != DT_STATUS_OK) r->stop = 1;
            pthread_cond_broadcast(&r->cv_done);
            pthread_cond_broadcast(&r->cv_work);
            break;
        }
        next.seq = r->produced++;
        next.state = PIECE_BUSY;
        *p = next;
        pthread_mutex_unlock(&r->mu);
        if (!(r->o->cancel && *r->o->cancel)) encode_piece(r, e, p);
        pthread_mutex_lock(&r->mu);
        p->state = PIECE_DONE;
        pthread_cond_broadcast(&r->cv_done);
    }
    pthread_mutex_unlock(&r->mu);
    dt_tok_enc_free(e);
    return NULL;
}

static int cancelled(const dt_tokenize_opts *o) { return o->cancel && *o->cancel; }

dt_status_t dt_tokenize_check(const dt_tokenize_opts *o, int *existing) {
    *existing = 0;
    if (o->n_inputs <= 0) return dt_error(DT_STATUS_USAGE, "no INPUT given (text files, .jsonl files or - for stdin)");
    int stdin_seen = 0;
    for (int i = 0; i < o->n_inputs; i++) {
        const char *p = o->inputs[i];
        if (!strcmp(p, "-")) {
            if (stdin_seen++) return dt_error(DT_STATUS_USAGE, "stdin (-) given more than once");
            continue;
        }
        struct stat sb;
        if (stat(p, &sb) != 0) return dt_error(DT_STATUS_NOT_FOUND, "input %s: %s", p, strerror(errno));
        if (S_ISDIR(sb.st_mode)) return dt_error(DT_STATUS_USAGE, "input %s is a folder (give its files)", p);
        if (access(p, R_OK) != 0) return dt_error(DT_STATUS_NOT_FOUND, "input %s: not readable: %s", p, strerror(errno));
    }
    if (o->shard_tokens == 0 || o->shard_tokens > INT32_MAX)
        return dt_error(DT_STATUS_USAGE, "shard_tokens must be in [1, %d]", INT32_MAX);
    if (o->val_tokens > INT32_MAX) return dt_error(DT_STATUS_USAGE, "val_tokens must be at most %d", INT32_MAX);
    if (dt_tok_token_str(o->tok, o->doc_token) == NULL)
        return dt_error(DT_STATUS_USAGE, "document token id %u is not in the tokenizer's vocabulary (%u ids)",
                        o->doc_token, dt_tok_vocab_size(o->tok));
    /* The output folder: present and writable (a probe file, removed at once). */
    char probe[4300];
    snprintf(probe, sizeof probe, "%s_probe.tmp.%ld", o->out_prefix, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return dt_error(DT_STATUS_IO, "output %s: cannot write there: %s", o->out_prefix, strerror(errno));
    close(fd);
    unlink(probe);
    char **old = NULL;
    int n_old = 0;
    DT_CHECK(dt_shard_out_existing(o->out_prefix, &old, &n_old));
    dt_status_t st = DT_STATUS_OK;
    if (n_old > 0 && !o->force) {
        st = dt_error(DT_STATUS_USAGE, "%d shard(s) of prefix %s exist already (%s%s)", n_old, o->out_prefix,
                      old[0], n_old > 1 ? ", ..." : "");
        *existing = n_old;
    }
    for (int i = 0; i < n_old; i++) free(old[i]);
    free(old);
    return st;
}

/* Fills the live totals (lock not needed: the writing thread owns them). */
static void fill_progress(const run *r, const dt_shard_out *w, dt_tokenize_progress *pr, double t0) {
    pr->tokens = w->total;
    pr->val_tokens = w->val_written;
    pr->train_tokens = w->total - w->val_written;
    pr->shards = w->n;
    pr->seconds = dt_now_s() - t0;
    pr->jobs = r->o->jobs;
}

dt_status_t dt_tokenize_run(const dt_tokenize_opts *o, dt_tokenize_progress *sum) {
    memset(sum, 0, sizeof *sum);
    DT_CHECK(dt_tokenize_check(o, &sum->existing));
    sum->stale_removed = dt_shard_out_clean_stale(o->out_prefix);
    double t0 = dt_now_s();
    run r = {.o = o};
    r.srcs = dt_xcalloc((size_t)o->n_inputs, sizeof *r.srcs);
    for (int i = 0; i < o->n_inputs; i++) {
        source *s = &r.srcs[i];
        s->path = o->inputs[i];
        s->is_stdin = !strcmp(s->path, "-");
        s->jsonl = o->chat_mode || (o->format ? o->format == DT_TOKENIZE_JSONL : ends_with(s->path, ".jsonl"));
        struct stat sb;
        if (!s->is_stdin && stat(s->path, &sb) == 0) sum->bytes_total += (uint64_t)sb.st_size;
    }
    /* Pieces of about 1/64 of the input (whatever the jobs, so the pieces and the
     * work are the same for every job count), between 64 KB and 1 MB. */
    r.piece_bytes = o->piece_bytes;
    if (r.piece_bytes == 0) {
        uint64_t b = sum->bytes_total / 64;
        r.piece_bytes = b < PIECE_MIN ? PIECE_MIN : b > PIECE_MAX ? PIECE_MAX : (size_t)b;
    }
    r.window = 4 * o->jobs + 2;
    r.slots = dt_xcalloc((size_t)r.window, sizeof *r.slots);
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv_work, NULL);
    pthread_cond_init(&r.cv_done, NULL);

    dt_shard_out w;
    dt_shard_out_init(&w, o->out_prefix, dt_shard_token_bytes(dt_tok_vocab_size(o->tok)), o->shard_tokens,
                      o->val_tokens);
    w.vocab = dt_tok_vocab_size(o->tok); /* recorded in each header: the trainer's vocabulary */
    pthread_t *th = dt_xcalloc((size_t)o->jobs, sizeof *th);
    int started = 0;
    dt_status_t st = DT_STATUS_OK;
    for (; started < o->jobs; started++)
        if (pthread_create(&th[started], NULL, worker_main, &r) != 0) {
            st = dt_error(DT_STATUS_SYS, "cannot start tokenizer thread %d of %d", started + 1, o->jobs);
            break;
        }
    double write_s = 0, last_progress = -1e9;
    double every = o->progress_ms < 0 ? 0 : (o->progress_ms > 0 ? o->progress_ms : 100) / 1000.0;
    pthread_mutex_lock(&r.mu);
    if (st != DT_STATUS_OK) r.stop = 1;
    while (st == DT_STATUS_OK) {
        if (cancelled(o)) {
            st = dt_error(DT_STATUS_CANCELED, "stopped by a signal");
            break;
        }
        double now = dt_now_s() - t0;
        if (o->progress && now - last_progress >= every) {
            last_progress = now;
            fill_progress(&r, &w, sum, t0);
            pthread_mutex_unlock(&r.mu);
            o->progress(o->progress_ctx, sum);
            pthread_mutex_lock(&r.mu);
        }
        piece *p = &r.slots[r.written % (uint64_t)r.window];
        if (r.written < r.produced && p->state == PIECE_DONE && p->seq == r.written) {
            pthread_mutex_unlock(&r.mu);
            if (p->st != DT_STATUS_OK) {
                st = dt_error(p->st, "%s", p->err);
            } else {
                double tw = dt_now_s();
                st = r.o->chat_mode ? dt_shard_out_write_masked(&w, p->ids.ids, p->mask.bytes, p->ids.n)
                                    : dt_shard_out_write(&w, p->ids.ids, p->ids.n);
                write_s += dt_now_s() - tw;
                sum->documents += p->docs;
                sum->empty_documents += p->empty_docs;
                sum->bytes_done += p->len;
                if (p->invalid && sum->invalid_utf8 == 0)
                    snprintf(sum->first_invalid, sizeof sum->first_invalid, "%s", p->first_invalid);
                sum->invalid_utf8 += p->invalid;
            }
            free(p->ids.ids);
            p->ids = (dt_tok_ids){0};
            free(p->mask.bytes);
            p->mask = (dt_tok_mask){0};
            free(p->buf);
            p->buf = NULL;
            pthread_mutex_lock(&r.mu);
            source *s = &r.srcs[p->src];
            if (--s->pending == 0 && s->cut_all && s->opened) source_close(s);
            p->state = PIECE_FREE;
            r.written++;
            pthread_cond_broadcast(&r.cv_work);
            continue;
        }
        if (r.exhausted && r.written == r.produced) {
            if (r.prod_st != DT_STATUS_OK) st = dt_error(r.prod_st, "%s", r.prod_err);
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&r.cv_done, &r.mu, &ts);
    }
    r.stop = 1;
    pthread_cond_broadcast(&r.cv_work);
    pthread_mutex_unlock(&r.mu);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(th);

    if (st == DT_STATUS_OK && sum->documents == 0)
        st = dt_error(DT_STATUS_INVALID, "the input holds no text: %llu document(s), all empty",
                      (unsigned long long)sum->empty_documents);
    if (st == DT_STATUS_OK && cancelled(o)) st = dt_error(DT_STATUS_CANCELED, "stopped by a signal");
    fill_progress(&r, &w, sum, t0);
    double tc = dt_now_s();
    if (st == DT_STATUS_OK) st = dt_shard_out_commit(&w, o->force);
    sum->no_train = w.no_train;
    sum->serial_s = write_s + (dt_now_s() - tc) + r.produce_s;
    sum->pieces = r.written;
    dt_shard_out_abort(&w); /* after a commit this only frees */

    for (int i = 0; i < r.window; i++) free(r.slots[i].ids.ids), free(r.slots[i].mask.bytes), free(r.slots[i].buf);
    free(r.slots);
    for (int i = 0; i < o->n_inputs; i++) source_close(&r.srcs[i]);
    free(r.srcs);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv_work);
    pthread_cond_destroy(&r.cv_done);
    return st;
}
