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
#include <string.h>
#include <uv.h>

#include "common/log.h"
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
                    "such line)", dt_store_conn_addr_(c), why, srv->refused_quiet);
        srv->last_refusal_ms = now;
        srv->refused_quiet = 0;
    } else {
        srv->refused_quiet++;
    }
    dt_store_conn_close_(c, NULL);
}

/* Admits c under the connection limits: at the file descriptor limit the oldest
 * connection that has not sent VALIDATE makes room, else c is refused. */
int dt_store_admit_conn_(client_t *c) {
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
