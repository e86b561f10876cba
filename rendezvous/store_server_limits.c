/*
 * store_server_limits.c - what a store client may cost, and who may be a client.
 *
 * What a client may cost is bounded (the DT_STORE_MAX_* limits in store.h): the
 * first frame must be VALIDATE and arrive within DT_STORE_VALIDATE_TIMEOUT_S;
 * buffered input, stored keys and bytes, and unsent replies each have a budget per
 * connection and across all of them; a connection whose replies queue up is not
 * read until it reads them; connections are capped per peer address and below the
 * file descriptor limit, refusals are logged (at most one line a second). A store
 * with a token admits commands only after the token exchange (store_auth.h).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/log.h"
#include "common/mem.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"
#include "rendezvous/store_server_impl.h"

/* The token exchange (rendezvous/store_auth.h): AUTH_HELLO / AUTH_PROOF, and the
 * gate every other command of a store with a token passes first. */
int dt_store_auth_frame_(client_t *c, const dt_store_frame_t *f) {
    dt_store_server_t *srv = c->srv;
    char why[200];
    struct sockaddr_storage peer;
    int pl = sizeof peer;
    if (!srv->auth) {
        snprintf(why, sizeof why, "%s, but this store has no token", dt_store_cmd_name(f->cmd));
        dt_store_conn_close_(c, why);
        return CLOSED;
    }
    if (f->cmd == DT_STORE_CMD_AUTH_HELLO) {
        uint8_t sn[DT_STORE_AUTH_NONCE_BYTES];
        if (c->validated ||
            !dt_store_auth_hello(srv->auth, &c->auth, f->auth, sn, why, sizeof why)) {
            if (c->validated) snprintf(why, sizeof why, "AUTH_HELLO after VALIDATE");
            dt_store_conn_close_(c, why);
            return CLOSED;
        }
        dt_store_reply_raw_(c, sn, sizeof sn);
        return HANDLED;
    }
    uint8_t sp[DT_SHA256_BYTES];
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &pl) != 0) peer.ss_family = AF_UNSPEC;
    if (!dt_store_auth_proof(srv->auth, &c->auth, f->auth, (struct sockaddr *)&peer, sp, why,
                             sizeof why)) {
        dt_store_reply_u8_(c, 0); /* refused: say so before closing, the client names the cause */
        dt_store_conn_flush_(c);
        dt_store_conn_close_(c, why);
        return CLOSED;
    }
    dt_store_reply_u8_(c, 1);
    dt_store_reply_raw_(c, sp, sizeof sp);
    return HANDLED;
}

/* 1 when c may send commands; else c is closed (logged with its address). */
int dt_store_auth_gate_(client_t *c) {
    char why[200];
    struct sockaddr_storage peer;
    int pl = sizeof peer;
    if (c->auth.state == DT_STORE_AUTH_OK || c->auth.state == DT_STORE_AUTH_PEER) return 1;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &pl) != 0) peer.ss_family = AF_UNSPEC;
    if (dt_store_auth_admit(c->srv->auth, &c->auth, (struct sockaddr *)&peer, why, sizeof why))
        return 1;
    dt_store_conn_close_(c, why);
    return 0;
}

/* A write or wait that may add new_keys keys and bytes bytes fits the store's
 * limits (1), or the client is closed (0): a full store refuses what would grow
 * it, not what it already holds. */
int dt_store_admit_(client_t *c, size_t new_keys, size_t bytes) {
    dt_store_server_t *srv = c->srv;
    if (srv->nentries + new_keys <= DT_STORE_MAX_KEYS &&
        srv->stored + bytes <= DT_STORE_MAX_STORED_BYTES)
        return 1;
    char why[200];
    snprintf(why, sizeof why, "the store is full: %zu keys and %zu bytes held (limits %zu keys, "
             "%zu bytes)", srv->nentries, srv->stored, (size_t)DT_STORE_MAX_KEYS,
             (size_t)DT_STORE_MAX_STORED_BYTES);
    dt_store_conn_close_(c, why);
    return 0;
}

/* What setting key to a value of vlen bytes adds. */
int dt_store_admit_set_(client_t *c, const dt_store_bytes_t *key, size_t vlen) {
    entry_t *e = dt_store_map_find_(c->srv, key->ptr, key->len);
    if (e) return dt_store_admit_(c, 0, vlen > e->vlen ? vlen - e->vlen : 0);
    return dt_store_admit_(c, 1, ENTRY_COST(key->len) + vlen);
}

/* What a frame listing n keys adds at most (new entries, waiters, values). */
int dt_store_admit_list_(client_t *c, const dt_store_frame_t *f) {
    return dt_store_admit_(c, (size_t)f->n, f->size + f->n * ENTRY_COST(0) + WAIT_COST(f->n));
}

/* ---- the peer table: connections per address ------------------------------- */

/* The address bytes of ss (4 or 16), 0 when it has no IP address. */
static size_t peer_ip(const struct sockaddr_storage *ss, const uint8_t **ip) {
    if (ss->ss_family == AF_INET) {
        *ip = (const uint8_t *)&((const struct sockaddr_in *)ss)->sin_addr;
        return 4;
    }
    if (ss->ss_family == AF_INET6) {
        *ip = (const uint8_t *)&((const struct sockaddr_in6 *)ss)->sin6_addr;
        return 16;
    }
    return 0;
}

static uint64_t peer_hash(int family, const uint8_t *ip, size_t n) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)family;
    for (size_t i = 0; i < n; i++) h = (h ^ ip[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static void peers_grow(dt_store_server_t *srv) {
    size_t nb = srv->npeer_buckets ? srv->npeer_buckets * 2 : 256;
    peer_t **b = dt_xcalloc(nb, sizeof *b);
    for (size_t i = 0; i < srv->npeer_buckets; i++) {
        peer_t *p = srv->peers[i];
        while (p) {
            peer_t *next = p->chain;
            p->chain = b[p->hash & (nb - 1)];
            b[p->hash & (nb - 1)] = p;
            p = next;
        }
    }
    free(srv->peers);
    srv->peers = b;
    srv->npeer_buckets = nb;
}

/* The entry of ss's address (NULL when none is counted yet); *h gets the hash,
 * *ip and *n the address bytes (n 0: no IP address, not capped per peer). */
static peer_t *peer_find(dt_store_server_t *srv, const struct sockaddr_storage *ss,
                         uint64_t *h, const uint8_t **ip, size_t *n) {
    *n = peer_ip(ss, ip);
    if (!*n) return NULL;
    *h = peer_hash(ss->ss_family, *ip, *n);
    if (!srv->npeer_buckets) return NULL;
    for (peer_t *p = srv->peers[*h & (srv->npeer_buckets - 1)]; p; p = p->chain)
        if (p->hash == *h && p->family == ss->ss_family && !memcmp(p->ip, *ip, *n)) return p;
    return NULL;
}

static peer_t *peer_new(dt_store_server_t *srv, int family, uint64_t h, const uint8_t *ip,
                        size_t n) {
    if (srv->npeers + 1 > srv->npeer_buckets) peers_grow(srv);
    peer_t *p = dt_xcalloc(1, sizeof *p);
    p->hash = h;
    p->family = family;
    memcpy(p->ip, ip, n);
    peer_t **head = &srv->peers[h & (srv->npeer_buckets - 1)];
    p->chain = *head;
    *head = p;
    srv->npeers++;
    return p;
}

static void peer_put(dt_store_server_t *srv, peer_t *p) {
    if (--p->conns > 0) return;
    peer_t **pp = &srv->peers[p->hash & (srv->npeer_buckets - 1)];
    while (*pp != p) pp = &(*pp)->chain;
    *pp = p->chain;
    srv->npeers--;
    free(p);
}

void dt_store_peers_free_(dt_store_server_t *srv) {
    for (size_t i = 0; i < srv->npeer_buckets; i++) {
        peer_t *p = srv->peers[i];
        while (p) {
            peer_t *next = p->chain;
            free(p);
            p = next;
        }
    }
    free(srv->peers);
    srv->peers = NULL;
    srv->npeer_buckets = srv->npeers = 0;
}

/* ---- connection limits ------------------------------------------------------- */

static void unval_remove(client_t *c) {
    dt_store_server_t *srv = c->srv;
    if (!c->in_unval) return;
    if (c->unval_prev) c->unval_prev->unval_next = c->unval_next;
    else srv->unval_head = c->unval_next;
    if (c->unval_next) c->unval_next->unval_prev = c->unval_prev;
    else srv->unval_tail = c->unval_prev;
    c->unval_prev = c->unval_next = NULL;
    c->in_unval = 0;
}

void dt_store_conn_validated_(client_t *c) { unval_remove(c); }

void dt_store_conn_release_(client_t *c) {
    unval_remove(c);
    if (!c->counted) return;
    c->counted = 0;
    c->srv->open--;
    if (c->peer_entry) peer_put(c->srv, c->peer_entry);
    c->peer_entry = NULL;
}

/* Closes a connection the server cannot take; logs at most one line a second. */
static void refuse(client_t *c, const char *why) {
    dt_store_server_t *srv = c->srv;
    uint64_t now = uv_now(&srv->loop);
    if (srv->last_refusal_ms == 0 || now - srv->last_refusal_ms >= 1000) {
        DT_LOG_WARN("store: refusing connection from %s: %s (%u more refused since the last "
                    "such line)", dt_store_conn_addr_(c), why, srv->refused_quiet);
        srv->last_refusal_ms = now;
        srv->refused_quiet = 0;
    } else {
        srv->refused_quiet++;
    }
    dt_store_conn_close_(c, NULL);
}

/* Admits c under the connection limits: at the file descriptor limit the oldest
 * connection that has not sent VALIDATE makes room, else c is refused. The counts
 * are kept as connections come and go, so admitting one costs no walk over the
 * others. */
int dt_store_admit_conn_(client_t *c) {
    dt_store_server_t *srv = c->srv;
    char why[160];
    uint64_t h = 0;
    const uint8_t *ip = NULL;
    size_t iplen;
    peer_t *p = peer_find(srv, &c->peer, &h, &ip, &iplen);
    if (p && p->conns >= DT_STORE_MAX_CONNS_PER_PEER) {
        snprintf(why, sizeof why, "%zu connections from this address already (limit %d)",
                 p->conns, DT_STORE_MAX_CONNS_PER_PEER);
        refuse(c, why);
        return 0;
    }
    if (srv->open >= srv->max_conns) {
        snprintf(why, sizeof why, "%zu connections open, at the file descriptor limit (%ld)",
                 srv->open, srv->fd_limit);
        if (!srv->unval_head) {
            refuse(c, why);
            return 0;
        }
        refuse(srv->unval_head, why);
        /* The one refused may have been p's last connection (p is freed). */
        p = peer_find(srv, &c->peer, &h, &ip, &iplen);
    }
    if (!p && iplen) p = peer_new(srv, c->peer.ss_family, h, ip, iplen);
    c->counted = 1;
    srv->open++;
    c->peer_entry = p;
    if (p) p->conns++;
    c->in_unval = 1;
    c->unval_prev = srv->unval_tail;
    if (srv->unval_tail) srv->unval_tail->unval_next = c;
    else srv->unval_head = c;
    srv->unval_tail = c;
    return 1;
}
