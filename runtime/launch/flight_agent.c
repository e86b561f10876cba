/*
 * flight_agent.c - the agent and its workers' flight recorders (flight_report.h):
 *
 *   - on the first failure of a round (and when another node asks the group to
 *     stop), before any worker is signalled, every local rank's ring is read
 *     (the ring is a file the worker maps: a stopped, stuck or dead process is
 *     read as well as a live one) and written to <run_dir>/flight/rank_NNNNN.json;
 *     each rank's last op per communicator is posted in the store (one JSON line
 *     per rank, key /dtrun/<run id>/r<round>/flight) and the analysis of every
 *     line posted so far is logged at once;
 *   - the failure summary re-reads every node's lines and makes the rank that
 *     never arrived (or desynced) the root cause;
 *   - `dtrun debug dump RUN_DIR` adds 1 to /dtrun/<run id>/debug/dump; every agent
 *     polls that key and, when it grew, dumps its ranks' rings without stopping
 *     anything and appends a line to /dtrun/<run id>/debug/ack/<n>.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/fs_safe.h" /* defines: dt_fs_write_atomic */
#include "common/log.h"
#include "common/mem.h"
#include "rendezvous/store_auth.h" /* defines: dt_store_token_t */
#include "runtime/launch/agent_impl.h"
#include "runtime/launch/flight_report.h"

struct dt_agent_flight {
    int round;          /* restart count + 1 of the round already collected, 0: none */
    char *lines;        /* single node: the JSON lines of this round (no rendezvous store) */
    dt_store_t *dbg;    /* single node: a client of the agent's own store */
    int64_t dbg_seen;   /* the dump requests handled */
    double dbg_next;    /* monotonic time of the next poll */
    int endpoint_written;
};

static struct dt_agent_flight *state(agent_t *ag) {
    if (!ag->flight) ag->flight = dt_xcalloc(1, sizeof *ag->flight);
    return ag->flight;
}

/* The store every agent of the run shares, or NULL. */
static dt_store_t *run_store(agent_t *ag) {
    struct dt_agent_flight *fl = state(ag);
    if (ag->rz) return ag->rz->store;
    if (!fl->dbg && ag->server) {
        const dt_launch_spec_t *sp = ag->spec;
        if (dt_store_connect_auth(ag->master_addr, ag->master_port, 5.0, sp->have_token ? &sp->token : NULL,
                                  &fl->dbg) != DT_STATUS_OK) {
            DT_LOG_WARN("flight recorder: cannot reach the agent's store: %s", dt_error_detail());
            fl->dbg = NULL;
        }
    }
    return fl->dbg;
}

/* What the process looks like: /proc/<pid>/stat's state, or how it ended. */
static void proc_state(const worker_t *w, char *buf, size_t len) {
    if (w->exited) {
        if (WIFSIGNALED(w->wstatus)) snprintf(buf, len, "killed by %s", dt_agent_signame(WTERMSIG(w->wstatus)));
        else snprintf(buf, len, "exited %d", WEXITSTATUS(w->wstatus));
        return;
    }
    char path[64], *txt = NULL;
    size_t n = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)w->pid);
    snprintf(buf, len, "unknown");
    if (dt_fs_read_file(path, 4096, &txt, &n) != DT_STATUS_OK) return;
    const char *p = strrchr(txt, ')');
    char c = p && p[1] == ' ' ? p[2] : '?';
    const char *name = c == 'R' ? "running" : c == 'S' ? "sleeping" : c == 'D' ? "in uninterruptible sleep (D)"
                     : c == 'T' ? "stopped (SIGSTOP)" : c == 't' ? "stopped by a tracer" : c == 'Z' ? "exited (zombie)"
                     : "unknown";
    snprintf(buf, len, "%s", name);
    free(txt);
}

/* The full ring of w as JSON (the dump file). */
static char *ring_json(const agent_t *ag, const worker_t *w, const char *why, const char *proc,
                       const dt_flight_entry_t *e, int n, int torn, const char *err) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", w->rank);
    cJSON_AddNumberToObject(o, "local_rank", w->local_rank);
    cJSON_AddStringToObject(o, "host", ag->host);
    cJSON_AddNumberToObject(o, "pid", (double)w->pid);
    cJSON_AddNumberToObject(o, "restart_count", ag->restart_count);
    cJSON_AddStringToObject(o, "process", proc);
    cJSON_AddStringToObject(o, "reason", why);
    cJSON_AddNumberToObject(o, "time", dt_wall_s());
    cJSON_AddNumberToObject(o, "torn_entries", torn);
    if (err) cJSON_AddStringToObject(o, "error", err);
    cJSON *arr = cJSON_AddArrayToObject(o, "entries");
    for (int i = 0; i < n; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "id", (double)e[i].id);
        cJSON_AddStringToObject(x, "comm", e[i].comm);
        cJSON_AddNumberToObject(x, "seq", (double)e[i].seq);
        cJSON_AddStringToObject(x, "op", e[i].op);
        cJSON_AddNumberToObject(x, "count", (double)e[i].count);
        cJSON_AddStringToObject(x, "dtype", e[i].dtype);
        if (e[i].peer >= 0) cJSON_AddNumberToObject(x, "peer", e[i].peer);
        cJSON_AddStringToObject(x, "state", dt_flight_state_name(e[i].state));
        cJSON_AddNumberToObject(x, "enqueue_ns", (double)e[i].t_enqueue_ns);
        cJSON_AddNumberToObject(x, "start_ns", (double)e[i].t_start_ns);
        cJSON_AddNumberToObject(x, "end_ns", (double)e[i].t_end_ns);
        cJSON_AddItemToArray(arr, x);
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

/* Reads every local rank's ring, writes the dump files, returns the rank records'
 * JSON lines (malloc'ed). */
static char *dump_local(agent_t *ag, const char *why) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/flight", ag->run_dir);
    if (dt_fs_mkdir_p(dir) != DT_STATUS_OK) DT_LOG_WARN("flight recorder: %s", dt_error_detail());
    size_t cap = 1, len = 0;
    char *lines = dt_xcalloc(1, 1);
    dt_flight_entry_t *e = dt_xcalloc(DT_FLIGHT_MAX_SLOTS, sizeof *e);
    for (int i = 0; i < ag->nw; i++) {
        worker_t *w = &ag->w[i];
        if (w->pid <= 0) continue;
        char ring_path[PATH_MAX + 16], d[PATH_MAX];
        snprintf(d, sizeof d, "%s", w->error_file);
        snprintf(ring_path, sizeof ring_path, "%s/flight.ring", dirname(d));
        dt_flight_rank_t r;
        memset(&r, 0, sizeof r);
        r.rank = w->rank;
        r.pid = w->pid;
        snprintf(r.host, sizeof r.host, "%s", ag->host);
        proc_state(w, r.proc, sizeof r.proc);
        const dt_flight_ring_t *ring = NULL;
        size_t rlen = 0;
        int n = 0, torn = 0;
        char err[300] = "";
        if (dt_flight_ring_map(ring_path, &ring, &rlen) == DT_STATUS_OK) {
            if (dt_flight_ring_snapshot(ring, rlen, e, &n, &torn) != DT_STATUS_OK)
                snprintf(err, sizeof err, "%s", dt_error_detail());
            dt_flight_ring_unmap(ring, rlen);
        } else {
            snprintf(err, sizeof err, "%s", dt_error_detail());
        }
        dt_flight_rank_from_entries(&r, e, n);
        char *js = ring_json(ag, w, why, r.proc, e, n, torn, err[0] ? err : NULL);
        char file[PATH_MAX + 32];
        snprintf(file, sizeof file, "%s/rank_%05d.json", dir, w->rank);
        if (dt_fs_write_atomic(file, js, strlen(js), "\n", 1) != DT_STATUS_OK)
            DT_LOG_WARN("flight recorder: %s", dt_error_detail());
        cJSON_free(js);
        char *line = dt_flight_rank_json(&r);
        size_t ln = strlen(line);
        if (len + ln + 1 > cap) {
            cap = (len + ln + 1) * 2;
            lines = dt_xrealloc(lines, cap);
        }
        memcpy(lines + len, line, ln + 1);
        len += ln;
        free(line);
    }
    free(e);
    return lines;
}

static void flight_key(const agent_t *ag, char *buf, size_t len) {
    snprintf(buf, len, "/dtrun/%s/r%d/flight", ag->spec->rdzv_id, ag->restart_count);
}

/* Every rank record of this round: from the store (multi-node), else this node's. */
static int all_ranks(agent_t *ag, dt_flight_rank_t **out) {
    char *txt = NULL;
    if (ag->rz) {
        char k[512];
        flight_key(ag, k, sizeof k);
        const char *keys[] = {k};
        int ready = 0;
        void *v = NULL;
        size_t n = 0;
        if (dt_store_check(ag->rz->store, keys, 1, &ready) == DT_STATUS_OK && ready &&
            dt_store_get(ag->rz->store, k, &v, &n) == DT_STATUS_OK) {
            txt = dt_xmalloc(n + 1);
            memcpy(txt, v, n);
            txt[n] = 0;
            free(v);
        }
    } else if (ag->flight && ag->flight->lines) {
        txt = dt_xstrdup(ag->flight->lines);
    }
    int nr = 0;
    dt_flight_rank_t *rs = NULL;
    for (char *save = NULL, *ln = txt ? strtok_r(txt, "\n", &save) : NULL; ln; ln = strtok_r(NULL, "\n", &save)) {
        dt_flight_rank_t r;
        if (dt_flight_rank_parse(ln, &r) != 0) continue;
        int k = 0;
        while (k < nr && rs[k].rank != r.rank) k++;
        if (k == nr) rs = dt_xrealloc(rs, (size_t)++nr * sizeof *rs);
        rs[k] = r; /* a later line of the same rank wins */
    }
    free(txt);
    *out = rs;
    return nr;
}

void dt_agent_flight_collect(agent_t *ag, const char *why) {
    struct dt_agent_flight *fl = state(ag);
    if (fl->round == ag->restart_count + 1) return;
    fl->round = ag->restart_count + 1;
    char *lines = dump_local(ag, why);
    ag->run_dir_tmp = 0; /* keep the dumps */
    if (ag->rz) {
        char k[512];
        flight_key(ag, k, sizeof k);
        if (dt_store_append(ag->rz->store, k, lines, strlen(lines)) != DT_STATUS_OK)
            DT_LOG_WARN("flight recorder: cannot post to the store: %s", dt_error_detail());
        free(lines);
    } else {
        free(fl->lines);
        fl->lines = lines;
    }
    DT_LOG_INFO("flight recorder: the rings of ranks %d-%d are in %s/flight/", ag->base_rank,
                ag->base_rank + ag->nw - 1, ag->run_dir);
    char msg[4096];
    int culprits[64];
    if (dt_agent_flight_analyse(ag, msg, sizeof msg, culprits, 64) > 0) DT_LOG_ERROR("flight recorder: %s", msg);
}

int dt_agent_flight_analyse(agent_t *ag, char *msg, size_t len, int *culprits, int max) {
    dt_flight_rank_t *rs = NULL;
    int nr = all_ranks(ag, &rs);
    int nc = nr ? dt_flight_analyse(rs, nr, msg, len, culprits, max) : 0;
    size_t l = strlen(msg);
    while (l && msg[l - 1] == '\n') msg[--l] = 0;
    free(rs);
    return nc;
}

int dt_agent_flight_rank_info(agent_t *ag, int rank, char *host, size_t hlen, long *pid) {
    dt_flight_rank_t *rs = NULL;
    int nr = all_ranks(ag, &rs), found = 0;
    for (int i = 0; i < nr; i++)
        if (rs[i].rank == rank) {
            snprintf(host, hlen, "%s", rs[i].host);
            *pid = rs[i].pid;
            found = 1;
        }
    free(rs);
    return found;
}

void dt_agent_flight_poll(agent_t *ag) {
    struct dt_agent_flight *fl = state(ag);
    double now = dt_now_s();
    if (now < fl->dbg_next) return;
    fl->dbg_next = now + 0.5;
    if (!fl->endpoint_written && ag->server) {
        /* what `dtrun debug dump RUN_DIR` reads to find the store */
        char path[PATH_MAX + 16], txt[600];
        snprintf(path, sizeof path, "%s/endpoint", ag->run_dir);
        int n = snprintf(txt, sizeof txt, "%s %d %s %s\n", ag->master_addr, ag->master_port, ag->spec->rdzv_id,
                         ag->spec->have_token ? ag->spec->token_file : "-");
        if (dt_fs_write_atomic(path, txt, (size_t)n, NULL, 0) != DT_STATUS_OK)
            DT_LOG_WARN("flight recorder: %s", dt_error_detail());
        fl->endpoint_written = 1;
    }
    dt_store_t *st = run_store(ag);
    if (!st) return;
    char k[512];
    snprintf(k, sizeof k, "/dtrun/%s/debug/dump", ag->spec->rdzv_id);
    int64_t v = 0;
    if (dt_store_add(st, k, 0, &v) != DT_STATUS_OK || v <= fl->dbg_seen) return;
    int64_t first = fl->dbg_seen + 1;
    if (v - first > 63) first = v - 63; /* the recent ones: older clients have given up */
    fl->dbg_seen = v;
    char why[64];
    snprintf(why, sizeof why, "dtrun debug dump #%" PRId64, v);
    char *lines = dump_local(ag, why);
    free(lines);
    char ack[PATH_MAX + 200];
    snprintf(ack, sizeof ack, "%s: ranks %d-%d written to %s/flight/\n", ag->host, ag->base_rank,
             ag->base_rank + ag->nw - 1, ag->run_dir);
    /* one dump answers every request that came since the last poll (each client
     * waits for the acknowledgements of its own number) */
    for (int64_t q = first; q <= v; q++) {
        snprintf(k, sizeof k, "/dtrun/%s/debug/ack/%" PRId64, ag->spec->rdzv_id, q);
        if (dt_store_append(st, k, ack, strlen(ack)) != DT_STATUS_OK)
            DT_LOG_WARN("flight recorder: cannot acknowledge the dump: %s", dt_error_detail());
    }
    DT_LOG_INFO("flight recorder: %s", why);
}

void dt_agent_flight_free(agent_t *ag) {
    if (!ag->flight) return;
    if (ag->flight->dbg) dt_store_close(ag->flight->dbg);
    free(ag->flight->lines);
    free(ag->flight);
    ag->flight = NULL;
}

int dt_agent_flight_root(agent_t *ag, failure_t **fs, int *n) {
    char msg[4096];
    int culprits[64];
    int nc = dt_agent_flight_analyse(ag, msg, sizeof msg, culprits, 64);
    if (nc <= 0) return -1;
    int rank = culprits[0];
    for (int i = 1; i < nc; i++)
        if (culprits[i] < rank) rank = culprits[i];
    size_t mlen = strlen(msg) + 128;
    for (int i = 0; i < *n; i++) {
        failure_t *f = &(*fs)[i];
        if (f->rank != rank) continue;
        /* it failed too: its own record, the finding first */
        size_t len = mlen + (f->message ? strlen(f->message) : 0);
        char *m = dt_xmalloc(len);
        snprintf(m, len, "flight recorder: %s\n%s", msg, f->message ? f->message : "");
        free(f->message);
        f->message = m;
        return i;
    }
    failure_t f;
    memset(&f, 0, sizeof f);
    f.time = dt_wall_s();
    f.rank = rank;
    f.local_rank = -1;
    f.hung = 1;
    snprintf(f.host, sizeof f.host, "?");
    dt_agent_flight_rank_info(ag, rank, f.host, sizeof f.host, &f.pid);
    if (ag->nw > 0 && rank >= ag->base_rank && rank < ag->base_rank + ag->nw) f.local_rank = rank - ag->base_rank;
    for (int i = 0; ag->rz && i < ag->rz->nnodes; i++) { /* a rank of another node: its node's base rank */
        const dt_rdzv_node_t *nd = &ag->rz->nodes[i];
        if (rank >= nd->base_rank && rank < nd->base_rank + nd->nproc) f.local_rank = rank - nd->base_rank;
    }
    snprintf(f.error_file, sizeof f.error_file, "<N/A>");
    f.message = dt_xmalloc(mlen);
    snprintf(f.message, mlen, "flight recorder: %s", msg);
    *fs = dt_xrealloc(*fs, (size_t)(*n + 1) * sizeof **fs);
    (*fs)[*n] = f;
    return (*n)++;
}

int dt_agent_flight_wait(agent_t *ag, int expect, double max_s) {
    dt_flight_rank_t *rs = NULL;
    int nr = all_ranks(ag, &rs);
    free(rs);
    if (!ag->rz || !ag->flight || ag->flight->round != ag->restart_count + 1) return nr;
    /* the other agents post when they see the stop request (their next tick):
     * poll, bounded, so a node that cannot post does not hold the summary */
    double end = dt_now_s() + max_s;
    while (nr < expect && dt_now_s() < end) {
        usleep(50 * 1000);
        nr = all_ranks(ag, &rs);
        free(rs);
    }
    if (nr < expect) DT_LOG_WARN("flight recorder: %d of %d ranks posted their last ops within %.0f s", nr, expect, max_s);
    return nr;
}
