/*
 * proto.h - the c10d TCPStore wire protocol as pure functions: an incremental
 * frame parser (bytes in; a complete command, "need more" or "bad frame: reason"
 * out) and encoders for every command. No sockets, no allocation in the parser,
 * so the fuzzer (tests/fuzz/fuzz_store_frame.c) can drive it directly.
 *
 * Layout, checked against PyTorch's c10d sources (TCPStoreBackend.hpp: QueryType,
 * CheckResponseType, WaitResponseType; TCPStore.cpp: the client; and
 * TCPStoreLibUvBackend.cpp: the libuv server). Integers are native-endian (the
 * bytes of the C value, little-endian on every machine we run on). A "str" or
 * "bytes" is a uint64 length followed by that many bytes. Keys are stored exactly
 * as sent: torch's client prepends "/" to every user key itself, the libuv server
 * does nothing with prefixes, and neither do we.
 *
 *   command (uint8)  request after the command byte        reply
 *   0  VALIDATE      u32 magic 0x3C85F7CE                   none (must come first)
 *   1  SET           str key, bytes value                   none
 *   2  COMPARE_SET   str key, bytes expected, bytes desired bytes (value now held,
 *                                                           or expected when the key
 *                                                           is missing and expected
 *                                                           is not empty)
 *   3  GET           str key                                bytes value (ours waits
 *                                                           until the key exists;
 *                                                           torch's client sends WAIT
 *                                                           first, and so does ours)
 *   4  ADD           str key, i64 delta                     i64 new value (stored as
 *                                                           decimal text)
 *   5  CHECK         u64 n, n x str key                     u8: 0 READY, 1 NOT_READY
 *   6  WAIT          u64 n, n x str key                     u8 0 STOP_WAITING once all
 *                                                           keys exist
 *   7  GETNUMKEYS    -                                      i64
 *   8  DELETE_KEY    str key                                i64 number deleted (0/1)
 *   9  APPEND        str key, bytes value                   none
 *  10  MULTI_GET     u64 n, n x str key                     n x bytes (ours waits
 *                                                           until all exist)
 *  11  MULTI_SET     u64 n (torch writes it as i64),        none
 *                    n x (str key, bytes value)
 *  12  CANCEL_WAIT   -                                      u8 1 WAIT_CANCELED (always;
 *                                                           a STOP_WAITING that won
 *                                                           the race comes before it)
 *  13  PING          u32 nonce                              u32 nonce
 *  14-16 QUEUE_PUSH/POP/LEN                                 not implemented: closes
 *  17  LIST_KEYS     -                                      i64 n, n x str key
 *  18  BARRIER       str key, i64 world size                u8 0 STOP_WAITING when the
 *                                                           counter at key reaches it
 *  64  AUTH_HELLO    32-byte client nonce                   32-byte server nonce
 *  65  AUTH_PROOF    32-byte HMAC                           u8 1 + 32-byte HMAC, or u8 0
 *      (dtrun's token exchange, first on a store with a token: rendezvous/store_auth.h)
 *
 * Limits (as the libuv server): a key over 8 KiB, a value over 8 MiB or more than
 * 128 Ki keys in one request makes the frame bad; the server then closes that
 * client. Limits are checked as soon as a length arrives, not after the payload.
 */
#ifndef DT_RENDEZVOUS_PROTO_H
#define DT_RENDEZVOUS_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define DT_STORE_VALIDATE_MAGIC 0x3C85F7CEu

typedef enum dt_store_cmd {
    DT_STORE_CMD_VALIDATE = 0,
    DT_STORE_CMD_SET = 1,
    DT_STORE_CMD_COMPARE_SET = 2,
    DT_STORE_CMD_GET = 3,
    DT_STORE_CMD_ADD = 4,
    DT_STORE_CMD_CHECK = 5,
    DT_STORE_CMD_WAIT = 6,
    DT_STORE_CMD_GETNUMKEYS = 7,
    DT_STORE_CMD_DELETE_KEY = 8,
    DT_STORE_CMD_APPEND = 9,
    DT_STORE_CMD_MULTI_GET = 10,
    DT_STORE_CMD_MULTI_SET = 11,
    DT_STORE_CMD_CANCEL_WAIT = 12,
    DT_STORE_CMD_PING = 13,
    DT_STORE_CMD_QUEUE_PUSH = 14,
    DT_STORE_CMD_QUEUE_POP = 15,
    DT_STORE_CMD_QUEUE_LEN = 16,
    DT_STORE_CMD_LIST_KEYS = 17,
    DT_STORE_CMD_BARRIER = 18,
    /* dtrun's own, not torch's: the token exchange (rendezvous/store_auth.h). */
    DT_STORE_CMD_AUTH_HELLO = 64,
    DT_STORE_CMD_AUTH_PROOF = 65,
} dt_store_cmd_t;

/* CheckResponseType and WaitResponseType. */
enum { DT_STORE_CHECK_READY = 0, DT_STORE_CHECK_NOT_READY = 1 };
enum { DT_STORE_WAIT_STOP_WAITING = 0, DT_STORE_WAIT_CANCELED = 1 };

/* A byte range inside the parsed buffer (not owned). */
typedef struct dt_store_bytes {
    const uint8_t *ptr;
    size_t len;
} dt_store_bytes_t;

/* One complete command; every pointer points into the buffer given to the parser. */
typedef struct dt_store_frame {
    dt_store_cmd_t cmd;
    size_t size;           /* bytes of the whole frame, command byte included */
    uint32_t u32;          /* VALIDATE magic, PING nonce */
    const uint8_t *auth;   /* AUTH_HELLO nonce, AUTH_PROOF HMAC (32 bytes) */
    int64_t i64;           /* ADD delta, BARRIER world size */
    dt_store_bytes_t key;  /* single-key commands */
    dt_store_bytes_t a;    /* SET/APPEND value, COMPARE_SET expected */
    dt_store_bytes_t b;    /* COMPARE_SET desired */
    uint64_t n;            /* CHECK/WAIT/MULTI_GET keys, MULTI_SET pairs */
    const uint8_t *list;   /* the n keys (or key, value pairs), already validated */
} dt_store_frame_t;

typedef enum dt_store_parse_result {
    DT_STORE_PARSE_FRAME = 0,     /* *frame holds one command of frame->size bytes */
    DT_STORE_PARSE_NEED_MORE = 1, /* incomplete: *need = total bytes to try again with */
    DT_STORE_PARSE_BAD = 2,       /* never valid whatever follows: reason says why */
} dt_store_parse_result_t;

/* Parses the command at the start of buf[0..len). On NEED_MORE, *need (may be
 * NULL) gets a lower bound on the bytes the frame needs (> len). On BAD, reason
 * (may be NULL) gets a one-line explanation. */
dt_store_parse_result_t dt_store_parse(const uint8_t *buf, size_t len, dt_store_frame_t *frame,
                                       size_t *need, char *reason, size_t reason_len);

/* Walks a parsed frame's list: *pos starts at frame->list; each call yields the
 * next str (a key, or for MULTI_SET alternately key and value). */
dt_store_bytes_t dt_store_list_next(const uint8_t **pos);

/* Name of a command ("SET"); "UNKNOWN" outside the table. */
const char *dt_store_cmd_name(int cmd);

/* ---- encoding ------------------------------------------------------------ */

/* A growable byte buffer (malloc'ed; out-of-memory aborts as dt_xmalloc does). */
typedef struct dt_store_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
} dt_store_buf_t;

void dt_store_buf_free(dt_store_buf_t *b);
void dt_store_buf_reserve(dt_store_buf_t *b, size_t extra);
/* Drops the first n bytes. */
void dt_store_buf_consume(dt_store_buf_t *b, size_t n);
void dt_store_buf_put_raw(dt_store_buf_t *b, const void *p, size_t n);
void dt_store_buf_put_u8(dt_store_buf_t *b, uint8_t v);
void dt_store_buf_put_u32(dt_store_buf_t *b, uint32_t v);
void dt_store_buf_put_u64(dt_store_buf_t *b, uint64_t v);
void dt_store_buf_put_i64(dt_store_buf_t *b, int64_t v);
/* uint64 length + bytes. */
void dt_store_buf_put_bytes(dt_store_buf_t *b, const void *p, size_t n);

/* Encoders append one request to b. */
void dt_store_encode_validate(dt_store_buf_t *b);
void dt_store_encode_ping(dt_store_buf_t *b, uint32_t nonce);
/* AUTH_HELLO, AUTH_PROOF with their 32 bytes. */
void dt_store_encode_auth(dt_store_buf_t *b, dt_store_cmd_t cmd, const uint8_t bytes[32]);
/* GETNUMKEYS, CANCEL_WAIT, LIST_KEYS. */
void dt_store_encode_simple(dt_store_buf_t *b, dt_store_cmd_t cmd);
/* GET, DELETE_KEY (and the queue commands' key). */
void dt_store_encode_key(dt_store_buf_t *b, dt_store_cmd_t cmd, const void *key, size_t klen);
/* SET, APPEND. */
void dt_store_encode_set(dt_store_buf_t *b, dt_store_cmd_t cmd, const void *key, size_t klen,
                         const void *val, size_t vlen);
void dt_store_encode_add(dt_store_buf_t *b, const void *key, size_t klen, int64_t delta);
void dt_store_encode_compare_set(dt_store_buf_t *b, const void *key, size_t klen,
                                 const void *expected, size_t elen, const void *desired,
                                 size_t dlen);
/* CHECK, WAIT, MULTI_GET over NUL-terminated keys. */
void dt_store_encode_keys(dt_store_buf_t *b, dt_store_cmd_t cmd, const char *const *keys,
                          size_t n);
void dt_store_encode_multi_set(dt_store_buf_t *b, const char *const *keys,
                               const void *const *vals, const size_t *lens, size_t n);
void dt_store_encode_barrier(dt_store_buf_t *b, const void *key, size_t klen, int64_t world);

#endif /* DT_RENDEZVOUS_PROTO_H */
