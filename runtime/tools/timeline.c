/*
 * timeline.c - the job timeline's files (timeline.h): the ranks' files merged on
 * rank 0's clock, the Chrome/Perfetto trace-event JSON written and read back.
 */
#include "runtime/tools/timeline.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "common/fs_safe.h"
#include "common/mem.h"
#include "common/trace.h"
#include "common/strbuf.h"

#define TL_MAX_FILE ((size_t)1 << 31) /* a rank file or trace.json (bytes) */
#define TL_MAX_RANKS 65536

void dt_timeline_free(dt_timeline *tl) {
    free(tl->ev);
    free(tl->hosts);
    free(tl->offset_ns);
    free(tl->tracks);
    memset(tl, 0, sizeof *tl);
}

/* A new track (its tid). */
static int track_add(dt_timeline *tl, const char *name) {
    tl->tracks = dt_xrealloc(tl->tracks, (size_t)(tl->n_tracks + 1) * sizeof *tl->tracks);
    snprintf(tl->tracks[tl->n_tracks], sizeof tl->tracks[0], "%s", name);
    return ++tl->n_tracks;
}

/* The track's tid (1-based), added when new. */
static int track_id(dt_timeline *tl, const char *name) {
    for (int i = 0; i < tl->n_tracks; i++)
        if (!strcmp(tl->tracks[i], name)) return i + 1;
    return track_add(tl, name);
}

static void push(dt_timeline *tl, size_t *cap, const dt_tl_event *e) {
    if (tl->n == *cap) {
        *cap = *cap ? *cap * 2 : 1024;
        tl->ev = dt_xrealloc(tl->ev, *cap * sizeof *tl->ev);
    }
    tl->ev[tl->n++] = *e;
}

/* Events by rank, track, start (the enclosing span first): the file's order. */
static int ev_order(const void *a, const void *b) {
    const dt_tl_event *x = a, *y = b;
    if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    if (x->dur != y->dur) return x->dur > y->dur ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* ---- the rank files ----------------------------------------------------------------- */

typedef struct rank_file {
    cJSON *root;
    int64_t epoch, offset;
} rank_file;

static int num(const cJSON *o, const char *key, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) return 0;
    *v = x->valuedouble;
    return 1;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static int int64_str(const char *s, int64_t *v) {
    if (!s || !*s) return 0;
    char *end;
    long long x = strtoll(s, &end, 10);
    if (*end) return 0;
    *v = x;
    return 1;
}

static dt_status_t load_rank(const char *path, int rank, rank_file *rf, int *world_size) {
    char *text = NULL;
    DT_CHECK(dt_fs_read_file(path, TL_MAX_FILE, &text, NULL));
    rf->root = cJSON_Parse(text);
    free(text);
    if (!rf->root) return dt_error(DT_STATUS_FORMAT, "%s: not JSON (a corrupt or cut rank file?)", path);
    double r, ws, off;
    const char *fmt = str(rf->root, "format");
    if (!fmt || strcmp(fmt, "dtrun-trace-rank"))
        return dt_error(DT_STATUS_FORMAT, "%s: not a dtrun trace rank file (no \"format\": \"dtrun-trace-rank\")", path);
    if (!num(rf->root, "rank", &r) || r != rank)
        return dt_error(DT_STATUS_FORMAT, "%s: \"rank\" is missing or not %d", path, rank);
    if (!num(rf->root, "world_size", &ws) || ws < 1 || ws > TL_MAX_RANKS || ws != floor(ws))
        return dt_error(DT_STATUS_FORMAT, "%s: \"world_size\" is missing or not a count in [1, %d]", path,
                        TL_MAX_RANKS);
    if (!int64_str(str(rf->root, "epoch_ns"), &rf->epoch))
        return dt_error(DT_STATUS_FORMAT, "%s: \"epoch_ns\" is missing or not an integer in a string", path);
    if (!num(rf->root, "clock_offset_ns", &off) || fabs(off) > 1e15)
        return dt_error(DT_STATUS_FORMAT, "%s: \"clock_offset_ns\" is missing or not a number", path);
    if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(rf->root, "spans")))
        return dt_error(DT_STATUS_FORMAT, "%s: \"spans\" is missing or not an array", path);
    rf->offset = (int64_t)off;
    *world_size = (int)ws;
    return DT_STATUS_OK;
}

/* Rank r's spans into tl, shifted by shift_ns (its epoch on rank 0's clock less the job's). */
static dt_status_t add_spans(dt_timeline *tl, size_t *cap, const char *path, int r, const cJSON *spans,
                             int64_t shift_ns) {
    int k = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, spans) {
        dt_tl_event e = {.pid = r, .peer = -1};
        double t0, t1, step;
        const char *cat = str(s, "cat"), *name = str(s, "name");
        if (!num(s, "t0", &t0) || !num(s, "t1", &t1) || t0 < 0 || t1 < t0)
            return dt_error(DT_STATUS_FORMAT, "%s: span %d: \"t0\"/\"t1\" missing, negative or t1 < t0", path, k);
        if (!num(s, "step", &step)) return dt_error(DT_STATUS_FORMAT, "%s: span %d: \"step\" missing", path, k);
        if ((e.cat = dt_trace_cat_parse(cat)) < 0)
            return dt_error(DT_STATUS_FORMAT, "%s: span %d: \"cat\" missing or unknown", path, k);
        if (!name) return dt_error(DT_STATUS_FORMAT, "%s: span %d: \"name\" missing", path, k);
        snprintf(e.name, sizeof e.name, "%s", name);
        e.step = (int64_t)step;
        e.ts = (double)(shift_ns + (int64_t)t0) / 1e3;
        e.dur = (t1 - t0) / 1e3;
        char track[64] = "phases";
        if (e.cat == DT_TRACE_CKPT) snprintf(track, sizeof track, "checkpoint");
        if (e.cat == DT_TRACE_OP) {
            double seq, count, bytes, peer, queued;
            const char *comm = str(s, "comm"), *dtype = str(s, "dtype");
            if (!comm || !dtype || !num(s, "seq", &seq) || !num(s, "count", &count) || !num(s, "bytes", &bytes) ||
                !num(s, "peer", &peer) || !num(s, "queued", &queued))
                return dt_error(DT_STATUS_FORMAT,
                                "%s: span %d: an op needs comm, dtype, seq, count, bytes, peer and queued", path, k);
            snprintf(e.comm, sizeof e.comm, "%s", comm);
            snprintf(e.dtype, sizeof e.dtype, "%s", dtype);
            e.seq = (uint64_t)seq, e.count = (uint64_t)count, e.bytes = (uint64_t)bytes, e.peer = (int)peer;
            e.queued_us = queued <= t0 ? (t0 - queued) / 1e3 : 0;
            snprintf(track, sizeof track, "%s %s", cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "p2p")) ? "p2p" : "comm",
                     comm);
        }
        e.tid = track_id(tl, track);
        push(tl, cap, &e);
        k++;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_timeline_from_ranks(const char *log_dir, dt_timeline *tl) {
    memset(tl, 0, sizeof *tl);
    char path[4200];
    int world = 0;
    rank_file *rf = NULL;
    dt_status_t st = DT_STATUS_OK;
    snprintf(path, sizeof path, "%s/trace/rank_0.json", log_dir);
    rank_file first = {0};
    st = load_rank(path, 0, &first, &world);
    if (st != DT_STATUS_OK) {
        cJSON_Delete(first.root);
        if (st == DT_STATUS_NOT_FOUND)
            return dt_error(st, "%s: no trace (was the run started with log.trace=true?)", path);
        return st;
    }
    rf = dt_xcalloc((size_t)world, sizeof *rf);
    rf[0] = first;
    tl->n_ranks = world;
    tl->hosts = dt_xcalloc((size_t)world, sizeof *tl->hosts);
    tl->offset_ns = dt_xcalloc((size_t)world, sizeof *tl->offset_ns);
    for (int r = 1; r < world; r++) {
        int ws = 0;
        snprintf(path, sizeof path, "%s/trace/rank_%d.json", log_dir, r);
        DT_CHECK_GOTO(load_rank(path, r, &rf[r], &ws), st, out_free);
        if (ws != world) {
            st = dt_error(DT_STATUS_FORMAT, "%s: world size %d, but rank_0.json's is %d (files of two runs?)", path,
                          ws, world);
            goto out_free;
        }
    }
    /* ts 0: the earliest rank epoch on rank 0's clock */
    int64_t base = 0;
    for (int r = 0; r < world; r++) {
        int64_t e = rf[r].epoch + rf[r].offset;
        if (r == 0 || e < base) base = e;
    }
    snprintf(tl->epoch_ns, sizeof tl->epoch_ns, "%" PRId64, base);
    track_id(tl, "phases");
    track_id(tl, "checkpoint");
    size_t cap = 0;
    for (int r = 0; r < world; r++) {
        const char *host = str(rf[r].root, "host");
        snprintf(tl->hosts[r], sizeof tl->hosts[0], "%s", host ? host : "");
        tl->offset_ns[r] = rf[r].offset;
        double dropped;
        if (num(rf[r].root, "dropped", &dropped) && dropped > 0) tl->dropped += (uint64_t)dropped;
        snprintf(path, sizeof path, "%s/trace/rank_%d.json", log_dir, r);
        DT_CHECK_GOTO(add_spans(tl, &cap, path, r, cJSON_GetObjectItemCaseSensitive(rf[r].root, "spans"),
                                rf[r].epoch + rf[r].offset - base),
                      st, out_free);
    }
    qsort(tl->ev, tl->n, sizeof *tl->ev, ev_order);
out_free:
    for (int r = 0; r < world; r++) cJSON_Delete(rf[r].root);
    free(rf);
    if (st != DT_STATUS_OK) dt_timeline_free(tl);
    return st;
}

/* ---- trace.json ---------------------------------------------------------------------- */



dt_status_t dt_timeline_write_json(const dt_timeline *tl, const char *path) {
    dt_strbuf b = {dt_xmalloc(1 << 16), 0, 1 << 16};
    dt_strbuf_printf(&b, "{\"displayTimeUnit\": \"ms\",\n \"otherData\": {\"format\": \"dtrun-trace\", \"version\": 1, "
                  "\"epoch_ns\": \"%s\", \"world_size\": %d, \"dropped\": %" PRIu64 ", \"clock_offsets_ns\": [",
              tl->epoch_ns, tl->n_ranks, tl->dropped);
    for (int r = 0; r < tl->n_ranks; r++) dt_strbuf_printf(&b, "%s%" PRId64, r ? ", " : "", tl->offset_ns[r]);
    dt_strbuf_printf(&b, "]},\n \"traceEvents\": [");
    const char *sep = "\n  ";
    for (int r = 0; r < tl->n_ranks; r++) {
        char pname[128];
        snprintf(pname, sizeof pname, "rank %d (%s)", r, tl->hosts[r]);
        dt_strbuf_printf(&b, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": ",
                  sep, r);
        dt_strbuf_json_str(&b, pname);
        dt_strbuf_printf(&b, "}},\n  {\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": "
                      "{\"sort_index\": %d}}", r, r);
        sep = ",\n  ";
        /* the tracks this rank has */
        for (int t = 1; t <= tl->n_tracks; t++) {
            int has = 0;
            for (size_t i = 0; i < tl->n && !has; i++) has = tl->ev[i].pid == r && tl->ev[i].tid == t;
            if (!has) continue;
            dt_strbuf_printf(&b, "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": ",
                      sep, r, t);
            dt_strbuf_json_str(&b, tl->tracks[t - 1]);
            dt_strbuf_printf(&b, "}},\n  {\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": "
                          "{\"sort_index\": %d}}", r, t, t);
        }
    }
    for (size_t i = 0; i < tl->n; i++) {
        const dt_tl_event *e = &tl->ev[i];
        dt_strbuf_printf(&b, "%s{\"name\": ", sep);
        dt_strbuf_json_str(&b, e->name);
        dt_strbuf_printf(&b, ", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d, "
                      "\"args\": {\"step\": %" PRId64,
                  dt_trace_cat_name(e->cat), e->ts, e->dur, e->pid, e->tid, e->step);
        if (e->cat == DT_TRACE_OP) {
            dt_strbuf_printf(&b, ", \"op\": ");
            dt_strbuf_json_str(&b, e->name);
            dt_strbuf_printf(&b, ", \"count\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"dtype\": ", e->count, e->bytes);
            dt_strbuf_json_str(&b, e->dtype);
            dt_strbuf_printf(&b, ", \"peer\": %d, \"comm\": ", e->peer);
            dt_strbuf_json_str(&b, e->comm);
            dt_strbuf_printf(&b, ", \"seq\": %" PRIu64 ", \"queued_us\": %.3f", e->seq, e->queued_us);
        }
        dt_strbuf_printf(&b, "}}");
        sep = ",\n  ";
    }
    dt_strbuf_printf(&b, "\n]}\n");
    dt_status_t st = dt_fs_write_atomic(path, b.p, b.len, NULL, 0);
    free(b.p);
    return st;
}

static dt_status_t read_event(dt_timeline *tl, size_t *cap, const char *path, int k, const cJSON *o) {
    const char *ph = str(o, "ph"), *name = str(o, "name");
    double pid, tid, ts, dur, step;
    if (!ph || !name) return dt_error(DT_STATUS_FORMAT, "%s: event %d: \"ph\" or \"name\" missing", path, k);
    if (!num(o, "pid", &pid) || pid < 0 || pid >= TL_MAX_RANKS || !num(o, "tid", &tid) || tid < 0 || tid > 4096)
        return dt_error(DT_STATUS_FORMAT, "%s: event %d: \"pid\"/\"tid\" missing or out of range", path, k);
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "args");
    if (!strcmp(ph, "M")) {
        const char *an = str(args, "name");
        if (!strcmp(name, "process_name") && an) {
            if ((int)pid >= tl->n_ranks) {
                tl->hosts = dt_xrealloc(tl->hosts, ((size_t)pid + 1) * sizeof *tl->hosts);
                memset(tl->hosts + tl->n_ranks, 0, ((size_t)pid + 1 - (size_t)tl->n_ranks) * sizeof *tl->hosts);
                tl->n_ranks = (int)pid + 1;
            }
            const char *open = strchr(an, '(');
            snprintf(tl->hosts[(int)pid], sizeof tl->hosts[0], "%s", open ? open + 1 : "");
            char *close = strrchr(tl->hosts[(int)pid], ')');
            if (close) *close = 0;
        } else if (!strcmp(name, "thread_name") && an) {
            while (tl->n_tracks < (int)tid) track_add(tl, "");
            snprintf(tl->tracks[(int)tid - 1], sizeof tl->tracks[0], "%s", an);
        }
        return DT_STATUS_OK;
    }
    if (strcmp(ph, "X")) return DT_STATUS_OK; /* another tool's additions */
    dt_tl_event e = {.pid = (int)pid, .tid = (int)tid, .peer = -1};
    if (!num(o, "ts", &ts) || !num(o, "dur", &dur) || dur < 0)
        return dt_error(DT_STATUS_FORMAT, "%s: event %d: \"ts\"/\"dur\" missing or dur < 0", path, k);
    if (!num(args, "step", &step)) return dt_error(DT_STATUS_FORMAT, "%s: event %d: args.step missing", path, k);
    if ((e.cat = dt_trace_cat_parse(str(o, "cat"))) < 0)
        return dt_error(DT_STATUS_FORMAT, "%s: event %d: \"cat\" missing or unknown", path, k);
    e.ts = ts, e.dur = dur, e.step = (int64_t)step;
    snprintf(e.name, sizeof e.name, "%s", name);
    if (e.cat == DT_TRACE_OP) {
        double v;
        const char *comm = str(args, "comm"), *dtype = str(args, "dtype");
        snprintf(e.comm, sizeof e.comm, "%s", comm ? comm : "");
        snprintf(e.dtype, sizeof e.dtype, "%s", dtype ? dtype : "");
        if (num(args, "seq", &v)) e.seq = (uint64_t)v;
        if (num(args, "count", &v)) e.count = (uint64_t)v;
        if (num(args, "bytes", &v)) e.bytes = (uint64_t)v;
        if (num(args, "peer", &v)) e.peer = (int)v;
        if (num(args, "queued_us", &v)) e.queued_us = v;
    }
    if (e.pid >= tl->n_ranks) { /* a rank with no process_name */
        tl->hosts = dt_xrealloc(tl->hosts, ((size_t)e.pid + 1) * sizeof *tl->hosts);
        memset(tl->hosts + tl->n_ranks, 0, ((size_t)e.pid + 1 - (size_t)tl->n_ranks) * sizeof *tl->hosts);
        tl->n_ranks = e.pid + 1;
    }
    while (tl->n_tracks < e.tid) track_add(tl, "");
    push(tl, cap, &e);
    return DT_STATUS_OK;
}

dt_status_t dt_timeline_read_json(const char *path, dt_timeline *tl) {
    memset(tl, 0, sizeof *tl);
    char *text = NULL;
    DT_CHECK(dt_fs_read_file(path, TL_MAX_FILE, &text, NULL));
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return dt_error(DT_STATUS_FORMAT, "%s: not JSON (a corrupt or cut trace?)", path);
    dt_status_t st = DT_STATUS_OK;
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(root, "traceEvents"), *o;
    if (!cJSON_IsArray(evs)) {
        st = dt_error(DT_STATUS_FORMAT, "%s: no \"traceEvents\" array (not a trace-event JSON)", path);
        goto out_free;
    }
    const cJSON *other = cJSON_GetObjectItemCaseSensitive(root, "otherData");
    const char *epoch = str(other, "epoch_ns");
    snprintf(tl->epoch_ns, sizeof tl->epoch_ns, "%s", epoch ? epoch : "0");
    size_t cap = 0;
    int k = 0;
    cJSON_ArrayForEach(o, evs) {
        DT_CHECK_GOTO(read_event(tl, &cap, path, k, o), st, out_free);
        k++;
    }
    tl->offset_ns = dt_xcalloc((size_t)tl->n_ranks + 1, sizeof *tl->offset_ns);
    qsort(tl->ev, tl->n, sizeof *tl->ev, ev_order);
out_free:
    cJSON_Delete(root);
    if (st != DT_STATUS_OK) dt_timeline_free(tl);
    return st;
}

dt_status_t dt_timeline_steps(const dt_timeline *tl, int64_t *first, int64_t *last) {
    int any = 0;
    for (size_t i = 0; i < tl->n; i++) {
        const dt_tl_event *e = &tl->ev[i];
        if (e->cat != DT_TRACE_STEP) continue;
        if (!any || e->step < *first) *first = e->step;
        if (!any || e->step > *last) *last = e->step;
        any = 1;
    }
    return any ? DT_STATUS_OK : dt_error(DT_STATUS_NOT_FOUND, "the trace holds no step");
}
