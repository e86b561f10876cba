/*
 * store.h - the key-value store that node 0's agent hosts: a libuv server and a
 * blocking client, speaking the c10d TCPStore wire protocol so that PyTorch
 * programs launched with --exec use it as they use torchrun's agent store.
 *
 * Server: one libuv loop on its own thread; IPv4 and IPv6; waiters are woken by
 * SET / ADD / COMPARE_SET / MULTI_SET without polling. A bad frame or a request
 * over the limits closes only that client's connection.
 *
 * Client: blocking calls, each bounded by the client's timeout. Values returned
 * to the caller are malloc'ed and freed by the caller with free().
 * Not thread-safe: one client per thread.
 */
#ifndef DT_RENDEZVOUS_STORE_H
#define DT_RENDEZVOUS_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Limits enforced by the server (a violation closes that client's connection). */
#define DT_STORE_MAX_KEY_BYTES (8u * 1024u)
#define DT_STORE_MAX_VALUE_BYTES (8u * 1024u * 1024u)
#define DT_STORE_MAX_KEYS_PER_REQUEST (128u * 1024u)
/* What one client, and all of them together, may cost the server (README,
 * "Store limits"). A client over a limit is closed and logged with its address;
 * the others keep being served. */
/* Incomplete input one connection may have buffered (one frame, or frames behind a
 * GET that waits for its key). */
#define DT_STORE_MAX_FRAME_BYTES ((size_t)128 << 20)
/* Incomplete input buffered across all connections. */
#define DT_STORE_MAX_BUFFERED_BYTES ((size_t)256 << 20)
/* Keys (stored or waited for) and the bytes they hold: keys, values, waiters. */
#define DT_STORE_MAX_KEYS ((size_t)1 << 20)
#define DT_STORE_MAX_STORED_BYTES ((size_t)256 << 20)
/* Replies queued for one connection that is not reading them (it is closed), and
 * for all connections together (a value reply over it closes its connection). */
#define DT_STORE_MAX_UNSENT_BYTES ((size_t)64 << 20)
#define DT_STORE_MAX_UNSENT_TOTAL_BYTES ((size_t)256 << 20)
/* Past this many queued reply bytes the server stops reading the connection until
 * it reads its replies (a PING flood costs this much, not its whole stream). */
#define DT_STORE_READ_PAUSE_BYTES ((size_t)64 << 10)
/* VALIDATE must be the first frame and arrive within this many seconds. */
#define DT_STORE_VALIDATE_TIMEOUT_S 5
/* Connections from one peer address. */
#define DT_STORE_MAX_CONNS_PER_PEER 4096
/* File descriptors kept free for the rest of the process (the agent's pipes, logs);
 * the soft RLIMIT_NOFILE is raised to the hard one when the server starts. */
#define DT_STORE_FD_RESERVE 64
#define DT_STORE_DEFAULT_PORT 29500

/* ---- server -------------------------------------------------------------- */

typedef struct dt_store_server dt_store_server_t;
typedef struct dt_store_token dt_store_token_t; /* rendezvous/store_auth.h */

/* Binds host:port (host "0.0.0.0", "::", "127.0.0.2", a name; port 0 picks a
 * free port) and serves on a background thread until dt_store_server_stop(). */
dt_status_t dt_store_server_start(const char *host, int port, dt_store_server_t **out);
/* The same with a token (NULL: none, as above): every client must prove it holds
 * it before any other command (rendezvous/store_auth.h), else it is closed and
 * logged with its address. allow_peers lets clients that cannot authenticate
 * (PyTorch's, under --exec) in from addresses where a client has authenticated. */
dt_status_t dt_store_server_start_auth(const char *host, int port, const dt_store_token_t *token,
                                       int allow_peers, dt_store_server_t **out);
/* The port actually bound (useful with port 0). */
int dt_store_server_port(const dt_store_server_t *srv);
/* Number of keys held and clients connected (for tests and the log). */
size_t dt_store_server_num_keys(dt_store_server_t *srv);
size_t dt_store_server_num_clients(dt_store_server_t *srv);
/* Stops the loop, closes every connection, frees everything. NULL is fine. */
void dt_store_server_stop(dt_store_server_t *srv);

/* ---- client -------------------------------------------------------------- */

typedef struct dt_store dt_store_t;

/* Connects to host:port, retrying refused/unreachable connects with exponential
 * backoff and jitter until timeout_s has passed (DT_STATUS_TIMEOUT, with the
 * endpoint and the time tried in dt_error_detail()). Sends VALIDATE. The same
 * timeout then bounds every later call (dt_store_set_timeout changes it). */
dt_status_t dt_store_connect(const char *host, int port, double timeout_s, dt_store_t **out);
/* The same, proving to the store that this client holds token (NULL: none) and
 * checking that the store holds it too. A store that refuses the token is
 * DT_STATUS_REFUSED at once (no retry), with the endpoint and the token file in
 * the detail. */
dt_status_t dt_store_connect_auth(const char *host, int port, double timeout_s,
                                  const dt_store_token_t *token, dt_store_t **out);
void dt_store_close(dt_store_t *st);
void dt_store_set_timeout(dt_store_t *st, double timeout_s);

dt_status_t dt_store_set(dt_store_t *st, const char *key, const void *val, size_t len);
/* Waits (up to the timeout) until key exists, then returns its value (WAIT, then
 * GET, as torch's client does). *val is NUL-terminated one past *len. */
dt_status_t dt_store_get(dt_store_t *st, const char *key, void **val, size_t *len);
/* Adds delta to the integer at key (missing = 0); *result gets the new value. */
dt_status_t dt_store_add(dt_store_t *st, const char *key, int64_t delta, int64_t *result);
/* c10d semantics: missing key and empty expected -> sets desired; missing key and
 * non-empty expected -> returns expected unchanged; present key -> swaps only if
 * equal to expected. *result gets the value now held (or expected, as said). */
dt_status_t dt_store_compare_set(dt_store_t *st, const char *key, const void *expected,
                                 size_t expected_len, const void *desired, size_t desired_len,
                                 void **result, size_t *result_len);
/* *ready = 1 when all keys exist, else 0. */
dt_status_t dt_store_check(dt_store_t *st, const char *const *keys, size_t n, int *ready);
/* Waits until all keys exist (timeout_s <= 0: the client's timeout). On timeout
 * the wait is canceled on the server (CANCEL_WAIT), the connection stays usable,
 * and DT_STATUS_TIMEOUT's detail names the keys still missing. */
dt_status_t dt_store_wait(dt_store_t *st, const char *const *keys, size_t n, double timeout_s);
dt_status_t dt_store_num_keys(dt_store_t *st, int64_t *n);
/* *deleted = number of keys removed (0 or 1). */
dt_status_t dt_store_delete(dt_store_t *st, const char *key, int *deleted);
/* Appends to the value at key (creating it). */
dt_status_t dt_store_append(dt_store_t *st, const char *key, const void *val, size_t len);
/* Waits until all keys exist, then vals[i]/lens[i] get each value (caller frees). */
dt_status_t dt_store_multi_get(dt_store_t *st, const char *const *keys, size_t n, void **vals,
                               size_t *lens);
dt_status_t dt_store_multi_set(dt_store_t *st, const char *const *keys, const void *const *vals,
                               const size_t *lens, size_t n);
/* Round trip; *rtt_s (may be NULL) gets the time it took. */
dt_status_t dt_store_ping(dt_store_t *st, double *rtt_s);

#endif /* DT_RENDEZVOUS_STORE_H */
