/*
 * store_server_map.c - the store's key map and the waits on its keys: a hash map
 * of entries (a key, maybe a value, and the FIFO of requests waiting for it), and
 * the requests that the writes making their keys exist wake (no polling). A WAIT
 * or BARRIER is answered when woken; a blocked GET or MULTI_GET puts its
 * connection on the resume list (store_server_conn.c serves it again).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "rendezvous/store_server_impl.h"

/* ---- the key map ------------------------------------------------------------ */

static uint64_t hash_key(const uint8_t *k, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ k[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

entry_t *dt_store_map_find_(dt_store_server_t *srv, const uint8_t *k, size_t n) {
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

entry_t *dt_store_map_get_or_create_(dt_store_server_t *srv, const uint8_t *k, size_t n) {
    entry_t *e = dt_store_map_find_(srv, k, n);
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
void dt_store_entry_maybe_free_(dt_store_server_t *srv, entry_t *e) {
    if (e->present || e->wait_head) return;
    entry_t **pp = &srv->buckets[e->hash & (srv->nbuckets - 1)];
    while (*pp != e) pp = &(*pp)->chain;
    *pp = e->chain;
    srv->nentries--;
    srv->stored -= sizeof *e + e->klen + e->vlen;
    free(e->val);
    free(e);
}

void dt_store_entry_set_(dt_store_server_t *srv, entry_t *e, const void *v, size_t n) {
    if (!e->present) atomic_fetch_add(&srv->num_keys, 1);
    e->present = 1;
    srv->stored = srv->stored - e->vlen + n;
    if (e->vlen != n || !e->val) e->val = dt_xrealloc(e->val, n);
    if (n) memcpy(e->val, v, n);
    e->vlen = n;
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
void dt_store_req_cancel_(dt_store_server_t *srv, wait_req_t *r) {
    for (size_t i = 0; i < r->nlinks; i++) {
        entry_t *e = r->links[i].entry;
        if (!e) continue;
        link_detach(&r->links[i]);
        dt_store_entry_maybe_free_(srv, e);
    }
    req_free(r);
}

static void req_complete(wait_req_t *r) {
    client_t *c = r->client;
    if (r->kind == REQ_WAIT) {
        dt_store_reply_u8_(c, DT_STORE_WAIT_STOP_WAITING);
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
void dt_store_entry_notify_(entry_t *e) {
    wait_link_t *l;
    while ((l = e->wait_head) != NULL) {
        wait_req_t *r = l->req;
        link_detach(l);
        if (--r->remaining == 0) req_complete(r);
    }
}

/* Registers a request on the given entries (all missing, or the barrier key). */
wait_req_t *dt_store_req_new_(client_t *c, int kind, size_t nlinks) {
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

void dt_store_req_add_link_(wait_req_t *r, entry_t *e) {
    wait_link_t *l = &r->links[r->nlinks++];
    l->req = r;
    l->entry = e;
    l->prev = e->wait_tail;
    if (e->wait_tail) e->wait_tail->next = l;
    else e->wait_head = l;
    e->wait_tail = l;
    r->remaining++;
}

void dt_store_map_free_(dt_store_server_t *srv) {
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
