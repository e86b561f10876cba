/*
 * store_server_impl.h - what the store server's files share: the server, its
 * connections, its key map and the waits on missing keys, and the functions one
 * file calls in another. Private to rendezvous/store_server*.c.
 *
 *   store_server.c         start and stop: address, listener, the loop's thread
 *   store_server_conn.c    a connection's life: input, replies, accept, the sweep
 *   store_server_cmd.c     the commands: one frame served against the key map
 *   store_server_limits.c  what a client may cost: the token gate, the store's
 *                          budgets, connections per peer and below the fd limit
 *   store_server_map.c     the key map and the waiters its writes wake
 *
 * Everything here runs on the loop thread except start, stop and the counters.
 */
#ifndef DT_RENDEZVOUS_STORE_SERVER_IMPL_H
#define DT_RENDEZVOUS_STORE_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "rendezvous/proto.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"

#define READ_BUF_BYTES (64 * 1024)

typedef struct client client_t;
typedef struct entry entry_t;
typedef struct wait_req wait_req_t;
typedef struct peer peer_t;

/* One key a request waits for, linked into that key's FIFO of waiters. */
typedef struct wait_link {
    wait_req_t *req;
    entry_t *entry; /* NULL once woken or detached */
    struct wait_link *prev, *next;
} wait_link_t;

enum { REQ_WAIT, REQ_BLOCK };

/* A WAIT or BARRIER (REQ_WAIT: answered STOP_WAITING) or a GET / MULTI_GET of
 * missing keys (REQ_BLOCK: the connection resumes parsing) still waiting. */
struct wait_req {
    client_t *client;
    wait_req_t *prev, *next; /* in the client's list */
    int kind;
    size_t remaining;
    size_t nlinks;
    size_t cost; /* bytes charged to the store's budget */
    wait_link_t links[];
};

struct entry {
    entry_t *chain;
    uint64_t hash;
    int present;
    uint8_t *val;
    size_t vlen;
    wait_link_t *wait_head, *wait_tail;
    size_t klen;
    uint8_t key[];
};

/* One peer address and how many admitted connections come from it (the per-peer
 * cap), in the server's peer table; freed when its last connection closes. */
struct peer {
    peer_t *chain;
    uint64_t hash;
    size_t conns;
    int family;     /* AF_INET or AF_INET6 */
    uint8_t ip[16]; /* the address, 4 or 16 bytes */
};

struct client {
    uv_tcp_t tcp; /* first: the handle pointer is the client pointer */
    dt_store_server_t *srv;
    client_t *prev, *next;
    client_t *unval_prev, *unval_next; /* in the server's list of unvalidated ones */
    int in_unval, counted;             /* counted: in srv->open (admitted, not closing) */
    peer_t *peer_entry;                /* its address's count; NULL if not counted */
    dt_store_buf_t in;
    size_t need;
    dt_store_buf_t out;
    client_t *dirty_next, *resume_next;
    int in_dirty, in_resume;
    int validated, closing, blocked, read_paused;
    wait_req_t *reqs;
    uint64_t accepted_ms;         /* loop time of the accept (VALIDATE deadline) */
    struct sockaddr_storage peer; /* for the per-peer cap; family 0 if unknown */
    dt_store_auth_conn_t auth; /* the token exchange (stores with a token) */
    char addr[64];
};

typedef struct write_req {
    uv_write_t req;
    client_t *client;
    size_t len;
    uint8_t data[];
} write_req_t;

struct dt_store_server {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t stop_async;
    pthread_t thread;
    int port;
    char host[256];
    entry_t **buckets;
    size_t nbuckets, nentries;
    client_t *clients;
    client_t *dirty, *resume;
    /* Admitted connections that have not sent VALIDATE, oldest first (the sweep and
     * the room made at the fd limit start from the head), and the counts the
     * connection limits weigh, kept as connections come and go. */
    client_t *unval_head, *unval_tail;
    size_t open; /* admitted connections not closing */
    uint64_t inputs; /* reads and accepts so far (the loop's spin looks for more) */
    int nodelay_known, nodelay_inherited; /* accepted sockets get TCP_NODELAY from the listener */
    peer_t **peers;
    size_t npeer_buckets, npeers;
    atomic_size_t num_keys, num_clients;
    uv_timer_t sweep;            /* closes connections past the VALIDATE deadline */
    uv_check_t drain;            /* after each poll: resumed input, then replies written */
    size_t buffered;             /* bytes of incomplete input, all connections */
    size_t stored;               /* bytes of keys, values and waiters held */
    size_t unsent;               /* reply bytes queued in libuv, all connections */
    size_t max_conns;            /* below the file descriptor limit */
    long fd_limit;
    uint64_t last_refusal_ms;    /* refusal log lines: at most one a second */
    unsigned refused_quiet;      /* refusals not logged since the last line */
    dt_store_auth_t *auth; /* NULL: no token, anyone may connect */
    uint8_t readbuf[READ_BUF_BYTES];
};

/* What serving a frame did to its connection. */
enum { HANDLED = 0, BLOCKED = 1, CLOSED = -1 };

/* What an entry and a wait on nkeys keys cost the store's budget. */
#define ENTRY_COST(klen) (sizeof(entry_t) + (klen))
#define WAIT_COST(nkeys) (sizeof(wait_req_t) + (nkeys) * sizeof(wait_link_t))

/* ---- the key map and its waiters (store_server_map.c) ------------------------ */

entry_t *dt_store_map_find_(dt_store_server_t *srv, const uint8_t *k, size_t n);
entry_t *dt_store_map_get_or_create_(dt_store_server_t *srv, const uint8_t *k, size_t n);
/* Frees every entry (the server is stopping). */
void dt_store_map_free_(dt_store_server_t *srv);
/* Drops an entry that holds neither a value nor waiters. */
void dt_store_entry_maybe_free_(dt_store_server_t *srv, entry_t *e);
void dt_store_entry_set_(dt_store_server_t *srv, entry_t *e, const void *v, size_t n);
/* The key at e was written: every waiter on it has one key fewer to wait for. */
void dt_store_entry_notify_(entry_t *e);
/* A request of kind REQ_WAIT / REQ_BLOCK with room for nlinks keys. */
wait_req_t *dt_store_req_new_(client_t *c, int kind, size_t nlinks);
void dt_store_req_add_link_(wait_req_t *r, entry_t *e);
/* Removes a request whether or not it finished, releasing what it held. */
void dt_store_req_cancel_(dt_store_server_t *srv, wait_req_t *r);

/* ---- connections (store_server_conn.c) -------------------------------------- */

void dt_store_reply_raw_(client_t *c, const void *p, size_t n);
void dt_store_reply_u8_(client_t *c, uint8_t v);
void dt_store_reply_i64_(client_t *c, int64_t v);
/* A value reply, within the unsent-reply budgets (else c is closed). */
void dt_store_reply_bytes_(client_t *c, const void *p, size_t n);
/* Closes one connection; reason (NULL for an orderly end) goes to the log. */
void dt_store_conn_close_(client_t *c, const char *reason);
/* "1.2.3.4:5" or "[::1]:5" of the peer (kept in c->addr). */
const char *dt_store_conn_addr_(client_t *c);
/* Writes c's gathered replies now. */
void dt_store_conn_flush_(client_t *c);
void dt_store_on_connection_(uv_stream_t *listener, int status);
/* Closes connections that did not send VALIDATE in time. */
void dt_store_on_sweep_(uv_timer_t *t);
/* After each poll: serves resumed connections and writes the gathered replies. */
void dt_store_on_drain_(uv_check_t *h);

/* ---- commands (store_server_cmd.c) ------------------------------------------ */

/* Serves one whole frame: HANDLED, BLOCKED (a GET of a missing key) or CLOSED. */
int dt_store_handle_frame_(client_t *c, const dt_store_frame_t *f);

/* ---- limits (store_server_limits.c) ----------------------------------------- */

/* AUTH_HELLO / AUTH_PROOF: HANDLED or CLOSED. */
int dt_store_auth_frame_(client_t *c, const dt_store_frame_t *f);
/* 1 when c may send commands; else c is closed (logged with its address). */
int dt_store_auth_gate_(client_t *c);
/* 1 when new_keys keys and bytes bytes fit the store's limits; else c is closed. */
int dt_store_admit_(client_t *c, size_t new_keys, size_t bytes);
int dt_store_admit_set_(client_t *c, const dt_store_bytes_t *key, size_t vlen);
int dt_store_admit_list_(client_t *c, const dt_store_frame_t *f);
/* 1 when c may stay under the connection limits (it is then counted and joins the
 * unvalidated list); else c is refused. */
int dt_store_admit_conn_(client_t *c);
/* c sent VALIDATE: it leaves the unvalidated list. */
void dt_store_conn_validated_(client_t *c);
/* c is closing: it leaves the counts and the unvalidated list. */
void dt_store_conn_release_(client_t *c);
/* Frees the peer table (the server is stopping). */
void dt_store_peers_free_(dt_store_server_t *srv);

#endif
