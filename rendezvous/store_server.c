/*
 * store_server.c - the TCPStore server: one libuv loop on a background thread,
 * a hash map of keys, and waiters that are woken by the writes that make their
 * keys exist (no polling). Wire layout and limits: rendezvous/proto.h.
 *
 * Per connection: unparsed input (only what did not form a whole frame; full
 * frames are served straight from the loop's read buffer), replies gathered in
 * an output buffer and written once per loop callback, and the list of its
 * pending waits. A WAIT never blocks the connection (CANCEL_WAIT must get
 * through); a GET or MULTI_GET of a missing key does: the frame stays unparsed
 * until its keys exist, then the connection resumes where it stopped.
 * Everything here runs on the loop thread except start, stop and the counters.
 *
 * What a client may cost is bounded (the DT_STORE_MAX_* limits in store.h): the
 * first frame must be VALIDATE and arrive within DT_STORE_VALIDATE_TIMEOUT_S;
 * buffered input, stored keys and bytes, and unsent replies each have a budget per
 * connection and across all of them; a connection whose replies queue up is not
 * read until it reads them; connections are capped per peer address and below the
 * file descriptor limit, refusals are logged (at most one line a second).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/resource.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/log.h"
#include "common/mem.h"
#include "common/status.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"

#define READ_BUF_BYTES (64 * 1024)
/* How often connections that never sent VALIDATE are looked for. */
#define SWEEP_INTERVAL_MS 1000

typedef struct client client_t;
typedef struct entry entry_t;
typedef struct wait_req wait_req_t;

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

struct client {
    uv_tcp_t tcp; /* first: the handle pointer is the client pointer */
    dt_store_server_t *srv;
    client_t *prev, *next;
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
    atomic_size_t num_keys, num_clients;
    uv_timer_t sweep;            /* closes connections past the VALIDATE deadline */
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

/* ---- the key map ------------------------------------------------------------ */

static uint64_t hash_key(const uint8_t *k, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ k[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static entry_t *map_find(dt_store_server_t *srv, const uint8_t *k, size_t n) {
    uint64_t h = hash_key(k, n);
    for (entry_t *e = srv->buckets[h & (srv->nbuckets - 1)]; e; e = e->chain)
        if (e->hash == h && e->klen == n && !memcmp(e->key, k, n)) return e;
    return NULL;
}

static void map_grow(dt_store_server_t *srv) {
    size_t nb = srv->nbuckets * 2;
    entry_t **b = dt_xcalloc(nb, sizeof *b);
    for (size_t i = 0; i < srv->nbuckets; i++) {
        entry_t *e = srv->buckets[i];
        while (e) {
            entry_t *next = e->chain;
            e->chain = b[e->hash & (nb - 1)];
            b[e->hash & (nb - 1)] = e;
            e = next;
        }
    }
    free(srv->buckets);
    srv->buckets = b;
    srv->nbuckets = nb;
}

static entry_t *map_get_or_create(dt_store_server_t *srv, const uint8_t *k, size_t n) {
    entry_t *e = map_find(srv, k, n);
    if (e) return e;
    if (srv->nentries + 1 > srv->nbuckets - srv->nbuckets / 4) map_grow(srv);
    e = dt_xcalloc(1, sizeof *e + n);
    srv->stored += sizeof *e + n;
    e->hash = hash_key(k, n);
    e->klen = n;
    memcpy(e->key, k, n);
    size_t b = e->hash & (srv->nbuckets - 1);
    e->chain = srv->buckets[b];
    srv->buckets[b] = e;
    srv->nentries++;
    return e;
}

/* Drops an entry that holds neither a value nor waiters. */
static void entry_maybe_free(dt_store_server_t *srv, entry_t *e) {
    if (e->present || e->wait_head) return;
    entry_t **pp = &srv->buckets[e->hash & (srv->nbuckets - 1)];
    while (*pp != e) pp = &(*pp)->chain;
    *pp = e->chain;
    srv->nentries--;
    srv->stored -= sizeof *e + e->klen + e->vlen;
    free(e->val);
    free(e);
}

static void entry_set(dt_store_server_t *srv, entry_t *e, const void *v, size_t n) {
    if (!e->present) atomic_fetch_add(&srv->num_keys, 1);
    e->present = 1;
    srv->stored = srv->stored - e->vlen + n;
    if (e->vlen != n || !e->val) e->val = dt_xrealloc(e->val, n);
    if (n) memcpy(e->val, v, n);
    e->vlen = n;
}

/* ---- replies and connection life ------------------------------------------- */

static void client_close(client_t *c, const char *reason);

static void mark_dirty(client_t *c) {
    if (c->in_dirty) return;
    c->in_dirty = 1;
    c->dirty_next = c->srv->dirty;
    c->srv->dirty = c;
}

static void reply_raw(client_t *c, const void *p, size_t n) {
    if (c->closing) return;
    dt_store_buf_put_raw(&c->out, p, n);
    mark_dirty(c);
}

static void reply_u8(client_t *c, uint8_t v) { reply_raw(c, &v, 1); }
static void reply_i64(client_t *c, int64_t v) { reply_raw(c, &v, 8); }

/* Value replies (never sent from a wake-up, so closing here is safe): one reply of
 * any size is fine, but not more than DT_STORE_MAX_UNSENT_BYTES waiting behind
 * earlier ones, nor past the budget of all connections' unsent replies. Small
 * replies are bounded by pausing reads instead (client_flush). */
static void reply_bytes(client_t *c, const void *p, size_t n) {
    if (c->closing) return;
    size_t pending = c->out.len + uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    if (pending > 0 && pending + n > DT_STORE_MAX_UNSENT_BYTES) {
        client_close(c, "client is not reading its replies (over 64 MiB unsent)");
        return;
    }
    if (c->srv->unsent + c->out.len + n > DT_STORE_MAX_UNSENT_TOTAL_BYTES) {
        client_close(c, "the replies of all connections already hold 256 MiB unsent");
        return;
    }
    dt_store_buf_put_bytes(&c->out, p, n);
    mark_dirty(c);
}

static void req_free(wait_req_t *r) {
    client_t *c = r->client;
    c->srv->stored -= r->cost;
    if (r->prev) r->prev->next = r->next;
    else c->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    free(r);
}

static void link_detach(wait_link_t *l) {
    entry_t *e = l->entry;
    if (l->prev) l->prev->next = l->next;
    else e->wait_head = l->next;
    if (l->next) l->next->prev = l->prev;
    else e->wait_tail = l->prev;
    l->entry = NULL;
}

/* Removes a request whether or not it finished, releasing what it held. */
static void req_cancel(dt_store_server_t *srv, wait_req_t *r) {
    for (size_t i = 0; i < r->nlinks; i++) {
        entry_t *e = r->links[i].entry;
        if (!e) continue;
        link_detach(&r->links[i]);
        entry_maybe_free(srv, e);
    }
    req_free(r);
}

static void req_complete(wait_req_t *r) {
    client_t *c = r->client;
    if (r->kind == REQ_WAIT) {
        reply_u8(c, DT_STORE_WAIT_STOP_WAITING);
    } else {
        c->blocked = 0;
        if (!c->in_resume) {
            c->in_resume = 1;
            c->resume_next = c->srv->resume;
            c->srv->resume = c;
        }
    }
    req_free(r);
}

/* The key at e was written: every waiter on it has one key fewer to wait for. */
static void entry_notify(entry_t *e) {
    wait_link_t *l;
    while ((l = e->wait_head) != NULL) {
        wait_req_t *r = l->req;
        link_detach(l);
        if (--r->remaining == 0) req_complete(r);
    }
}

/* Registers a request on the given entries (all missing, or the barrier key). */
static wait_req_t *req_new(client_t *c, int kind, size_t nlinks) {
    wait_req_t *r = dt_xcalloc(1, sizeof *r + nlinks * sizeof(wait_link_t));
    r->cost = sizeof *r + nlinks * sizeof(wait_link_t);
    c->srv->stored += r->cost;
    r->client = c;
    r->kind = kind;
    r->next = c->reqs;
    if (c->reqs) c->reqs->prev = r;
    c->reqs = r;
    return r;
}

static void req_add_link(wait_req_t *r, entry_t *e) {
    wait_link_t *l = &r->links[r->nlinks++];
    l->req = r;
    l->entry = e;
    l->prev = e->wait_tail;
    if (e->wait_tail) e->wait_tail->next = l;
    else e->wait_head = l;
    e->wait_tail = l;
    r->remaining++;
}

static void on_client_closed(uv_handle_t *h) {
    client_t *c = (client_t *)h;
    dt_store_server_t *srv = c->srv;
    if (c->prev) c->prev->next = c->next;
    else srv->clients = c->next;
    if (c->next) c->next->prev = c->prev;
    atomic_fetch_sub(&srv->num_clients, 1);
    srv->buffered -= c->in.len;
    dt_store_buf_free(&c->in);
    dt_store_buf_free(&c->out);
    free(c);
}

/* "1.2.3.4:5" or "[::1]:5" of the peer, looked up only when a log line needs it. */
static const char *client_addr(client_t *c) {
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    char ip[INET6_ADDRSTRLEN] = "?";
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) != 0) return "?";
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        uv_ip6_name(a, ip, sizeof ip);
        snprintf(c->addr, sizeof c->addr, "[%s]:%d", ip, ntohs(a->sin6_port));
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        uv_ip4_name(a, ip, sizeof ip);
        snprintf(c->addr, sizeof c->addr, "%s:%d", ip, ntohs(a->sin_port));
    }
    return c->addr;
}

/* Closes one connection; reason (NULL for an orderly end) goes to the log. */
static void client_close(client_t *c, const char *reason) {
    if (c->closing) return;
    c->closing = 1;
    if (reason) DT_LOG_WARN("store: closing connection from %s: %s", client_addr(c), reason);
    while (c->reqs) req_cancel(c->srv, c->reqs);
    c->out.len = 0;
    uv_close((uv_handle_t *)&c->tcp, on_client_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* The client read enough of its replies: serve its input again. */
static void on_write_done(uv_write_t *req, int status) {
    write_req_t *w = (write_req_t *)req;
    client_t *c = w->client;
    c->srv->unsent -= w->len;
    if (status < 0 && status != UV_ECANCELED) {
        char why[128];
        snprintf(why, sizeof why, "write failed: %s", uv_strerror(status));
        client_close(c, why);
    }
    free(w);
    if (c->read_paused && !c->closing &&
        uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) <= DT_STORE_READ_PAUSE_BYTES / 2) {
        c->read_paused = 0;
        int r = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
        if (r < 0) client_close(c, uv_strerror(r));
    }
}

static void client_flush(client_t *c) {
    if (c->closing || c->out.len == 0) return;
    uv_buf_t b = uv_buf_init((char *)c->out.data, (unsigned)c->out.len);
    int r = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    size_t done = r > 0 ? (size_t)r : 0;
    if (r < 0 && r != UV_EAGAIN) {
        char why[128];
        snprintf(why, sizeof why, "write failed: %s", uv_strerror(r));
        client_close(c, why);
        return;
    }
    if (done < c->out.len) {
        size_t left = c->out.len - done;

        write_req_t *w = dt_xmalloc(sizeof *w + left);
        w->client = c;
        w->len = left;
        memcpy(w->data, c->out.data + done, left);
        uv_buf_t wb = uv_buf_init((char *)w->data, (unsigned)left);
        int wr = uv_write(&w->req, (uv_stream_t *)&c->tcp, &wb, 1, on_write_done);
        if (wr < 0) {
            free(w);
            client_close(c, "write could not be queued");
            return;
        }
        c->srv->unsent += left;
        /* Not reading its replies: read no more requests until it does. */
        if (!c->read_paused &&
            uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > DT_STORE_READ_PAUSE_BYTES) {
            uv_read_stop((uv_stream_t *)&c->tcp);
            c->read_paused = 1;
        }
    }
    c->out.len = 0;
    if (c->out.cap > (1u << 20)) dt_store_buf_free(&c->out);
}

/* ---- commands --------------------------------------------------------------- */

/* Parses the decimal integer an ADD or BARRIER key holds (torch uses stoll). */
static int parse_counter(const entry_t *e, int64_t *out) {
    char buf[32];
    if (!e || !e->present) {
        *out = 0;
        return 0;
    }
    if (e->vlen == 0 || e->vlen >= sizeof buf) return -1;
    memcpy(buf, e->val, e->vlen);
    buf[e->vlen] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (end == buf || errno) return -1;
    *out = v;
    return 0;
}

static void set_counter(dt_store_server_t *srv, entry_t *e, int64_t v) {
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%" PRId64, v);
    entry_set(srv, e, buf, (size_t)n);
}

/* 1 when every key of the list is present. */
static int keys_present(dt_store_server_t *srv, const dt_store_frame_t *f) {
    const uint8_t *p = f->list;
    for (uint64_t i = 0; i < f->n; i++) {
        dt_store_bytes_t k = dt_store_list_next(&p);
        entry_t *e = map_find(srv, k.ptr, k.len);
        if (!e || !e->present) return 0;
    }
    return 1;
}

/* Registers c on every missing key of the list. */
static void wait_on_missing(dt_store_server_t *srv, client_t *c, const dt_store_frame_t *f,
                            int kind) {
    size_t missing = 0;
    const uint8_t *p = f->list;
    for (uint64_t i = 0; i < f->n; i++) {
        dt_store_bytes_t k = dt_store_list_next(&p);
        entry_t *e = map_find(srv, k.ptr, k.len);
        if (!e || !e->present) missing++;
    }
    wait_req_t *r = req_new(c, kind, missing);
    p = f->list;
    for (uint64_t i = 0; i < f->n; i++) {
        dt_store_bytes_t k = dt_store_list_next(&p);
        entry_t *e = map_get_or_create(srv, k.ptr, k.len);
        if (!e->present) req_add_link(r, e);
    }
}

enum { HANDLED = 0, BLOCKED = 1, CLOSED = -1 };

/* The token exchange (rendezvous/store_auth.h): AUTH_HELLO / AUTH_PROOF, and the
 * gate every other command of a store with a token passes first. */
static int auth_frame(client_t *c, const dt_store_frame_t *f) {
    dt_store_server_t *srv = c->srv;
    char why[200];
    struct sockaddr_storage peer;
    int pl = sizeof peer;
    if (!srv->auth) {
        snprintf(why, sizeof why, "%s, but this store has no token", dt_store_cmd_name(f->cmd));
        client_close(c, why);
        return CLOSED;
    }
    if (f->cmd == DT_STORE_CMD_AUTH_HELLO) {
        uint8_t sn[DT_STORE_AUTH_NONCE_BYTES];
        if (c->validated || !dt_store_auth_hello(srv->auth, &c->auth, f->auth, sn, why, sizeof why)) {
            if (c->validated) snprintf(why, sizeof why, "AUTH_HELLO after VALIDATE");
            client_close(c, why);
            return CLOSED;
        }
        reply_raw(c, sn, sizeof sn);
        return HANDLED;
    }
    uint8_t sp[DT_SHA256_BYTES];
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &pl) != 0) peer.ss_family = AF_UNSPEC;
    if (!dt_store_auth_proof(srv->auth, &c->auth, f->auth, (struct sockaddr *)&peer, sp, why,
                             sizeof why)) {
        reply_u8(c, 0); /* refused: say so before closing, the client names the cause */
        client_flush(c);
        client_close(c, why);
        return CLOSED;
    }
    reply_u8(c, 1);
    reply_raw(c, sp, sizeof sp);
    return HANDLED;
}

/* 1 when c may send commands; else c is closed (logged with its address). */
static int auth_admit(client_t *c) {
    char why[200];
    struct sockaddr_storage peer;
    int pl = sizeof peer;
    if (c->auth.state == DT_STORE_AUTH_OK || c->auth.state == DT_STORE_AUTH_PEER) return 1;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &pl) != 0) peer.ss_family = AF_UNSPEC;
    if (dt_store_auth_admit(c->srv->auth, &c->auth, (struct sockaddr *)&peer, why, sizeof why))
        return 1;
    client_close(c, why);
    return 0;
}

#define ENTRY_COST(klen) (sizeof(entry_t) + (klen))
#define WAIT_COST(nkeys) (sizeof(wait_req_t) + (nkeys) * sizeof(wait_link_t))

/* A write or wait that may add new_keys keys and bytes bytes fits the store's
 * limits (1), or the client is closed (0): a full store refuses what would grow
 * it, not what it already holds. */
static int admit(client_t *c, size_t new_keys, size_t bytes) {
    dt_store_server_t *srv = c->srv;
    if (srv->nentries + new_keys <= DT_STORE_MAX_KEYS &&
        srv->stored + bytes <= DT_STORE_MAX_STORED_BYTES)
        return 1;
    char why[200];
    snprintf(why, sizeof why, "the store is full: %zu keys and %zu bytes held (limits %zu keys, "
             "%zu bytes)", srv->nentries, srv->stored, (size_t)DT_STORE_MAX_KEYS,
             (size_t)DT_STORE_MAX_STORED_BYTES);
    client_close(c, why);
    return 0;
}

/* What setting key to a value of vlen bytes adds. */
static int admit_set(client_t *c, const dt_store_bytes_t *key, size_t vlen) {
    entry_t *e = map_find(c->srv, key->ptr, key->len);
    if (e) return admit(c, 0, vlen > e->vlen ? vlen - e->vlen : 0);
    return admit(c, 1, ENTRY_COST(key->len) + vlen);
}

/* What a frame listing n keys adds at most (new entries, waiters, values). */
static int admit_list(client_t *c, const dt_store_frame_t *f) {
    return admit(c, (size_t)f->n, f->size + f->n * ENTRY_COST(0) + WAIT_COST(f->n));
}

static int handle_frame(client_t *c, const dt_store_frame_t *f) {
    dt_store_server_t *srv = c->srv;
    char why[160];
    entry_t *e;

    if (f->cmd == DT_STORE_CMD_AUTH_HELLO || f->cmd == DT_STORE_CMD_AUTH_PROOF)
        return auth_frame(c, f);
    if (srv->auth && !auth_admit(c)) return CLOSED;
    if (f->cmd == DT_STORE_CMD_VALIDATE) {
        if (f->u32 != DT_STORE_VALIDATE_MAGIC) {
            snprintf(why, sizeof why, "VALIDATE with wrong magic 0x%08x (expected 0x%08x)",
                     f->u32, DT_STORE_VALIDATE_MAGIC);
            client_close(c, why);
            return CLOSED;
        }
        c->validated = 1;
        return HANDLED;
    }
    if (!c->validated) {
        snprintf(why, sizeof why, "first command must be VALIDATE, got %s",
                 dt_store_cmd_name(f->cmd));
        client_close(c, why);
        return CLOSED;
    }

    /* Whatever may grow the store is weighed first. */
    int fits = 1;
    switch (f->cmd) {
    case DT_STORE_CMD_SET: fits = admit_set(c, &f->key, f->a.len); break;
    case DT_STORE_CMD_APPEND:
        e = map_find(srv, f->key.ptr, f->key.len);
        fits = e ? admit(c, 0, f->a.len) : admit(c, 1, ENTRY_COST(f->key.len) + f->a.len);
        break;
    case DT_STORE_CMD_COMPARE_SET:
        fits = admit_set(c, &f->key, f->a.len > f->b.len ? f->a.len : f->b.len);
        break;
    case DT_STORE_CMD_ADD: fits = admit_set(c, &f->key, 32); break;
    case DT_STORE_CMD_BARRIER:
        e = map_find(srv, f->key.ptr, f->key.len);
        fits = admit(c, !e, (e ? 0 : ENTRY_COST(f->key.len)) + 32 + WAIT_COST(1));
        break;
    case DT_STORE_CMD_GET:
        e = map_find(srv, f->key.ptr, f->key.len);
        if (!e || !e->present) fits = admit(c, !e, ENTRY_COST(f->key.len) + WAIT_COST(1));
        break;
    case DT_STORE_CMD_WAIT:
    case DT_STORE_CMD_MULTI_GET:
        if (!keys_present(srv, f)) fits = admit_list(c, f);
        break;
    case DT_STORE_CMD_MULTI_SET: fits = admit_list(c, f); break;
    default: break;
    }
    if (!fits) return CLOSED;

    switch (f->cmd) {
    case DT_STORE_CMD_PING:
        reply_raw(c, &f->u32, 4);
        break;
    case DT_STORE_CMD_SET:
        e = map_get_or_create(srv, f->key.ptr, f->key.len);
        entry_set(srv, e, f->a.ptr, f->a.len);
        entry_notify(e);
        break;
    case DT_STORE_CMD_COMPARE_SET:
        e = map_find(srv, f->key.ptr, f->key.len);
        if (!e || !e->present) {
            if (f->a.len == 0) {
                e = map_get_or_create(srv, f->key.ptr, f->key.len);
                entry_set(srv, e, f->b.ptr, f->b.len);
                entry_notify(e);
                reply_bytes(c, f->b.ptr, f->b.len);
            } else {
                reply_bytes(c, f->a.ptr, f->a.len);
            }
        } else {
            if (e->vlen == f->a.len && !memcmp(e->val, f->a.ptr, f->a.len)) {
                entry_set(srv, e, f->b.ptr, f->b.len);
                entry_notify(e);
            }
            reply_bytes(c, e->val, e->vlen);
        }
        break;
    case DT_STORE_CMD_GET:
        e = map_find(srv, f->key.ptr, f->key.len);
        if (!e || !e->present) {
            wait_req_t *r = req_new(c, REQ_BLOCK, 1);
            req_add_link(r, map_get_or_create(srv, f->key.ptr, f->key.len));
            c->blocked = 1;
            return BLOCKED;
        }
        reply_bytes(c, e->val, e->vlen);
        break;
    case DT_STORE_CMD_ADD: {
        int64_t v;
        e = map_find(srv, f->key.ptr, f->key.len);
        if (parse_counter(e, &v) < 0) {
            client_close(c, "ADD on a key whose value is not a decimal integer");
            return CLOSED;
        }
        if (__builtin_add_overflow(v, f->i64, &v)) {
            client_close(c, "ADD overflows int64");
            return CLOSED;
        }
        e = map_get_or_create(srv, f->key.ptr, f->key.len);
        set_counter(srv, e, v);
        entry_notify(e);
        reply_i64(c, v);
        break;
    }
    case DT_STORE_CMD_CHECK:
        reply_u8(c, keys_present(srv, f) ? DT_STORE_CHECK_READY : DT_STORE_CHECK_NOT_READY);
        break;
    case DT_STORE_CMD_WAIT:
        if (keys_present(srv, f)) reply_u8(c, DT_STORE_WAIT_STOP_WAITING);
        else wait_on_missing(srv, c, f, REQ_WAIT);
        break;
    case DT_STORE_CMD_GETNUMKEYS:
        reply_i64(c, (int64_t)atomic_load(&srv->num_keys));
        break;
    case DT_STORE_CMD_DELETE_KEY:
        e = map_find(srv, f->key.ptr, f->key.len);
        if (e && e->present) {
            e->present = 0;
            srv->stored -= e->vlen;
            free(e->val);
            e->val = NULL;
            e->vlen = 0;
            atomic_fetch_sub(&srv->num_keys, 1);
            entry_maybe_free(srv, e);
            reply_i64(c, 1);
        } else {
            reply_i64(c, 0);
        }
        break;
    case DT_STORE_CMD_APPEND:
        e = map_get_or_create(srv, f->key.ptr, f->key.len);
        if (e->present) {
            if (e->vlen + f->a.len > DT_STORE_MAX_VALUE_BYTES) {
                client_close(c, "APPEND would grow a value past the 8 MiB limit");
                return CLOSED;
            }
            e->val = dt_xrealloc(e->val, e->vlen + f->a.len);
            memcpy(e->val + e->vlen, f->a.ptr, f->a.len);
            e->vlen += f->a.len;
            srv->stored += f->a.len; /* as entry_set counts a value's bytes */
        } else {
            entry_set(srv, e, f->a.ptr, f->a.len);
        }
        entry_notify(e);
        break;
    case DT_STORE_CMD_MULTI_GET: {
        if (!keys_present(srv, f)) {
            wait_on_missing(srv, c, f, REQ_BLOCK);
            c->blocked = 1;
            return BLOCKED;
        }
        const uint8_t *p = f->list;
        for (uint64_t i = 0; i < f->n; i++) {
            dt_store_bytes_t k = dt_store_list_next(&p);
            e = map_find(srv, k.ptr, k.len);
            reply_bytes(c, e->val, e->vlen);
        }
        break;
    }
    case DT_STORE_CMD_MULTI_SET: {
        const uint8_t *p = f->list;
        for (uint64_t i = 0; i < f->n; i++) {
            dt_store_bytes_t k = dt_store_list_next(&p);
            dt_store_bytes_t v = dt_store_list_next(&p);
            e = map_get_or_create(srv, k.ptr, k.len);
            entry_set(srv, e, v.ptr, v.len);
            entry_notify(e);
        }
        break;
    }
    case DT_STORE_CMD_CANCEL_WAIT: {
        wait_req_t *r = c->reqs;
        while (r) {
            wait_req_t *next = r->next;
            if (r->kind == REQ_WAIT) req_cancel(srv, r);
            r = next;
        }
        reply_u8(c, DT_STORE_WAIT_CANCELED);
        break;
    }
    case DT_STORE_CMD_LIST_KEYS: {
        reply_i64(c, (int64_t)atomic_load(&srv->num_keys));
        for (size_t b = 0; b < srv->nbuckets; b++)
            for (e = srv->buckets[b]; e; e = e->chain)
                if (e->present) reply_bytes(c, e->key, e->klen);
        break;
    }
    case DT_STORE_CMD_BARRIER: {
        int64_t v;
        e = map_find(srv, f->key.ptr, f->key.len);
        if (parse_counter(e, &v) < 0 || v == INT64_MAX) {
            client_close(c, "BARRIER on a key whose value is not a counter");
            return CLOSED;
        }
        e = map_get_or_create(srv, f->key.ptr, f->key.len);
        set_counter(srv, e, v + 1);
        if (v + 1 >= f->i64) {
            entry_notify(e);
            reply_u8(c, DT_STORE_WAIT_STOP_WAITING);
        } else {
            req_add_link(req_new(c, REQ_WAIT, 1), e);
        }
        break;
    }
    default:
        snprintf(why, sizeof why, "unsupported command %s", dt_store_cmd_name(f->cmd));
        client_close(c, why);
        return CLOSED;
    }
    return HANDLED;
}

/* Serves the whole frames at the start of buf; returns the bytes consumed. */
static size_t client_serve(client_t *c, const uint8_t *buf, size_t len) {
    size_t off = 0;
    c->need = 0;
    while (off < len && !c->closing && !c->blocked) {
        dt_store_frame_t f;
        size_t need = 0;
        char why[160];
        /* Judged on its first byte: a stranger's 1 GiB frame is never buffered
         * (the token exchange's fixed-size frames come before VALIDATE). */
        if (!c->validated && buf[off] != DT_STORE_CMD_VALIDATE &&
            buf[off] != DT_STORE_CMD_AUTH_HELLO && buf[off] != DT_STORE_CMD_AUTH_PROOF) {
            snprintf(why, sizeof why, "first command must be VALIDATE, got %s",
                     dt_store_cmd_name(buf[off]));
            client_close(c, why);
            break;
        }
        dt_store_parse_result_t r = dt_store_parse(buf + off, len - off, &f, &need, why,
                                                   sizeof why);
        if (r == DT_STORE_PARSE_NEED_MORE) {
            if (need > DT_STORE_MAX_FRAME_BYTES) {
                client_close(c, "request larger than 128 MiB");
                break;
            }
            c->need = need;
            break;
        }
        if (r == DT_STORE_PARSE_BAD) {
            char msg[256];
            snprintf(msg, sizeof msg, "bad frame: %s", why);
            client_close(c, msg);
            break;
        }
        if (handle_frame(c, &f) != HANDLED) break;
        off += f.size;
    }
    return off;
}

/* Serves what is buffered in c->in (after new bytes or a wake-up). */
static void client_serve_buffered(client_t *c) {
    if (c->closing || c->blocked || c->in.len < c->need) return;
    size_t used = client_serve(c, c->in.data, c->in.len);
    if (!c->closing) {
        dt_store_buf_consume(&c->in, used);
        c->srv->buffered -= used;
    }
}

/* Buffers input that does not form a whole frame yet, within the connection's and
 * the server's budgets (0 when it did not fit and the client is closed). */
static int client_buffer(client_t *c, const uint8_t *p, size_t n) {
    dt_store_server_t *srv = c->srv;
    if (c->in.len + n > DT_STORE_MAX_FRAME_BYTES) {
        client_close(c, "more than 128 MiB of unanswered input");
        return 0;
    }
    if (srv->buffered + n > DT_STORE_MAX_BUFFERED_BYTES) {
        client_close(c, "the input buffered for all connections is at its 256 MiB budget");
        return 0;
    }
    dt_store_buf_put_raw(&c->in, p, n);
    srv->buffered += n;
    return 1;
}

/* Runs after every loop callback that may have produced replies or wake-ups. */
static void server_drain(dt_store_server_t *srv) {
    for (;;) {
        while (srv->resume) {
            client_t *c = srv->resume;
            srv->resume = c->resume_next;
            c->in_resume = 0;
            c->need = 0;
            client_serve_buffered(c);
        }
        if (!srv->dirty) break;
        while (srv->dirty) {
            client_t *c = srv->dirty;
            srv->dirty = c->dirty_next;
            c->in_dirty = 0;
            client_flush(c);
        }
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    client_t *c = (client_t *)h;
    buf->base = (char *)c->srv->readbuf;
    buf->len = READ_BUF_BYTES;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    client_t *c = (client_t *)s;
    dt_store_server_t *srv = c->srv;
    if (nread < 0) {
        if (nread == UV_EOF || nread == UV_ECONNRESET) {
            if (dt_log_get_level() <= DT_LOG_DEBUG)
                DT_LOG_DEBUG("store: %s disconnected", client_addr(c));
            client_close(c, NULL);
        } else {
            char why[128];
            snprintf(why, sizeof why, "read failed: %s", uv_strerror((int)nread));
            client_close(c, why);
        }
        server_drain(srv);
        return;
    }
    if (nread == 0 || c->closing) return;
    const uint8_t *data = (const uint8_t *)buf->base;
    size_t n = (size_t)nread;
    if (c->in.len == 0 && !c->blocked) {
        /* Fast path: whole frames straight from the read buffer. */
        size_t used = client_serve(c, data, n);
        if (!c->closing && used < n) client_buffer(c, data + used, n - used);
    } else if (client_buffer(c, data, n)) {
        client_serve_buffered(c);
    }
    if (!c->closing && c->in.len == 0 && c->in.cap > (1u << 20)) dt_store_buf_free(&c->in);
    server_drain(srv);
}

/* 1 when a and b are the same IP address (ports aside). */
static int same_peer(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) return 0;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                       &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
    return 0;
}

/* Closes a connection the server cannot take; logs at most one line a second. */
static void refuse(client_t *c, const char *why) {
    dt_store_server_t *srv = c->srv;
    uint64_t now = uv_now(&srv->loop);
    if (srv->last_refusal_ms == 0 || now - srv->last_refusal_ms >= 1000) {
        DT_LOG_WARN("store: refusing connection from %s: %s (%u more refused since the last "
                    "such line)", client_addr(c), why, srv->refused_quiet);
        srv->last_refusal_ms = now;
        srv->refused_quiet = 0;
    } else {
        srv->refused_quiet++;
    }
    client_close(c, NULL);
}

/* Admits c under the connection limits: at the file descriptor limit the oldest
 * connection that has not sent VALIDATE makes room, else c is refused. */
static int admit_connection(client_t *c) {
    dt_store_server_t *srv = c->srv;
    char why[160];
    size_t open = 0, same = 0;
    client_t *oldest = NULL;
    for (client_t *o = srv->clients; o; o = o->next) {
        if (o == c || o->closing) continue;
        open++;
        if (same_peer(&o->peer, &c->peer)) same++;
        if (!o->validated) oldest = o; /* the list is newest first */
    }
    if (same >= DT_STORE_MAX_CONNS_PER_PEER) {
        snprintf(why, sizeof why, "%zu connections from this address already (limit %d)", same,
                 DT_STORE_MAX_CONNS_PER_PEER);
        refuse(c, why);
        return 0;
    }
    if (open >= srv->max_conns) {
        snprintf(why, sizeof why, "%zu connections open, at the file descriptor limit (%ld)",
                 open, srv->fd_limit);
        if (!oldest) {
            refuse(c, why);
            return 0;
        }
        refuse(oldest, why);
    }
    return 1;
}

static void on_connection(uv_stream_t *listener, int status) {
    dt_store_server_t *srv = listener->data;
    if (status < 0) {
        DT_LOG_WARN("store: cannot accept a connection: %s (file descriptor limit %ld)",
                    uv_strerror(status), srv->fd_limit);
        return;
    }
    client_t *c = dt_xcalloc(1, sizeof *c);
    c->srv = srv;
    uv_tcp_init(&srv->loop, &c->tcp);
    c->next = srv->clients;
    if (srv->clients) srv->clients->prev = c;
    srv->clients = c;
    c->accepted_ms = uv_now(&srv->loop);
    atomic_fetch_add(&srv->num_clients, 1);
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) < 0) {
        client_close(c, "accept failed");
        return;
    }
    int sl = sizeof c->peer;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->peer, &sl) != 0)
        c->peer.ss_family = 0;
    if (!admit_connection(c)) return;
    uv_tcp_nodelay(&c->tcp, 1);
    int r = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (r < 0) client_close(c, uv_strerror(r));
}

/* Closes connections that did not send VALIDATE in time; one log line per sweep. */
static void on_sweep(uv_timer_t *t) {
    dt_store_server_t *srv = t->data;
    uint64_t now = uv_now(&srv->loop);
    size_t n = 0;
    client_t *last = NULL;
    for (client_t *c = srv->clients; c; c = c->next) {
        if (c->validated || c->closing ||
            now - c->accepted_ms < (uint64_t)DT_STORE_VALIDATE_TIMEOUT_S * 1000)
            continue;
        if (!last) client_addr(c);
        last = last ? last : c;
        n++;
        client_close(c, NULL);
    }
    if (n)
        DT_LOG_WARN("store: closed %zu connection(s) that sent no VALIDATE within %d s "
                    "(one from %s)", n, DT_STORE_VALIDATE_TIMEOUT_S, last->addr);
}

/* ---- start / stop ----------------------------------------------------------- */

static void on_stop(uv_async_t *a) {
    dt_store_server_t *srv = a->data;
    for (client_t *c = srv->clients; c; c = c->next) client_close(c, NULL);
    uv_close((uv_handle_t *)&srv->sweep, NULL);
    uv_close((uv_handle_t *)&srv->listener, NULL);
    uv_close((uv_handle_t *)&srv->stop_async, NULL);
}

static void *server_thread(void *arg) {
    dt_store_server_t *srv = arg;
    uv_run(&srv->loop, UV_RUN_DEFAULT);
    return NULL;
}

static int read_somaxconn(void) {
    int v = 0;
    FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
    if (f) {
        if (fscanf(f, "%d", &v) != 1) v = 0;
        fclose(f);
    }
    return v > 0 ? v : 4096;
}

/* Raises the soft file descriptor limit to the hard one (a store is worth the
 * descriptors the system allows) and returns the limit now in force. */
static long raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : rl.rlim_max;
        struct rlimit up = {.rlim_cur = want, .rlim_max = rl.rlim_max};
        if (want > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &up) == 0) {
            DT_LOG_DEBUG("store: file descriptor limit raised from %ld to %ld",
                         (long)rl.rlim_cur, (long)want);
            rl.rlim_cur = want;
        }
    }
    return rl.rlim_cur == RLIM_INFINITY ? 1L << 20 : (long)rl.rlim_cur;
}

static void free_map(dt_store_server_t *srv) {
    for (size_t b = 0; b < srv->nbuckets; b++) {
        entry_t *e = srv->buckets[b];
        while (e) {
            entry_t *next = e->chain;
            free(e->val);
            free(e);
            e = next;
        }
    }
    free(srv->buckets);
}

dt_status_t dt_store_server_start(const char *host, int port, dt_store_server_t **out) {
    return dt_store_server_start_auth(host, port, NULL, 0, out);
}

dt_status_t dt_store_server_start_auth(const char *host, int port, const dt_store_token_t *token,
                                       int allow_peers, dt_store_server_t **out) {
    *out = NULL;
    if (!host || !*host) host = "0.0.0.0";
    if (port < 0 || port > 65535)
        return dt_error(DT_STATUS_INVALID, "store: port %d is outside 0..65535", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int gr = getaddrinfo(host, NULL, &hints, &ai);
    if (gr != 0 || !ai)
        return dt_error(DT_STATUS_INVALID, "store: cannot resolve host '%s': %s", host,
                        gai_strerror(gr));
    struct sockaddr_storage addr;
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (addr.ss_family == AF_INET6) ((struct sockaddr_in6 *)&addr)->sin6_port = htons(port);
    else ((struct sockaddr_in *)&addr)->sin_port = htons(port);

    dt_store_server_t *srv = dt_xcalloc(1, sizeof *srv);
    dt_status_t st = DT_STATUS_OK;
    snprintf(srv->host, sizeof srv->host, "%s", host);
    srv->nbuckets = 1024;
    srv->buckets = dt_xcalloc(srv->nbuckets, sizeof *srv->buckets);
    srv->fd_limit = raise_fd_limit();
    srv->max_conns = srv->fd_limit > 2 * DT_STORE_FD_RESERVE
                         ? (size_t)(srv->fd_limit - DT_STORE_FD_RESERVE)
                         : (size_t)(srv->fd_limit / 2);
    if (token) srv->auth = dt_store_auth_new(token, allow_peers);
    int r = uv_loop_init(&srv->loop);
    if (r < 0) {
        st = dt_error(DT_STATUS_SYS, "store: uv_loop_init: %s", uv_strerror(r));
        goto out_free;
    }
    uv_tcp_init(&srv->loop, &srv->listener);
    srv->listener.data = srv;
    uv_async_init(&srv->loop, &srv->stop_async, on_stop);
    srv->stop_async.data = srv;
    uv_timer_init(&srv->loop, &srv->sweep);
    srv->sweep.data = srv;
    uv_timer_start(&srv->sweep, on_sweep, SWEEP_INTERVAL_MS, SWEEP_INTERVAL_MS);
    r = uv_tcp_bind(&srv->listener, (const struct sockaddr *)&addr, 0);
    if (r == 0) r = uv_listen((uv_stream_t *)&srv->listener, read_somaxconn(), on_connection);
    if (r < 0) {
        st = dt_error(r == UV_EADDRINUSE ? DT_STATUS_IO : DT_STATUS_SYS,
                      "store: cannot listen on %s:%d: %s", host, port, uv_strerror(r));
        goto out_close_loop;
    }
    struct sockaddr_storage bound;
    int bl = sizeof bound;
    uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&bound, &bl);
    srv->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                  : ((struct sockaddr_in *)&bound)->sin_port);
    r = pthread_create(&srv->thread, NULL, server_thread, srv);
    if (r != 0) {
        st = dt_error(DT_STATUS_SYS, "store: cannot start its thread: %s", strerror(r));
        goto out_close_loop;
    }
    DT_LOG_DEBUG("store: listening on %s:%d", host, srv->port);
    *out = srv;
    return DT_STATUS_OK;

out_close_loop:
    uv_close((uv_handle_t *)&srv->sweep, NULL);
    uv_close((uv_handle_t *)&srv->listener, NULL);
    uv_close((uv_handle_t *)&srv->stop_async, NULL);
    uv_run(&srv->loop, UV_RUN_DEFAULT);
    uv_loop_close(&srv->loop);
out_free:
    dt_store_auth_free(srv->auth);
    free(srv->buckets);
    free(srv);
    return st;
}

int dt_store_server_port(const dt_store_server_t *srv) { return srv ? srv->port : -1; }

size_t dt_store_server_num_keys(dt_store_server_t *srv) {
    return srv ? atomic_load(&srv->num_keys) : 0;
}

size_t dt_store_server_num_clients(dt_store_server_t *srv) {
    return srv ? atomic_load(&srv->num_clients) : 0;
}

void dt_store_server_stop(dt_store_server_t *srv) {
    if (!srv) return;
    uv_async_send(&srv->stop_async);
    pthread_join(srv->thread, NULL);
    int r = uv_loop_close(&srv->loop);
    if (r < 0) DT_LOG_WARN("store: loop did not close cleanly: %s", uv_strerror(r));
    free_map(srv);
    dt_store_auth_free(srv->auth);
    free(srv);
}
