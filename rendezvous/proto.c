/*
 * proto.c - the TCPStore frame parser and encoders (layout in proto.h).
 *
 * The parser is restartable: it keeps no state between calls, the caller keeps
 * the bytes and calls again when more arrive (after at least *need bytes are
 * there, so an 8 MiB value is not re-examined on every read).
 */
#include "rendezvous/proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "rendezvous/store.h"

static const char *const cmd_names[] = {
    "VALIDATE", "SET",       "COMPARE_SET", "GET",        "ADD",        "CHECK",     "WAIT",
    "GETNUMKEYS", "DELETE_KEY", "APPEND",   "MULTI_GET",  "MULTI_SET",  "CANCEL_WAIT", "PING",
    "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS",  "BARRIER",
};

const char *dt_store_cmd_name(int cmd) {
    if (cmd == DT_STORE_CMD_AUTH_HELLO) return "AUTH_HELLO";
    if (cmd == DT_STORE_CMD_AUTH_PROOF) return "AUTH_PROOF";
    if (cmd < 0 || (size_t)cmd >= sizeof cmd_names / sizeof cmd_names[0]) return "UNKNOWN";
    return cmd_names[cmd];
}

/* ---- parsing --------------------------------------------------------------- */

/* A read cursor; each reader returns 1 (read), 0 (need more: rd->need set) or
 * -1 (bad: rd->reason set). */
typedef struct reader {
    const uint8_t *buf;
    size_t len;
    size_t off;
    size_t need;
    char *reason;
    size_t reason_len;
} reader_t;

static int rd_bad(reader_t *rd, const char *fmt, unsigned long long a, unsigned long long b) {
    if (rd->reason && rd->reason_len) snprintf(rd->reason, rd->reason_len, fmt, a, b);
    return -1;
}

static int rd_raw(reader_t *rd, void *out, size_t n) {
    if (rd->len - rd->off < n) {
        rd->need = rd->off + n;
        return 0;
    }
    if (out) memcpy(out, rd->buf + rd->off, n);
    rd->off += n;
    return 1;
}

/* A length-prefixed string of at most max bytes; what names it in the reason. */
static int rd_str(reader_t *rd, dt_store_bytes_t *out, uint64_t max, const char *what) {
    uint64_t n;
    size_t start = rd->off;
    int r = rd_raw(rd, &n, sizeof n);
    if (r <= 0) return r;
    if (n > max) {
        if (rd->reason && rd->reason_len)
            snprintf(rd->reason, rd->reason_len, "%s of %llu bytes exceeds the limit of %llu",
                     what, (unsigned long long)n, (unsigned long long)max);
        return -1;
    }
    if (rd->len - rd->off < n) {
        rd->need = rd->off + (size_t)n;
        rd->off = start;
        return 0;
    }
    if (out) {
        out->ptr = rd->buf + rd->off;
        out->len = (size_t)n;
    }
    rd->off += (size_t)n;
    return 1;
}

static int rd_key(reader_t *rd, dt_store_bytes_t *out) {
    return rd_str(rd, out, DT_STORE_MAX_KEY_BYTES, "key");
}

static int rd_value(reader_t *rd, dt_store_bytes_t *out) {
    return rd_str(rd, out, DT_STORE_MAX_VALUE_BYTES, "value");
}

static int rd_count(reader_t *rd, uint64_t *n) {
    int r = rd_raw(rd, n, sizeof *n);
    if (r <= 0) return r;
    if (*n > DT_STORE_MAX_KEYS_PER_REQUEST)
        return rd_bad(rd, "%llu keys in one request exceed the limit of %llu",
                      (unsigned long long)*n, DT_STORE_MAX_KEYS_PER_REQUEST);
    return 1;
}

#define RD(call)                                                             \
    do {                                                                     \
        int rd_r_ = (call);                                                  \
        if (rd_r_ == 0) goto need_more;                                      \
        if (rd_r_ < 0) return DT_STORE_PARSE_BAD;                            \
    } while (0)

dt_store_parse_result_t dt_store_parse(const uint8_t *buf, size_t len, dt_store_frame_t *f,
                                       size_t *need, char *reason, size_t reason_len) {
    reader_t rd = {.buf = buf, .len = len, .reason = reason, .reason_len = reason_len};
    uint8_t cmd;
    memset(f, 0, sizeof *f);
    if (reason && reason_len) reason[0] = '\0';
    RD(rd_raw(&rd, &cmd, 1));
    f->cmd = (dt_store_cmd_t)cmd;
    switch (cmd) {
    case DT_STORE_CMD_VALIDATE:
    case DT_STORE_CMD_PING:
        RD(rd_raw(&rd, &f->u32, sizeof f->u32));
        break;
    case DT_STORE_CMD_SET:
    case DT_STORE_CMD_APPEND:
        RD(rd_key(&rd, &f->key));
        RD(rd_value(&rd, &f->a));
        break;
    case DT_STORE_CMD_COMPARE_SET:
        RD(rd_key(&rd, &f->key));
        RD(rd_value(&rd, &f->a));
        RD(rd_value(&rd, &f->b));
        break;
    case DT_STORE_CMD_GET:
    case DT_STORE_CMD_DELETE_KEY:
        RD(rd_key(&rd, &f->key));
        break;
    case DT_STORE_CMD_ADD:
    case DT_STORE_CMD_BARRIER:
        RD(rd_key(&rd, &f->key));
        RD(rd_raw(&rd, &f->i64, sizeof f->i64));
        break;
    case DT_STORE_CMD_CHECK:
    case DT_STORE_CMD_WAIT:
    case DT_STORE_CMD_MULTI_GET:
        RD(rd_count(&rd, &f->n));
        f->list = buf + rd.off;
        for (uint64_t i = 0; i < f->n; i++) RD(rd_key(&rd, NULL));
        break;
    case DT_STORE_CMD_MULTI_SET:
        RD(rd_count(&rd, &f->n));
        f->list = buf + rd.off;
        for (uint64_t i = 0; i < f->n; i++) {
            RD(rd_key(&rd, NULL));
            RD(rd_value(&rd, NULL));
        }
        break;
    case DT_STORE_CMD_GETNUMKEYS:
    case DT_STORE_CMD_CANCEL_WAIT:
    case DT_STORE_CMD_LIST_KEYS:
        break;
    case DT_STORE_CMD_AUTH_HELLO:
    case DT_STORE_CMD_AUTH_PROOF:
        f->auth = buf + rd.off;
        RD(rd_raw(&rd, NULL, 32));
        break;
    default:
        if (reason && reason_len)
            snprintf(reason, reason_len, "unknown or unsupported command %u (%s)", cmd,
                     dt_store_cmd_name(cmd));
        return DT_STORE_PARSE_BAD;
    }
    f->size = rd.off;
    return DT_STORE_PARSE_FRAME;

need_more:
    if (need) *need = rd.need > len ? rd.need : len + 1;
    return DT_STORE_PARSE_NEED_MORE;
}

dt_store_bytes_t dt_store_list_next(const uint8_t **pos) {
    uint64_t n;
    memcpy(&n, *pos, sizeof n);
    dt_store_bytes_t s = {.ptr = *pos + sizeof n, .len = (size_t)n};
    *pos += sizeof n + (size_t)n;
    return s;
}

/* ---- encoding -------------------------------------------------------------- */

void dt_store_buf_free(dt_store_buf_t *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

void dt_store_buf_reserve(dt_store_buf_t *b, size_t extra) {
    if (b->cap - b->len >= extra) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len < extra) cap *= 2;
    b->data = dt_xrealloc(b->data, cap);
    b->cap = cap;
}

void dt_store_buf_consume(dt_store_buf_t *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

void dt_store_buf_put_raw(dt_store_buf_t *b, const void *p, size_t n) {
    dt_store_buf_reserve(b, n);
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
}

void dt_store_buf_put_u8(dt_store_buf_t *b, uint8_t v) { dt_store_buf_put_raw(b, &v, 1); }
void dt_store_buf_put_u32(dt_store_buf_t *b, uint32_t v) { dt_store_buf_put_raw(b, &v, 4); }
void dt_store_buf_put_u64(dt_store_buf_t *b, uint64_t v) { dt_store_buf_put_raw(b, &v, 8); }
void dt_store_buf_put_i64(dt_store_buf_t *b, int64_t v) { dt_store_buf_put_raw(b, &v, 8); }

void dt_store_buf_put_bytes(dt_store_buf_t *b, const void *p, size_t n) {
    dt_store_buf_reserve(b, 8 + n);
    dt_store_buf_put_u64(b, (uint64_t)n);
    dt_store_buf_put_raw(b, p, n);
}

void dt_store_encode_validate(dt_store_buf_t *b) {
    dt_store_buf_put_u8(b, DT_STORE_CMD_VALIDATE);
    dt_store_buf_put_u32(b, DT_STORE_VALIDATE_MAGIC);
}

void dt_store_encode_ping(dt_store_buf_t *b, uint32_t nonce) {
    dt_store_buf_put_u8(b, DT_STORE_CMD_PING);
    dt_store_buf_put_u32(b, nonce);
}

void dt_store_encode_auth(dt_store_buf_t *b, dt_store_cmd_t cmd, const uint8_t bytes[32]) {
    dt_store_buf_put_u8(b, (uint8_t)cmd);
    dt_store_buf_put_raw(b, bytes, 32);
}

void dt_store_encode_simple(dt_store_buf_t *b, dt_store_cmd_t cmd) {
    dt_store_buf_put_u8(b, (uint8_t)cmd);
}

void dt_store_encode_key(dt_store_buf_t *b, dt_store_cmd_t cmd, const void *key, size_t klen) {
    dt_store_buf_put_u8(b, (uint8_t)cmd);
    dt_store_buf_put_bytes(b, key, klen);
}

void dt_store_encode_set(dt_store_buf_t *b, dt_store_cmd_t cmd, const void *key, size_t klen,
                         const void *val, size_t vlen) {
    dt_store_buf_put_u8(b, (uint8_t)cmd);
    dt_store_buf_put_bytes(b, key, klen);
    dt_store_buf_put_bytes(b, val, vlen);
}

void dt_store_encode_add(dt_store_buf_t *b, const void *key, size_t klen, int64_t delta) {
    dt_store_buf_put_u8(b, DT_STORE_CMD_ADD);
    dt_store_buf_put_bytes(b, key, klen);
    dt_store_buf_put_i64(b, delta);
}

void dt_store_encode_compare_set(dt_store_buf_t *b, const void *key, size_t klen,
                                 const void *expected, size_t elen, const void *desired,
                                 size_t dlen) {
    dt_store_buf_put_u8(b, DT_STORE_CMD_COMPARE_SET);
    dt_store_buf_put_bytes(b, key, klen);
    dt_store_buf_put_bytes(b, expected, elen);
    dt_store_buf_put_bytes(b, desired, dlen);
}

void dt_store_encode_keys(dt_store_buf_t *b, dt_store_cmd_t cmd, const char *const *keys,
                          size_t n) {
    dt_store_buf_put_u8(b, (uint8_t)cmd);
    dt_store_buf_put_u64(b, (uint64_t)n);
    for (size_t i = 0; i < n; i++) dt_store_buf_put_bytes(b, keys[i], strlen(keys[i]));
}

void dt_store_encode_multi_set(dt_store_buf_t *b, const char *const *keys,
                               const void *const *vals, const size_t *lens, size_t n) {
    dt_store_buf_put_u8(b, DT_STORE_CMD_MULTI_SET);
    dt_store_buf_put_i64(b, (int64_t)n);
    for (size_t i = 0; i < n; i++) {
        dt_store_buf_put_bytes(b, keys[i], strlen(keys[i]));
        dt_store_buf_put_bytes(b, vals[i], lens[i]);
    }
}

void dt_store_encode_barrier(dt_store_buf_t *b, const void *key, size_t klen, int64_t world) {
    dt_store_buf_put_u8(b, DT_STORE_CMD_BARRIER);
    dt_store_buf_put_bytes(b, key, klen);
    dt_store_buf_put_i64(b, world);
}
