/*
 * rdzv.c - agents joining rounds, heartbeats, stop requests and the exit barrier,
 * all as a handful of store operations (the protocol is described in rdzv.h).
 */
#include "runtime/launch/rdzv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h" /* defines: dt_fs_printable */
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"

#define KEY_MAX 512
/* Bounds on what the agents write to the store: anything outside them was written
 * by someone else (the store's port is open to the network). */
#define MAX_ROUND (1 << 20)
#define MAX_NPROC (1 << 16)

static void key(const dt_rdzv_t *rz, char *buf, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void key(const dt_rdzv_t *rz, char *buf, const char *fmt, ...) {
    int n = snprintf(buf, KEY_MAX, "/dtrun/%s/r%d/", rz->run_id, rz->round);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, KEY_MAX - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Reads the decimal integer the store holds at key k into *out, within [lo, hi];
 * anything else is DT_STATUS_RENDEZVOUS naming the key, the value and the bounds.
 * The text may be followed by a space and more (a node record). */
static dt_status_t store_int(const char *k, const void *val, size_t len, long long lo,
                             long long hi, long long *out) {
    char buf[32];
    const char *v = val;
    size_t n = 0;
    while (n < len && v[n] != ' ') n++;
    if (n > 0 && n < sizeof buf) {
        memcpy(buf, v, n);
        buf[n] = '\0';
        char *end;
        errno = 0;
        long long x = strtoll(buf, &end, 10);
        if (!errno && *end == '\0' && x >= lo && x <= hi) {
            *out = x;
            return DT_STATUS_OK;
        }
    }
    char raw[41], shown[170]; /* a stranger's bytes: control characters escaped */
    snprintf(raw, sizeof raw, "%.*s", (int)(len < 40 ? len : 40), v);
    return dt_error(DT_STATUS_RENDEZVOUS,
                    "the rendezvous store holds '%s' at %s, not an integer in %lld..%lld: "
                    "another program wrote to this run's keys (is the store's port reachable "
                    "by other jobs? see --rdzv_conf token_file)",
                    dt_fs_printable(raw, shown, sizeof shown), k, lo, hi);
}

/* Store failures after the connection is up mean node 0 (the store) is gone. */
static dt_status_t lost_store(const dt_rdzv_t *rz, dt_status_t st, const char *what) {
    char detail[512]; /* dt_error() overwrites the detail it would read */
    snprintf(detail, sizeof detail, "%s", dt_error_detail());
    return dt_error(DT_STATUS_RENDEZVOUS, "lost the rendezvous store at %s (node 0) while %s: %s%s%s",
                    rz->endpoint, what, dt_strerror(st), detail[0] ? ": " : "", detail);
}

dt_status_t dt_rdzv_connect(const char *host, int port, const dt_store_token_t *token,
                            const char *run_id, int nnodes_min,
                            int nnodes_max, double join_timeout_s, double last_call_s,
                            double heartbeat_s, dt_rdzv_t **out) {
    dt_rdzv_t *rz = dt_xcalloc(1, sizeof *rz);
    char ep[300];
    snprintf(ep, sizeof ep, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    rz->endpoint = dt_xstrdup(ep);
    rz->run_id = dt_xstrdup(run_id);
    rz->nnodes_min = nnodes_min;
    rz->nnodes_max = nnodes_max;
    rz->join_timeout_s = join_timeout_s;
    rz->last_call_s = last_call_s;
    rz->heartbeat_s = heartbeat_s;
    double t0 = dt_now_s();
    dt_status_t st = dt_store_connect_auth(host, port, join_timeout_s, token, &rz->store);
    if (st == DT_STATUS_REFUSED) {
        dt_rdzv_close(rz); /* the detail says the token was refused */
        return st;
    }
    if (st != DT_STATUS_OK) {
        dt_error(DT_STATUS_RENDEZVOUS,
                 "the rendezvous endpoint %s did not answer: tried for %.1f s "
                 "(join_timeout %.0f s): %s", ep, dt_now_s() - t0, join_timeout_s,
                 dt_strerror(st));
        dt_rdzv_close(rz);
        return DT_STATUS_RENDEZVOUS;
    }
    *out = rz;
    return DT_STATUS_OK;
}

void dt_rdzv_close(dt_rdzv_t *rz) {
    if (!rz) return;
    dt_store_close(rz->store);
    free(rz->nodes);
    free(rz->prev_nodes);
    free(rz->hb_seen);
    free(rz->hb_changed);
    free(rz->run_id);
    free(rz->endpoint);
    free(rz);
}

static dt_status_t post_error(dt_rdzv_t *rz, const char *msg) {
    char k[KEY_MAX], line[1100];
    key(rz, k, "error");
    snprintf(line, sizeof line, "%s; ", msg);
    return dt_store_append(rz->store, k, line, strlen(line));
}

/* Compare-and-set of a string; *clash gets the value held when it differs from ours. */
static dt_status_t claim(dt_rdzv_t *rz, const char *k, const char *ours, char *clash, size_t len) {
    void *res = NULL;
    size_t rlen = 0;
    DT_CHECK(dt_store_compare_set(rz->store, k, "", 0, ours, strlen(ours), &res, &rlen));
    clash[0] = '\0';
    if (rlen != strlen(ours) || memcmp(res, ours, rlen) != 0)
        snprintf(clash, len, "%.*s", (int)rlen, (const char *)res);
    free(res);
    return DT_STATUS_OK;
}

/* The agent that brings the count to MIN (MIN < MAX) closes the round after the
 * last call unless MAX agents arrive first. */
static dt_status_t close_after_last_call(dt_rdzv_t *rz) {
    char kc[KEY_MAX], kj[KEY_MAX];
    key(rz, kc, "complete");
    key(rz, kj, "joined");
    const char *keys[] = {kc};
    uint64_t end = dt_now_ns() + (uint64_t)(rz->last_call_s * 1e9);
    for (;;) {
        int ready = 0;
        DT_CHECK(dt_store_check(rz->store, keys, 1, &ready));
        if (ready) return DT_STATUS_OK;
        if (dt_now_ns() >= end) break;
        dt_sleep_ms(20);
    }
    int64_t n = 0;
    DT_CHECK(dt_store_add(rz->store, kj, 0, &n));
    char val[32];
    snprintf(val, sizeof val, "%lld", (long long)n);
    void *res = NULL;
    size_t rlen = 0;
    DT_CHECK(dt_store_compare_set(rz->store, kc, "", 0, val, strlen(val), &res, &rlen));
    free(res);
    return DT_STATUS_OK;
}

/* The run-level key holding the newest round an agent has joined. */
static void latest_round_key(const dt_rdzv_t *rz, char *buf) {
    snprintf(buf, KEY_MAX, "/dtrun/%s/latest_round", rz->run_id);
}

dt_status_t dt_rdzv_latest_round(dt_rdzv_t *rz, int *round) {
    char k[KEY_MAX];
    *round = 0;
    latest_round_key(rz, k);
    const char *keys[] = {k};
    int ready = 0;
    if (dt_store_check(rz->store, keys, 1, &ready) != DT_STATUS_OK || !ready) return DT_STATUS_OK;
    void *v = NULL;
    size_t n = 0;
    if (dt_store_get(rz->store, k, &v, &n) != DT_STATUS_OK) return DT_STATUS_OK;
    long long r = 0;
    dt_status_t st = store_int(k, v, n, 0, MAX_ROUND, &r);
    free(v);
    *round = (int)r;
    return st;
}

/* The previous round's nodes whose host has no record in this round, as
 * "; lost and not back: node 1 (127.0.0.3), node 2 (127.0.0.4)" ("" when none or
 * no previous round). */
/* The hosts of this round's node records node/0.. (those written so far) into
 * here[slot] ("" for a slot not written); returns how many slots it looked at. */
static int round_hosts(dt_rdzv_t *rz, char here[][200], int max) {
    int n = rz->nnodes_max < max ? rz->nnodes_max : max;
    for (int i = 0; i < n; i++) {
        char k[KEY_MAX];
        key(rz, k, "node/%d", i);
        const char *keys[] = {k};
        int ready = 0;
        void *v = NULL;
        size_t vn = 0;
        here[i][0] = '\0';
        if (dt_store_check(rz->store, keys, 1, &ready) != DT_STATUS_OK || !ready ||
            dt_store_get(rz->store, k, &v, &vn) != DT_STATUS_OK) {
            dt_error_clear();
            continue;
        }
        char rec[200];
        snprintf(rec, sizeof rec, "%.*s", (int)vn, (const char *)v);
        free(v);
        const char *sp = strchr(rec, ' ');
        snprintf(here[i], 200, "%s", sp ? sp + 1 : rec);
    }
    return n;
}

static void missing_nodes(dt_rdzv_t *rz, char *out, size_t len) {
    out[0] = '\0';
    if (!rz->prev_nodes || rz->prev_nnodes < 1) return;
    char here[64][200];
    int nh = round_hosts(rz, here, 64);
    size_t o = 0;
    for (int i = 0; i < rz->prev_nnodes; i++) {
        int back = 0;
        for (int j = 0; j < nh; j++) back |= here[j][0] && !strcmp(here[j], rz->prev_nodes[i].host);
        if (back || o + 160 > len) continue;
        char shown[200];
        o += (size_t)snprintf(out + o, len - o, "%s node %d (%s)", o ? "," : "; lost and not back:", i,
                              dt_fs_printable(rz->prev_nodes[i].host, shown, sizeof shown));
    }
    if (o && o + 80 < len)
        snprintf(out + o, len - o, " (--nnodes %d:%d needs %d)", rz->nnodes_min, rz->nnodes_max, rz->nnodes_min);
}

/* Elastic: round *round is closed and running without this agent. It counts itself
 * in the round's "waiting" and polls until the agents start a newer round (then
 * *round is that one, joined as usual) or the run ends. */
static dt_status_t wait_admission(dt_rdzv_t *rz, int *round, const char *host) {
    for (;;) {
        rz->round = *round;
        char kc[KEY_MAX], k[KEY_MAX];
        key(rz, kc, "complete");
        const char *keys[] = {kc};
        int ready = 0;
        DT_CHECK(dt_store_check(rz->store, keys, 1, &ready));
        if (!ready) return DT_STATUS_OK;
        void *v = NULL;
        size_t vn = 0;
        DT_CHECK(dt_store_get(rz->store, kc, &v, &vn));
        long long n = 0;
        dt_status_t st = store_int(kc, v, vn, 1, rz->nnodes_max, &n);
        free(v);
        DT_CHECK(st);
        if (n >= rz->nnodes_max)
            return dt_error(DT_STATUS_RENDEZVOUS, "the run at %s already has %lld node(s), the most --nnodes %d:%d "
                            "allows: %s cannot join it", rz->endpoint, n, rz->nnodes_min, rz->nnodes_max, host);
        int64_t w = 0;
        key(rz, k, "waiting");
        DT_CHECK(dt_store_add(rz->store, k, 1, &w));
        DT_LOG_INFO("rendezvous round %d is running with %lld node(s) (--nnodes %d:%d): %s waits to be admitted "
                    "at the run's next checkpoint", *round, n, rz->nnodes_min, rz->nnodes_max, host);
        char ka[KEY_MAX];
        key(rz, ka, "alldone");
        for (;;) {
            int r = 0;
            DT_CHECK(dt_rdzv_latest_round(rz, &r));
            if (r > *round) {
                *round = r;
                break;
            }
            const char *akeys[] = {ka};
            int done = 0;
            DT_CHECK(dt_store_check(rz->store, akeys, 1, &done));
            if (done)
                return dt_error(DT_STATUS_RENDEZVOUS, "the run at %s finished (round %d) before %s was admitted",
                                rz->endpoint, *round, host);
            dt_sleep_ms(50);
        }
    }
}

/* dt_rdzv_join's steps, in protocol order. Each returns its failure already
 * worded: a store failure as the lost store, a refusal or a bad record as itself. */

/* Forgets the previous round's results (its nodes are kept to name the nodes that
 * do not come back) and waits on the store for at most join_timeout. */
static void join_begin(dt_rdzv_t *rz, int round) {
    rz->round = round;
    if (rz->nodes) { /* kept to name the nodes that do not come back */
        free(rz->prev_nodes);
        rz->prev_nodes = rz->nodes;
        rz->prev_nnodes = rz->nnodes;
    }
    free(rz->hb_seen);
    free(rz->hb_changed);
    rz->nodes = NULL;
    rz->hb_seen = NULL;
    rz->hb_changed = NULL;
    rz->resize_seen = 0;
    dt_store_set_timeout(rz->store, rz->join_timeout_s);
}

/* Elastic, an agent that is neither the host nor given a node rank: waits to be
 * admitted when *round runs without it (then *round is the round it joins). Every
 * agent records its round as the run's latest. */
static dt_status_t join_enter_round(dt_rdzv_t *rz, int *round, int want, int is_host,
                                    const char *host) {
    dt_status_t st;
    if (rz->nnodes_min < rz->nnodes_max && want < 0 && !is_host) {
        st = wait_admission(rz, round, host);
        if (st == DT_STATUS_RENDEZVOUS) return st; /* the detail says why */
        if (st != DT_STATUS_OK) goto out_store;
        rz->round = *round;
    }
    {
        char lk[KEY_MAX], val[16];
        latest_round_key(rz, lk);
        int vn = snprintf(val, sizeof val, "%d", *round);
        DT_CHECK_GOTO(dt_store_set(rz->store, lk, val, (size_t)vn), st, out_store);
        /* (an agent admitted after waiting sets the round the others started) */
    }
    return DT_STATUS_OK;
out_store:
    return lost_store(rz, st, "joining the rendezvous");
}

/* The agents agree on the node count and on how ranks are given, and a given node
 * rank is claimed by one agent only. An agent that disagrees posts why to the
 * round's error key (every agent reports it once the round closes) and sets *bad. */
static dt_status_t join_agree(dt_rdzv_t *rz, int want, const char *host, int *bad) {
    char k[KEY_MAX], clash[256], mine[1024];
    dt_status_t st;
    *bad = 0;
    char cfg[64];
    snprintf(cfg, sizeof cfg, "%d:%d %s", rz->nnodes_min, rz->nnodes_max,
             want >= 0 ? "fixed-ranks" : "assigned-ranks");
    key(rz, k, "nnodes");
    DT_CHECK_GOTO(claim(rz, k, cfg, clash, sizeof clash), st, out_store);
    if (clash[0]) {
        snprintf(mine, sizeof mine, "agent on %s has --nnodes %s but the first agent has %s "
                 "(--node_rank must be given to all agents or to none)", host, cfg, clash);
        DT_CHECK_GOTO(post_error(rz, mine), st, out_store);
        *bad = 1;
    }
    if (want >= 0 && rz->nnodes_min != rz->nnodes_max && !*bad) {
        snprintf(mine, sizeof mine, "--node_rank %d on %s needs a fixed --nnodes, not %d:%d",
                 want, host, rz->nnodes_min, rz->nnodes_max);
        DT_CHECK_GOTO(post_error(rz, mine), st, out_store);
        *bad = 1;
    } else if (want >= rz->nnodes_max) {
        snprintf(mine, sizeof mine, "--node_rank %d on %s is out of range for --nnodes %d",
                 want, host, rz->nnodes_max);
        DT_CHECK_GOTO(post_error(rz, mine), st, out_store);
        *bad = 1;
    } else if (want >= 0) {
        char token[200];
        snprintf(token, sizeof token, "%s (pid %d)", host, (int)getpid());
        key(rz, k, "claim/%d", want);
        DT_CHECK_GOTO(claim(rz, k, token, clash, sizeof clash), st, out_store);
        if (clash[0]) {
            snprintf(mine, sizeof mine, "--node_rank %d is given to both %s and %s", want, clash,
                     token);
            DT_CHECK_GOTO(post_error(rz, mine), st, out_store);
            *bad = 1;
        }
    }
    return DT_STATUS_OK;
out_store:
    return lost_store(rz, st, "joining the rendezvous");
}

/* This agent's node slot: its given rank, or (assigned ranks) the store's host is
 * node 0 and the others take 1, 2, ... in arrival order. */
static dt_status_t join_take_slot(dt_rdzv_t *rz, int want, int is_host, int *slot) {
    char k[KEY_MAX];
    dt_status_t st;
    *slot = want;
    if (want < 0 && is_host) {
        *slot = 0;
    } else if (want < 0) {
        int64_t arrival = 0;
        key(rz, k, "arrivals");
        DT_CHECK_GOTO(dt_store_add(rz->store, k, 1, &arrival), st, out_store);
        if (arrival < 1 || arrival > MAX_NPROC * (int64_t)rz->nnodes_max) {
            char a[32];
            int an = snprintf(a, sizeof a, "%lld", (long long)arrival);
            long long ignored;
            return store_int(k, a, (size_t)an, 1, MAX_NPROC * (long long)rz->nnodes_max,
                             &ignored);
        }
        *slot = (int)arrival;
    }
    return DT_STATUS_OK;
out_store:
    return lost_store(rz, st, "joining the rendezvous");
}

/* Counts this agent in, writes its node record and a first heartbeat (unless it
 * disagreed or has no slot), and closes the round when it is the MAX-th agent, or
 * after the last call when it is the MIN-th. */
static dt_status_t join_arrive(dt_rdzv_t *rz, int slot, int bad, int nproc, const char *host) {
    char k[KEY_MAX];
    dt_status_t st;
    int64_t count = 0;
    key(rz, k, "joined");
    DT_CHECK_GOTO(dt_store_add(rz->store, k, 1, &count), st, out_store);
    if (!bad && slot < rz->nnodes_max) {
        char rec[200];
        snprintf(rec, sizeof rec, "%d %s", nproc, host);
        key(rz, k, "node/%d", slot);
        DT_CHECK_GOTO(dt_store_set(rz->store, k, rec, strlen(rec)), st, out_store);
        key(rz, k, "hb/%d", slot);
        DT_CHECK_GOTO(dt_store_set(rz->store, k, "0", 1), st, out_store);
    }
    char kc[KEY_MAX];
    key(rz, kc, "complete");
    if (count == rz->nnodes_max) {
        char val[32];
        snprintf(val, sizeof val, "%lld", (long long)count);
        void *res = NULL;
        size_t rlen = 0;
        DT_CHECK_GOTO(dt_store_compare_set(rz->store, kc, "", 0, val, strlen(val), &res, &rlen),
                      st, out_store);
        free(res);
    } else if (count == rz->nnodes_min) {
        DT_CHECK_GOTO(close_after_last_call(rz), st, out_store);
    }
    return DT_STATUS_OK;
out_store:
    return lost_store(rz, st, "joining the rendezvous");
}

/* A node that cannot start posts why here (dt_rdzv_post_abort): the run's, not a round's. */
static void abort_key(const char *run_id, char *buf) { snprintf(buf, KEY_MAX, "/dtrun/%s/abort", run_id); }

/* "rendezvous round 0: 1 of 2 node(s) joined after 30 s (node 0 n1); waiting up to
 * join_timeout 600 s for the others" */
static void report_waiting(dt_rdzv_t *rz, int round, double waited) {
    char k[KEY_MAX], who[512] = "", here[16][200];
    int64_t joined = 0;
    key(rz, k, "joined");
    if (dt_store_add(rz->store, k, 0, &joined) != DT_STATUS_OK) {
        dt_error_clear();
        return;
    }
    size_t o = 0;
    int nh = round_hosts(rz, here, 16);
    for (int i = 0; i < nh && o + 100 < sizeof who; i++) {
        if (!here[i][0]) continue;
        char shown[200];
        o += (size_t)snprintf(who + o, sizeof who - o, "%snode %d %s", o ? ", " : " (", i,
                              dt_fs_printable(here[i], shown, sizeof shown));
    }
    if (o) snprintf(who + o, sizeof who - o, ")");
    DT_LOG_WARN("rendezvous round %d at %s: %lld of %d node(s) joined after %.0f s%s; waiting up to join_timeout "
                "%.0f s for the others (a node that failed to start never comes: see its own output)",
                round, rz->endpoint, (long long)joined, rz->nnodes_min, waited, who, rz->join_timeout_s);
}

/* Waits (join_timeout) for the round to close; *n is its node count. A round
 * that an agent refused, or that closed before this agent's slot, fails here. */
static dt_status_t join_wait_closed(dt_rdzv_t *rz, int round, int slot, int *n) {
    char k[KEY_MAX], kc[KEY_MAX];
    dt_status_t st;
    key(rz, kc, "complete");
    const char *wkeys[] = {kc};
    /* in slices of DTRUN_WAIT_REPORT_S, each followed by a line: a node that never
     * comes (it failed to start) is never waited for in silence */
    double start = dt_now_s(), every = dt_wait_report_s(), next = every;
    double slice = every < 1.0 ? every : 1.0; /* between looks at the abort key */
    for (;;) {
        double left = rz->join_timeout_s - (dt_now_s() - start);
        st = left > 0 ? dt_store_wait(rz->store, wkeys, 1, left < slice ? left : slice) : DT_STATUS_TIMEOUT;
        if (st != DT_STATUS_TIMEOUT || dt_now_s() - start >= rz->join_timeout_s) break;
        dt_error_clear();
        char ka[KEY_MAX];
        abort_key(rz->run_id, ka);
        const char *akeys[] = {ka};
        int aborted = 0;
        if (dt_store_check(rz->store, akeys, 1, &aborted) == DT_STATUS_OK && aborted) {
            void *v = NULL;
            size_t vn = 0;
            char raw[600] = "", shown[1200];
            if (dt_store_get(rz->store, ka, &v, &vn) == DT_STATUS_OK)
                snprintf(raw, sizeof raw, "%.*s", (int)vn, (const char *)v);
            free(v);
            return dt_error(DT_STATUS_USAGE, "rendezvous round %d at %s: a node cannot start: %s", round,
                            rz->endpoint, dt_fs_printable(raw, shown, sizeof shown));
        }
        dt_error_clear();
        if (dt_now_s() - start >= next) {
            report_waiting(rz, round, dt_now_s() - start);
            next += every;
        }
    }
    if (st == DT_STATUS_TIMEOUT) {
        int64_t joined = 0;
        key(rz, k, "joined");
        dt_store_add(rz->store, k, 0, &joined);
        rz->nnodes = (int)joined; /* those the host waits for before it stops the store */
        char gone[600];
        missing_nodes(rz, gone, sizeof gone);
        return dt_error(DT_STATUS_RENDEZVOUS,
                        "rendezvous round %d at %s timed out after %.0f s (join_timeout): "
                        "%lld of %d node(s) joined%s", round, rz->endpoint, rz->join_timeout_s,
                        (long long)joined, rz->nnodes_min, gone);
    }
    if (st != DT_STATUS_OK) goto out_store;

    void *val = NULL;
    size_t vlen = 0;
    DT_CHECK_GOTO(dt_store_get(rz->store, kc, &val, &vlen), st, out_store);
    long long complete = 0;
    st = store_int(kc, val, vlen, 1, rz->nnodes_max, &complete);
    free(val);
    if (st != DT_STATUS_OK) return st;
    *n = (int)complete;
    rz->nnodes = *n;

    int ready = 0;
    key(rz, k, "error");
    const char *ekeys[] = {k};
    DT_CHECK_GOTO(dt_store_check(rz->store, ekeys, 1, &ready), st, out_store);
    if (ready) {
        DT_CHECK_GOTO(dt_store_get(rz->store, k, &val, &vlen), st, out_store);
        while (vlen >= 2 && ((char *)val)[vlen - 2] == ';') vlen -= 2;
        char raw[512], shown[2048]; /* written by an agent, or by anyone without a token */
        snprintf(raw, sizeof raw, "%.*s", (int)vlen, (const char *)val);
        dt_error(DT_STATUS_USAGE, "rendezvous round %d refused: %s", round, dt_fs_printable(raw, shown, sizeof shown));
        free(val);
        return DT_STATUS_USAGE;
    }
    if (*n < 1 || slot >= *n)
        return dt_error(DT_STATUS_RENDEZVOUS,
                        "rendezvous round %d closed with %d node(s) before this agent (arrival "
                        "%d) joined; start it again for the next run", round, *n, slot + 1);
    return DT_STATUS_OK;
out_store:
    return lost_store(rz, st, "joining the rendezvous");
}

/* Reads the n node records (one MULTI_GET): every node's process count, host and
 * first global rank, this agent's rank and the world size; heartbeats are watched
 * from now. */
static dt_status_t join_read_nodes(dt_rdzv_t *rz, int n, int slot) {
    dt_status_t st;
    char(*names)[KEY_MAX] = dt_xmalloc((size_t)n * KEY_MAX);
    const char **keys = dt_xmalloc((size_t)n * sizeof *keys);
    void **vals = dt_xcalloc((size_t)n, sizeof *vals);
    size_t *lens = dt_xcalloc((size_t)n, sizeof *lens);
    for (int i = 0; i < n; i++) {
        key(rz, names[i], "node/%d", i);
        keys[i] = names[i];
    }
    st = dt_store_multi_get(rz->store, keys, (size_t)n, vals, lens);
    if (st == DT_STATUS_OK) {
        rz->nodes = dt_xcalloc((size_t)n, sizeof *rz->nodes);
        int base = 0;
        for (int i = 0; i < n && st == DT_STATUS_OK; i++) {
            char rec[200];
            snprintf(rec, sizeof rec, "%.*s", (int)lens[i], (const char *)vals[i]);
            char *sp = strchr(rec, ' ');
            long long nproc = 0;
            st = store_int(keys[i], vals[i], lens[i], 1, MAX_NPROC, &nproc);
            if (st == DT_STATUS_OK && base > INT32_MAX - nproc)
                st = dt_error(DT_STATUS_RENDEZVOUS, "the rendezvous store's node records "
                              "add up to more than %d ranks (at %s)", INT32_MAX, keys[i]);
            if (st != DT_STATUS_OK) break;
            rz->nodes[i].nproc = (int)nproc;
            snprintf(rz->nodes[i].host, sizeof rz->nodes[i].host, "%s", sp ? sp + 1 : "?");
            rz->nodes[i].base_rank = base;
            base += rz->nodes[i].nproc;
        }
    }
    if (st == DT_STATUS_OK) {
        int base = rz->nodes[n - 1].base_rank + rz->nodes[n - 1].nproc;
        rz->nnodes = n;
        rz->node_rank = slot;
        rz->base_rank = rz->nodes[slot].base_rank;
        rz->world_size = base;
        rz->hb_seen = dt_xcalloc((size_t)n, sizeof *rz->hb_seen);
        rz->hb_changed = dt_xcalloc((size_t)n, sizeof *rz->hb_changed);
        double now = dt_now_s();
        for (int i = 0; i < n; i++) rz->hb_changed[i] = now;
    }
    for (int i = 0; i < n; i++) free(vals[i]);
    free(vals);
    free(lens);
    free(keys);
    free(names);
    if (st == DT_STATUS_RENDEZVOUS) return st; /* a bad record: the detail names it */
    if (st != DT_STATUS_OK) goto out_store;
    return DT_STATUS_OK;
out_store:
    return lost_store(rz, st, "joining the rendezvous");
}

dt_status_t dt_rdzv_join(dt_rdzv_t *rz, int round, int want, int is_host, int nproc,
                         const char *host) {
    int bad = 0, slot = 0, n = 0;
    join_begin(rz, round);
    DT_CHECK(join_enter_round(rz, &round, want, is_host, host));
    DT_CHECK(join_agree(rz, want, host, &bad));
    DT_CHECK(join_take_slot(rz, want, is_host, &slot));
    DT_CHECK(join_arrive(rz, slot, bad, nproc, host));
    DT_CHECK(join_wait_closed(rz, round, slot, &n));
    DT_CHECK(join_read_nodes(rz, n, slot));
    /* Liveness calls must not block for long: a few heartbeats at most. */
    dt_store_set_timeout(rz->store, 5 + 4 * rz->heartbeat_s);
    return DT_STATUS_OK;
}

/* Elastic, at a heartbeat: a node that stops heartbeating after a resize began has
 * left for the next round (not lost); a waiting node is reported once. */
static dt_status_t elastic_tick(dt_rdzv_t *rz, dt_rdzv_event_t *ev) {
    char k[KEY_MAX];
    const char *keys[] = {k};
    int ready = 0;
    if (*ev == DT_RDZV_EVENT_NODE_LOST) {
        key(rz, k, "resizing");
        DT_CHECK(dt_store_check(rz->store, keys, 1, &ready));
        if (ready) *ev = DT_RDZV_EVENT_NONE;
        return DT_STATUS_OK;
    }
    if (*ev != DT_RDZV_EVENT_NONE || rz->resize_seen || rz->nnodes >= rz->nnodes_max) return DT_STATUS_OK;
    key(rz, k, "waiting");
    DT_CHECK(dt_store_check(rz->store, keys, 1, &ready));
    if (ready) {
        rz->resize_seen = 1;
        *ev = DT_RDZV_EVENT_RESIZE;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_rdzv_mark_resizing(dt_rdzv_t *rz) {
    char k[KEY_MAX];
    key(rz, k, "resizing");
    dt_status_t st = dt_store_set(rz->store, k, "1", 1);
    return st == DT_STATUS_OK ? st : lost_store(rz, st, "marking the resize");
}

dt_status_t dt_rdzv_tick(dt_rdzv_t *rz, dt_rdzv_event_t *ev, int *lost_node) {
    char k[KEY_MAX];
    dt_status_t st;
    *ev = DT_RDZV_EVENT_NONE;
    int ready = 0;
    key(rz, k, "stop");
    const char *keys1[] = {k};
    st = dt_store_check(rz->store, keys1, 1, &ready);
    if (st != DT_STATUS_OK) return lost_store(rz, st, "checking for stop requests");
    if (ready) {
        *ev = DT_RDZV_EVENT_STOP;
        return DT_STATUS_OK;
    }
    double now = dt_now_s();
    /* Heartbeats every heartbeat interval, not every tick. */
    if (now - rz->last_hb < rz->heartbeat_s) return DT_STATUS_OK;
    rz->last_hb = now;
    char val[32];
    snprintf(val, sizeof val, "%lld", ++rz->hb_counter);
    key(rz, k, "hb/%d", rz->node_rank);
    st = dt_store_set(rz->store, k, val, strlen(val));
    if (st != DT_STATUS_OK) return lost_store(rz, st, "sending a heartbeat");

    int n = rz->nnodes;
    char(*names)[KEY_MAX] = dt_xmalloc((size_t)n * KEY_MAX);
    const char **keys = dt_xmalloc((size_t)n * sizeof *keys);
    void **vals = dt_xcalloc((size_t)n, sizeof *vals);
    size_t *lens = dt_xcalloc((size_t)n, sizeof *lens);
    for (int i = 0; i < n; i++) {
        key(rz, names[i], "hb/%d", i);
        keys[i] = names[i];
    }
    st = dt_store_multi_get(rz->store, keys, (size_t)n, vals, lens);
    if (st == DT_STATUS_OK) {
        for (int i = 0; i < n; i++) {
            char b[32];
            snprintf(b, sizeof b, "%.*s", (int)lens[i], (const char *)vals[i]);
            long long c = atoll(b);
            if (c != rz->hb_seen[i]) {
                rz->hb_seen[i] = c;
                rz->hb_changed[i] = now;
            } else if (i != rz->node_rank && now - rz->hb_changed[i] > 3 * rz->heartbeat_s &&
                       *ev == DT_RDZV_EVENT_NONE) {
                *ev = DT_RDZV_EVENT_NODE_LOST;
                *lost_node = i;
            }
        }
    }
    if (st == DT_STATUS_OK && rz->nnodes_min < rz->nnodes_max)
        st = elastic_tick(rz, ev);
    for (int i = 0; i < n; i++) free(vals[i]);
    free(vals);
    free(lens);
    free(keys);
    free(names);
    if (st != DT_STATUS_OK) return lost_store(rz, st, "reading heartbeats");
    return DT_STATUS_OK;
}

dt_status_t dt_rdzv_request_stop(dt_rdzv_t *rz, const char *reason, int *won) {
    char k[KEY_MAX];
    key(rz, k, "stop");
    void *res = NULL;
    size_t rlen = 0;
    dt_status_t st = dt_store_compare_set(rz->store, k, "", 0, reason, strlen(reason), &res, &rlen);
    if (won) *won = st == DT_STATUS_OK && rlen == strlen(reason) && !memcmp(res, reason, rlen);
    free(res);
    return st == DT_STATUS_OK ? st : lost_store(rz, st, "asking the group to stop");
}

dt_status_t dt_rdzv_stop_reason(dt_rdzv_t *rz, char **reason) {
    char k[KEY_MAX];
    key(rz, k, "stop");
    const char *keys[] = {k};
    int ready = 0;
    *reason = NULL;
    DT_CHECK(dt_store_check(rz->store, keys, 1, &ready));
    if (!ready) return DT_STATUS_OK;
    void *v = NULL;
    size_t len = 0;
    DT_CHECK(dt_store_get(rz->store, k, &v, &len));
    *reason = dt_xmalloc(len + 1);
    memcpy(*reason, v, len);
    (*reason)[len] = '\0';
    free(v);
    return DT_STATUS_OK;
}

dt_status_t dt_rdzv_post_failures(dt_rdzv_t *rz, const char *jsonl) {
    char k[KEY_MAX];
    key(rz, k, "failures");
    dt_status_t st = dt_store_append(rz->store, k, jsonl, strlen(jsonl));
    return st == DT_STATUS_OK ? st : lost_store(rz, st, "reporting failures");
}

dt_status_t dt_rdzv_get_failures(dt_rdzv_t *rz, char **jsonl) {
    char k[KEY_MAX];
    key(rz, k, "failures");
    const char *keys[] = {k};
    int ready = 0;
    *jsonl = NULL;
    DT_CHECK(dt_store_check(rz->store, keys, 1, &ready));
    if (!ready) {
        *jsonl = dt_xstrdup("");
        return DT_STATUS_OK;
    }
    void *v = NULL;
    size_t len = 0;
    DT_CHECK(dt_store_get(rz->store, k, &v, &len));
    *jsonl = dt_xmalloc(len + 1);
    memcpy(*jsonl, v, len);
    (*jsonl)[len] = '\0';
    free(v);
    return DT_STATUS_OK;
}

dt_status_t dt_rdzv_mark_done(dt_rdzv_t *rz) {
    char k[KEY_MAX];
    int64_t n = 0;
    key(rz, k, "done");
    dt_status_t st = dt_store_add(rz->store, k, 1, &n);
    if (st != DT_STATUS_OK) return lost_store(rz, st, "entering the exit barrier");
    if (n == rz->nnodes) {
        key(rz, k, "alldone");
        st = dt_store_set(rz->store, k, "1", 1);
        if (st != DT_STATUS_OK) return lost_store(rz, st, "entering the exit barrier");
    }
    return DT_STATUS_OK;
}

dt_status_t dt_rdzv_barrier_check(dt_rdzv_t *rz, int *all) {
    char k[KEY_MAX];
    key(rz, k, "alldone");
    const char *keys[] = {k};
    dt_status_t st = dt_store_check(rz->store, keys, 1, all);
    return st == DT_STATUS_OK ? st : lost_store(rz, st, "waiting at the exit barrier");
}

void dt_rdzv_leave(dt_rdzv_t *rz, int is_host, double timeout_s) {
    if (!rz || !rz->store) return;
    char k[KEY_MAX];
    key(rz, k, "left");
    int64_t n = 0;
    if (!is_host) {
        dt_store_add(rz->store, k, 1, &n);
        return;
    }
    /* Lost nodes will never say goodbye. */
    char kl[KEY_MAX];
    key(rz, kl, "lost");
    uint64_t end = dt_now_ns() + (uint64_t)(timeout_s * 1e9);
    while (dt_now_ns() < end) {
        int64_t lost = 0;
        if (dt_store_add(rz->store, k, 0, &n) != DT_STATUS_OK) return;
        if (dt_store_add(rz->store, kl, 0, &lost) != DT_STATUS_OK) return;
        if (n + lost >= rz->nnodes - 1) return;
        dt_sleep_ms(5);
    }
}

dt_status_t dt_rdzv_declare_lost(dt_rdzv_t *rz, const char *reason, int *won) {
    DT_CHECK(dt_rdzv_request_stop(rz, reason, won));
    if (!*won) return DT_STATUS_OK;
    char k[KEY_MAX];
    int64_t n = 0;
    key(rz, k, "lost");
    dt_status_t st = dt_store_add(rz->store, k, 1, &n);
    return st == DT_STATUS_OK ? st : lost_store(rz, st, "declaring a node lost");
}

void dt_rdzv_post_abort(const char *host, int port, const dt_store_token_t *token, const char *run_id,
                        const char *why, double wait_s) {
    dt_store_t *st = NULL;
    if (!host || port <= 0 || !run_id || dt_store_connect_auth(host, port, wait_s, token, &st) != DT_STATUS_OK) {
        dt_error_clear();
        return;
    }
    char k[KEY_MAX];
    abort_key(run_id, k);
    if (dt_store_set(st, k, why, strlen(why)) == DT_STATUS_OK)
        DT_LOG_INFO("told the other nodes through the store at %s:%d that this node cannot start", host, port);
    dt_error_clear();
    dt_store_close(st);
}
