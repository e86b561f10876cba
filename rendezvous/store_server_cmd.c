/*
 * store_server_cmd.c - the store's commands: one whole frame (rendezvous/proto.h)
 * served against the key map, after the token gate and the store's budgets
 * (store_server_limits.c) have weighed it. Counters (ADD, BARRIER) are decimal
 * text, as torch's TCPStore keeps them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server_impl.h"

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
    dt_store_entry_set_(srv, e, buf, (size_t)n);
}

/* 1 when every key of the list is present. */
static int keys_present(dt_store_server_t *srv, const dt_store_frame_t *f) {
    const uint8_t *p = f->list;
    for (uint64_t i = 0; i < f->n; i++) {
        dt_store_bytes_t k = dt_store_list_next(&p);
        entry_t *e = dt_store_map_find_(srv, k.ptr, k.len);
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
        entry_t *e = dt_store_map_find_(srv, k.ptr, k.len);
        if (!e || !e->present) missing++;
    }
    wait_req_t *r = dt_store_req_new_(c, kind, missing);
    p = f->list;
    for (uint64_t i = 0; i < f->n; i++) {
        dt_store_bytes_t k = dt_store_list_next(&p);
        entry_t *e = dt_store_map_get_or_create_(srv, k.ptr, k.len);
        if (!e->present) dt_store_req_add_link_(r, e);
    }
}

int dt_store_handle_frame_(client_t *c, const dt_store_frame_t *f) {
    dt_store_server_t *srv = c->srv;
    char why[160];
    entry_t *e;

    if (f->cmd == DT_STORE_CMD_AUTH_HELLO || f->cmd == DT_STORE_CMD_AUTH_PROOF)
        return dt_store_auth_frame_(c, f);
    if (srv->auth && !dt_store_auth_gate_(c)) return CLOSED;
    if (f->cmd == DT_STORE_CMD_VALIDATE) {
        if (f->u32 != DT_STORE_VALIDATE_MAGIC) {
            snprintf(why, sizeof why, "VALIDATE with wrong magic 0x%08x (expected 0x%08x)",
                     f->u32, DT_STORE_VALIDATE_MAGIC);
            dt_store_conn_close_(c, why);
            return CLOSED;
        }
        if (!c->validated) dt_store_conn_validated_(c);
        c->validated = 1;
        return HANDLED;
    }
    if (!c->validated) {
        snprintf(why, sizeof why, "first command must be VALIDATE, got %s",
                 dt_store_cmd_name(f->cmd));
        dt_store_conn_close_(c, why);
        return CLOSED;
    }

    /* Whatever may grow the store is weighed first. */
    int fits = 1;
    switch (f->cmd) {
    case DT_STORE_CMD_SET: fits = dt_store_admit_set_(c, &f->key, f->a.len); break;
    case DT_STORE_CMD_APPEND:
        e = dt_store_map_find_(srv, f->key.ptr, f->key.len);
        fits = e ? dt_store_admit_(c, 0, f->a.len)
                 : dt_store_admit_(c, 1, ENTRY_COST(f->key.len) + f->a.len);
        break;
    case DT_STORE_CMD_COMPARE_SET:
        fits = dt_store_admit_set_(c, &f->key, f->a.len > f->b.len ? f->a.len : f->b.len);
        break;
    case DT_STORE_CMD_ADD: fits = dt_store_admit_set_(c, &f->key, 32); break;
    case DT_STORE_CMD_BARRIER:
        e = dt_store_map_find_(srv, f->key.ptr, f->key.len);
        fits = dt_store_admit_(c, !e, (e ? 0 : ENTRY_COST(f->key.len)) + 32 + WAIT_COST(1));
        break;
    case DT_STORE_CMD_GET:
        e = dt_store_map_find_(srv, f->key.ptr, f->key.len);
        if (!e || !e->present) fits = dt_store_admit_(c, !e, ENTRY_COST(f->key.len) + WAIT_COST(1));
        break;
    case DT_STORE_CMD_WAIT:
    case DT_STORE_CMD_MULTI_GET:
        if (!keys_present(srv, f)) fits = dt_store_admit_list_(c, f);
        break;
    case DT_STORE_CMD_MULTI_SET: fits = dt_store_admit_list_(c, f); break;
    default: break;
    }
    if (!fits) return CLOSED;

    switch (f->cmd) {
    case DT_STORE_CMD_PING:
        dt_store_reply_raw_(c, &f->u32, 4);
        break;
    case DT_STORE_CMD_SET:
        e = dt_store_map_get_or_create_(srv, f->key.ptr, f->key.len);
        dt_store_entry_set_(srv, e, f->a.ptr, f->a.len);
        dt_store_entry_notify_(e);
        break;
    case DT_STORE_CMD_COMPARE_SET:
        e = dt_store_map_find_(srv, f->key.ptr, f->key.len);
        if (!e || !e->present) {
            if (f->a.len == 0) {
                e = dt_store_map_get_or_create_(srv, f->key.ptr, f->key.len);
                dt_store_entry_set_(srv, e, f->b.ptr, f->b.len);
                dt_store_entry_notify_(e);
                dt_store_reply_bytes_(c, f->b.ptr, f->b.len);
            } else {
                dt_store_reply_bytes_(c, f->a.ptr, f->a.len);
            }
        } else {
            if (e->vlen == f->a.len && !memcmp(e->val, f->a.ptr, f->a.len)) {
                dt_store_entry_set_(srv, e, f->b.ptr, f->b.len);
                dt_store_entry_notify_(e);
            }
            dt_store_reply_bytes_(c, e->val, e->vlen);
        }
        break;
    case DT_STORE_CMD_GET:
        e = dt_store_map_find_(srv, f->key.ptr, f->key.len);
        if (!e || !e->present) {
            wait_req_t *r = dt_store_req_new_(c, REQ_BLOCK, 1);
            dt_store_req_add_link_(r, dt_store_map_get_or_create_(srv, f->key.ptr, f->key.len));
            c->blocked = 1;
            return BLOCKED;
        }
        dt_store_reply_bytes_(c, e->val, e->vlen);
        break;
    case DT_STORE_CMD_ADD: {
        int64_t v;
        e = dt_store_map_find_(srv, f->key.ptr, f->key.len);
        if (parse_counter(e, &v) < 0) {
            dt_store_conn_close_(c, "ADD on a key whose value is not a decimal integer");
            return CLOSED;
        }
        if (__builtin_add_overflow(v, f->i64, &v)) {
            dt_store_conn_close_(c, "ADD overflows int64");
            return CLOSED;
        }
        e = dt_store_map_get_or_create_(srv, f->key.ptr, f->key.len);
        set_counter(srv, e, v);
        dt_store_entry_notify_(e);
        dt_store_reply_i64_(c, v);
        break;
    }
    case DT_STORE_CMD_CHECK:
        dt_store_reply_u8_(c, keys_present(srv, f) ? DT_STORE_CHECK_READY
                                                   : DT_STORE_CHECK_NOT_READY);
        break;
    case DT_STORE_CMD_WAIT:
        if (keys_present(srv, f)) dt_store_reply_u8_(c, DT_STORE_WAIT_STOP_WAITING);
        else wait_on_missing(srv, c, f, REQ_WAIT);
        break;
    case DT_STORE_CMD_GETNUMKEYS:
        dt_store_reply_i64_(c, (int64_t)atomic_load(&srv->num_keys));
        break;
    case DT_STORE_CMD_DELETE_KEY:
        e = dt_store_map_find_(srv, f->key.ptr, f->key.len);
        if (e && e->present) {
            e->present = 0;
            srv->stored -= e->vlen;
            free(e->val);
            e->val = NULL;
            e->vlen = 0;
            atomic_fetch_sub(&srv->num_keys, 1);
            dt_store_entry_maybe_free_(srv, e);
            dt_store_reply_i64_(c, 1);
        } else {
            dt_store_reply_i64_(c, 0);
        }
        break;
    case DT_STORE_CMD_APPEND:
        e = dt_store_map_get_or_create_(srv, f->key.ptr, f->key.len);
        if (e->present) {
            if (e->vlen + f->a.len > DT_STORE_MAX_VALUE_BYTES) {
                dt_store_conn_close_(c, "APPEND would grow a value past the 8 MiB limit");
                return CLOSED;
            }
            e->val = dt_xrealloc(e->val, e->vlen + f->a.len);
            memcpy(e->val + e->vlen, f->a.ptr, f->a.len);
            e->vlen += f->a.len;
            srv->stored += f->a.len; /* as entry_set counts a value's bytes */
        } else {
            dt_store_entry_set_(srv, e, f->a.ptr, f->a.len);
        }
        dt_store_entry_notify_(e);
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
            e = dt_store_map_find_(srv, k.ptr, k.len);
            dt_store_reply_bytes_(c, e->val, e->vlen);
        }
        break;
    }
    case DT_STORE_CMD_MULTI_SET: {
        const uint8_t *p = f->list;
        for (uint64_t i = 0; i < f->n; i++) {
            dt_store_bytes_t k = dt_store_list_next(&p);
            dt_store_bytes_t v = dt_store_list_next(&p);
            e = dt_store_map_get_or_create_(srv, k.ptr, k.len);
            dt_store_entry_set_(srv, e, v.ptr, v.len);
            dt_store_entry_notify_(e);
        }
        break;
    }
    case DT_STORE_CMD_CANCEL_WAIT: {
        wait_req_t *r = c->reqs;
        while (r) {
            wait_req_t *next = r->next;
            if (r->kind == REQ_WAIT) dt_store_req_cancel_(srv, r);
            r = next;
        }
        dt_store_reply_u8_(c, DT_STORE_WAIT_CANCELED);
        break;
    }
    case DT_STORE_CMD_LIST_KEYS: {
        dt_store_reply_i64_(c, (int64_t)atomic_load(&srv->num_keys));
        for (size_t b = 0; b < srv->nbuckets; b++)
            for (e = srv->buckets[b]; e; e = e->chain)
                if (e->present) dt_store_reply_bytes_(c, e->key, e->klen);
        break;
    }
    case DT_STORE_CMD_BARRIER: {
        int64_t v;
        e = dt_store_map_find_(srv, f->key.ptr, f->key.len);
        if (parse_counter(e, &v) < 0 || v == INT64_MAX) {
            dt_store_conn_close_(c, "BARRIER on a key whose value is not a counter");
            return CLOSED;
        }
        e = dt_store_map_get_or_create_(srv, f->key.ptr, f->key.len);
        set_counter(srv, e, v + 1);
        if (v + 1 >= f->i64) {
            dt_store_entry_notify_(e);
            dt_store_reply_u8_(c, DT_STORE_WAIT_STOP_WAITING);
        } else {
            dt_store_req_add_link_(dt_store_req_new_(c, REQ_WAIT, 1), e);
        }
        break;
    }
    default:
        snprintf(why, sizeof why, "unsupported command %s", dt_store_cmd_name(f->cmd));
        dt_store_conn_close_(c, why);
        return CLOSED;
    }
    return HANDLED;
}
