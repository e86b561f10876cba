/*
 * flight_report.c - the flight recorder's analysis (flight_report.h): rank
 * records from rings, the "never entered" / desync findings, and the JSON line
 * each agent posts per rank.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "runtime/launch/flight_report.h"

void dt_flight_rank_from_entries(dt_flight_rank_t *r, const dt_flight_entry_t *e, int n) {
    r->nlast = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < r->nlast && strcmp(r->last[k].comm, e[i].comm)) k++;
        if (k == r->nlast) {
            if (r->nlast == DT_FLIGHT_MAX_COMMS) continue;
            r->nlast++;
        } else if (r->last[k].seq > e[i].seq) {
            continue;
        }
        dt_flight_last_t *l = &r->last[k];
        if (l->comm[0] && l->seq < e[i].seq) { /* the op it had becomes history */
            if (l->nrecent == DT_FLIGHT_RECENT) {
                memmove(&l->recent[0], &l->recent[1], (DT_FLIGHT_RECENT - 1) * sizeof l->recent[0]);
                l->nrecent--;
            }
            dt_flight_op_t *h = &l->recent[l->nrecent++];
            h->seq = l->seq;
            h->count = l->count;
            memcpy(h->op, l->op, sizeof h->op); /* same sizes, NUL-terminated */
            memcpy(h->dtype, l->dtype, sizeof h->dtype);
        }
        snprintf(l->comm, sizeof l->comm, "%s", e[i].comm);
        snprintf(l->op, sizeof l->op, "%s", e[i].op);
        snprintf(l->dtype, sizeof l->dtype, "%s", e[i].dtype);
        l->seq = e[i].seq;
        l->count = e[i].count;
        l->state = e[i].state;
    }
}

static const dt_flight_last_t *last_in(const dt_flight_rank_t *r, const char *comm) {
    for (int k = 0; k < r->nlast; k++)
        if (!strcmp(r->last[k].comm, comm)) return &r->last[k];
    return NULL;
}

static int same_op(const dt_flight_last_t *a, const dt_flight_last_t *b) {
    return a->seq == b->seq && !strcmp(a->op, b->op) && a->count == b->count && !strcmp(a->dtype, b->dtype);
}

/* The op l's rank did under number seq (its last or one of the recent), NULL when
 * not kept. */
static const dt_flight_op_t *op_at(const dt_flight_last_t *l, uint64_t seq, dt_flight_op_t *tmp) {
    if (l->seq == seq) {
        tmp->seq = l->seq;
        tmp->count = l->count;
        snprintf(tmp->op, sizeof tmp->op, "%s", l->op);
        snprintf(tmp->dtype, sizeof tmp->dtype, "%s", l->dtype);
        return tmp;
    }
    for (int i = 0; i < l->nrecent; i++)
        if (l->recent[i].seq == seq) return &l->recent[i];
    return NULL;
}

static int same_flight_op(const dt_flight_op_t *a, const dt_flight_op_t *b) {
    return !strcmp(a->op, b->op) && a->count == b->count && !strcmp(a->dtype, b->dtype);
}


static void describe(const dt_flight_last_t *l, char *buf, size_t len) {
    if (!strcmp(l->op, "barrier"))
        snprintf(buf, len, "barrier #%" PRIu64, l->seq);
    else
        snprintf(buf, len, "%s #%" PRIu64 " (count %" PRIu64 ", %s)", l->op, l->seq, l->count, l->dtype);
}

static void describe_op(const dt_flight_op_t *o, char *buf, size_t len) {
    dt_flight_last_t l = {.seq = o->seq, .count = o->count};
    snprintf(l.op, sizeof l.op, "%s", o->op);
    snprintf(l.dtype, sizeof l.dtype, "%s", o->dtype);
    describe(&l, buf, len);
}

typedef struct out {
    char *p;
    size_t len, off;
} out_t;

static void put(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_t *o, const char *fmt, ...) {
    if (o->off >= o->len) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(o->p + o->off, o->len - o->off, fmt, ap);
    va_end(ap);
    if (k > 0) o->off += (size_t)k;
    if (o->off >= o->len) o->off = o->len - 1;
}

/* "ranks 0,2" / "rank 1" over idx[0..n) of ranks. */
static void put_ranks(out_t *o, const dt_flight_rank_t *ranks, const int *idx, int n) {
    put(o, "rank%s ", n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) put(o, "%s%d", i ? "," : "", ranks[idx[i]].rank);
}

/* The process failed (a non-zero exit, a signal, a zombie): not one that never
 * arrived, its own failure record tells why. A rank that exited 0 while the others
 * wait in an op it never entered did leave early (it skipped ops: a desync), and is
 * named. */
static int gone(const dt_flight_rank_t *r) {
    if (!strcmp(r->proc, "exited 0")) return 0;
    return !strncmp(r->proc, "exited", 6) || !strncmp(r->proc, "killed", 6);
}

static void add_culprit(int *c, int *nc, int max, int rank) {
    for (int i = 0; i < *nc; i++)
        if (c[i] == rank) return;
    if (*nc < max) c[(*nc)++] = rank;
}

/* The lowest number the ranks reached in comm, when some are past it: a rank that did
 * another op under it than the most ranks there skipped or added an op (its later
 * ops are numbered one off); it is named, the others are its victims. 1 when found. */
static int history_desync(const dt_flight_rank_t *ranks, int n, const char *comm, uint64_t top, out_t *o,
                          int *culprits, int *nc, int max, int *victim) {
    uint64_t low = top;
    for (int b = 0; b < n; b++) {
        const dt_flight_last_t *l = last_in(&ranks[b], comm);
        if (l && l->seq < low) low = l->seq;
    }
    if (low == top) return 0;
    dt_flight_op_t *at = dt_xcalloc((size_t)n, sizeof *at);
    int *has = dt_xcalloc((size_t)n, sizeof *has), *odd = dt_xcalloc((size_t)n, sizeof *odd);
    int ref = -1, best = 0, nodd = 0;
    for (int b = 0; b < n; b++) {
        const dt_flight_last_t *l = last_in(&ranks[b], comm);
        const dt_flight_op_t *x = l ? op_at(l, low, &at[b]) : NULL;
        if (x) at[b] = *x, has[b] = 1;
    }
    for (int b = 0; b < n; b++) {
        if (!has[b]) continue;
        int votes = 0;
        for (int c = 0; c < n; c++) votes += has[c] && same_flight_op(&at[b], &at[c]);
        if (votes > best) best = votes, ref = b;
    }
    for (int b = 0; b < n && ref >= 0; b++)
        if (has[b] && !same_flight_op(&at[b], &at[ref])) odd[nodd++] = b;
    if (nodd) {
        char what[160], lw[160];
        describe_op(&at[ref], what, sizeof what);
        put(o, "communicator %s: desync at #%" PRIu64 ": ", comm, low);
        for (int i = 0; i < nodd; i++) {
            const dt_flight_last_t *l = last_in(&ranks[odd[i]], comm);
            describe_op(&at[odd[i]], lw, sizeof lw);
            put(o, "%srank %d in %s", i ? ", " : "", ranks[odd[i]].rank, lw);
            if (l->seq > low) put(o, " (then on to #%" PRIu64 ")", l->seq);
            add_culprit(culprits, nc, max, ranks[odd[i]].rank);
        }
        int nv = 0; /* odd[] is free again: the victims' indices */
        for (int b = 0; b < n; b++)
            if (has[b] && same_flight_op(&at[b], &at[ref])) victim[b] = 1, odd[nv++] = b;
        put(o, "; the others (");
        put_ranks(o, ranks, odd, nv);
        put(o, ") in %s\n", what);
    }
    free(at);
    free(has);
    free(odd);
    return nodd > 0;
}

int dt_flight_analyse(const dt_flight_rank_t *ranks, int n, char *msg, size_t len, int *culprits, int max) {
    out_t o = {msg, len, 0};
    if (len) msg[0] = 0;
    int nc = 0;
    int *wait = dt_xcalloc((size_t)n + 1, sizeof(int)), *late = dt_xcalloc((size_t)n + 1, sizeof(int));
    int *odd = dt_xcalloc((size_t)n + 1, sizeof(int));
    /* victim[b]: ranks[b] waits, in a communicator where a finding was made, for the
     * rank named there (a hierarchical op: node 1's rank 2 waits inside its node for
     * a stopped rank 3, so it never enters the cross-node stage rank 0 waits in) */
    int *victim = dt_xcalloc((size_t)n + 1, sizeof(int));
    /* every communicator, once, in the order the ranks name them */
    for (int a = 0; a < n; a++) {
        for (int k = 0; k < ranks[a].nlast; k++) {
            const char *comm = ranks[a].last[k].comm;
            int seen = 0;
            for (int b = 0; b < a && !seen; b++) seen = last_in(&ranks[b], comm) != NULL;
            if (seen) continue;
            /* the newest number any rank reached, and a rank waiting there */
            uint64_t top = 0;
            for (int b = 0; b < n; b++) {
                const dt_flight_last_t *l = last_in(&ranks[b], comm);
                if (l && l->seq > top) top = l->seq;
            }
            if (history_desync(ranks, n, comm, top, &o, culprits, &nc, max, victim)) continue;
            int nw = 0, nl = 0, nodd = 0;
            const dt_flight_last_t *ref = NULL;
            /* the op most waiting ranks at `top` are in is the reference */
            int best = 0;
            for (int b = 0; b < n; b++) {
                const dt_flight_last_t *l = last_in(&ranks[b], comm);
                if (!l || l->seq != top || l->state == DT_FLIGHT_DONE) continue;
                int votes = 0;
                for (int c = 0; c < n; c++) {
                    const dt_flight_last_t *m = last_in(&ranks[c], comm);
                    if (m && m->state != DT_FLIGHT_DONE && same_op(l, m)) votes++;
                }
                if (votes > best) best = votes, ref = l;
            }
            if (!ref) continue; /* nobody waits in this communicator */
            for (int b = 0; b < n; b++) {
                const dt_flight_last_t *l = last_in(&ranks[b], comm);
                if (!l) continue;
                if (l->seq < top && gone(&ranks[b])) continue; /* it ended: its own failure tells why */
                if (l->seq < top) late[nl++] = b;
                else if (l->state == DT_FLIGHT_DONE) continue; /* through it already, leaving */
                else if (same_op(l, ref)) wait[nw++] = b;
                else odd[nodd++] = b;
            }
            char what[160];
            describe(ref, what, sizeof what);
            if (nl || nodd)
                for (int i = 0; i < nw; i++) victim[wait[i]] = 1;
            if (nl) {
                put(&o, "communicator %s: ", comm);
                put_ranks(&o, ranks, wait, nw);
                put(&o, " wait%s in %s; ", nw == 1 ? "s" : "", what);
                for (int i = 0; i < nl; i++) {
                    const dt_flight_rank_t *r = &ranks[late[i]];
                    const dt_flight_last_t *l = last_in(r, comm);
                    char lw[160];
                    describe(l, lw, sizeof lw);
                    put(&o, "%srank %d never entered it (last in %s, %s; process %s)", i ? "; " : "", r->rank, lw,
                        dt_flight_state_name(l->state), r->proc[0] ? r->proc : "unknown");
                    add_culprit(culprits, &nc, max, r->rank);
                }
                put(&o, "\n");
            }
            if (nodd) {
                put(&o, "communicator %s: desync at #%" PRIu64 ": ", comm, top);
                for (int i = 0; i < nodd; i++) {
                    const dt_flight_last_t *l = last_in(&ranks[odd[i]], comm);
                    char lw[160];
                    describe(l, lw, sizeof lw);
                    put(&o, "%srank %d in %s", i ? ", " : "", ranks[odd[i]].rank, lw);
                    add_culprit(culprits, &nc, max, ranks[odd[i]].rank);
                }
                put(&o, "; the others (");
                put_ranks(&o, ranks, wait, nw);
                put(&o, ") in %s\n", what);
            }
            if (!nl && !nodd) {
                /* Everyone entered the op, but a rank stopped inside it (SIGSTOP, a
                 * tracer) cannot take its part: the others wait for that one. */
                int ns = 0, nrun = 0;
                for (int i = 0; i < nw; i++) {
                    if (!strncmp(ranks[wait[i]].proc, "stopped", 7)) odd[ns++] = wait[i];
                    else late[nrun++] = wait[i]; /* free here: nl == 0 */
                }
                if (ns) {
                    for (int i = 0; i < nrun; i++) victim[late[i]] = 1;
                    /* who waits (every node's ranks when the agents posted theirs) */
                    put(&o, "communicator %s: ", comm);
                    if (nrun) put_ranks(&o, ranks, late, nrun);
                    else put(&o, "ranks");
                    put(&o, " wait%s in %s for ", nrun == 1 ? "s" : "", what);
                    for (int i = 0; i < ns; i++) {
                        put(&o, "%srank %d, which entered it but its process is %s", i ? "; " : "",
                            ranks[odd[i]].rank, ranks[odd[i]].proc);
                        add_culprit(culprits, &nc, max, ranks[odd[i]].rank);
                    }
                    put(&o, "\n");
                }
            }
        }
    }
    /* a rank named in one communicator that waits in another for a named rank is
     * not a cause: drop it, unless every named rank waits (a cycle) */
    int keep = 0;
    for (int i = 0; i < nc; i++) {
        int v = 0;
        for (int b = 0; b < n; b++) v |= ranks[b].rank == culprits[i] && victim[b];
        if (!v) keep++;
    }
    if (keep > 0 && keep < nc) {
        int m = 0;
        for (int i = 0; i < nc; i++) {
            int v = 0;
            for (int b = 0; b < n; b++) v |= ranks[b].rank == culprits[i] && victim[b];
            if (!v) culprits[m++] = culprits[i];
        }
        nc = m;
    }
    free(victim);
    free(wait);
    free(late);
    free(odd);
    return nc;
}

char *dt_flight_rank_json(const dt_flight_rank_t *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", r->rank);
    cJSON_AddStringToObject(o, "host", r->host);
    cJSON_AddNumberToObject(o, "pid", (double)r->pid);
    cJSON_AddStringToObject(o, "process", r->proc);
    cJSON *arr = cJSON_AddArrayToObject(o, "last");
    for (int k = 0; k < r->nlast; k++) {
        const dt_flight_last_t *l = &r->last[k];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "comm", l->comm);
        cJSON_AddNumberToObject(e, "seq", (double)l->seq);
        cJSON_AddStringToObject(e, "op", l->op);
        cJSON_AddNumberToObject(e, "count", (double)l->count);
        cJSON_AddStringToObject(e, "dtype", l->dtype);
        cJSON_AddNumberToObject(e, "state", l->state);
        cJSON *rec = cJSON_AddArrayToObject(e, "recent");
        for (int i = 0; i < l->nrecent; i++) {
            cJSON *h = cJSON_CreateObject();
            cJSON_AddNumberToObject(h, "seq", (double)l->recent[i].seq);
            cJSON_AddStringToObject(h, "op", l->recent[i].op);
            cJSON_AddNumberToObject(h, "count", (double)l->recent[i].count);
            cJSON_AddStringToObject(h, "dtype", l->recent[i].dtype);
            cJSON_AddItemToArray(rec, h);
        }
        cJSON_AddItemToArray(arr, e);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    size_t n = strlen(s);
    char *line = dt_xmalloc(n + 2);
    memcpy(line, s, n);
    line[n] = '\n';
    line[n + 1] = 0;
    cJSON_free(s);
    return line;
}

static void get_str(const cJSON *o, const char *k, char *dst, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsString(v)) snprintf(dst, cap, "%s", v->valuestring);
}

/* A number of the record clamped to [lo, hi] (0 when absent or not a number): the
 * store is written by other agents, and a value out of range must not reach a cast. */
static double get_num(const cJSON *o, const char *k, double lo, double hi) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    double x = cJSON_IsNumber(v) && v->valuedouble == v->valuedouble ? v->valuedouble : 0;
    return x < lo ? lo : x > hi ? hi : x;
}

int dt_flight_rank_parse(const char *line, dt_flight_rank_t *r) {
    memset(r, 0, sizeof *r);
    cJSON *o = cJSON_Parse(line);
    if (!o) return -1;
    r->rank = (int)get_num(o, "rank", -1, 1 << 30);
    r->pid = (long)get_num(o, "pid", 0, 1 << 30);
    get_str(o, "host", r->host, sizeof r->host);
    get_str(o, "process", r->proc, sizeof r->proc);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "last"), *e;
    cJSON_ArrayForEach(e, arr) {
        if (r->nlast == DT_FLIGHT_MAX_COMMS) break;
        dt_flight_last_t *l = &r->last[r->nlast++];
        get_str(e, "comm", l->comm, sizeof l->comm);
        get_str(e, "op", l->op, sizeof l->op);
        get_str(e, "dtype", l->dtype, sizeof l->dtype);
        l->seq = (uint64_t)get_num(e, "seq", 0, 9e15);
        l->count = (uint64_t)get_num(e, "count", 0, 9e15);
        l->state = (int)get_num(e, "state", 0, 16);
        const cJSON *h;
        cJSON_ArrayForEach(h, cJSON_GetObjectItemCaseSensitive(e, "recent")) {
            if (l->nrecent == DT_FLIGHT_RECENT) break;
            dt_flight_op_t *x = &l->recent[l->nrecent++];
            x->seq = (uint64_t)get_num(h, "seq", 0, 9e15);
            x->count = (uint64_t)get_num(h, "count", 0, 9e15);
            get_str(h, "op", x->op, sizeof x->op);
            get_str(h, "dtype", x->dtype, sizeof x->dtype);
        }
    }
    cJSON_Delete(o);
    return 0;
}
