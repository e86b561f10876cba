/*
 * failure.c - what a failed worker leaves behind and how the agent reports it:
 * the worker's TORCHELASTIC_ERROR_FILE (torchrun's @record format), the failure
 * record every node posts to the store (one JSON line each), and torchrun's
 * ChildFailedError summary naming the root cause (the first failure in time).
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"
#include "common/mem.h"
#include "runtime/launch/agent_impl.h"

static void iso_time(double wall, char *buf, size_t len) {
    time_t t = (time_t)wall;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%d_%H:%M:%S", &tm);
}

const char *dt_agent_signame(int sig) {
    static char buf[16];
    const char *ab = sigabbrev_np(sig);
    if (!ab) return "<N/A>";
    snprintf(buf, sizeof buf, "SIG%s", ab);
    return buf;
}

/* ---- failures and the summary ------------------------------------------- */

/* Reads TORCHELASTIC_ERROR_FILE as torchrun's @record writes it. */
static char *read_error_file(const char *path, double *ts) {
    char *buf = NULL;
    size_t n = 0;
    if (dt_fs_read_file(path, 1 << 20, &buf, &n) != DT_STATUS_OK) return NULL;
    char *out = NULL;
    cJSON *root = cJSON_Parse(buf);
    if (!root) {
        out = n ? dt_xstrdup(buf) : NULL; /* not JSON: show the text */
        free(buf);
        return out;
    }
    cJSON *msg = cJSON_GetObjectItem(root, "message");
    if (cJSON_IsString(msg)) {
        out = dt_xstrdup(msg->valuestring);
        cJSON *t = cJSON_GetObjectItem(root, "timestamp");
        if (cJSON_IsNumber(t)) *ts = t->valuedouble;
        else if (cJSON_IsString(t)) *ts = atof(t->valuestring);
    } else if (cJSON_IsObject(msg)) {
        cJSON *extra = cJSON_GetObjectItem(msg, "extraInfo");
        cJSON *cs = extra ? cJSON_GetObjectItem(extra, "py_callstack") : NULL;
        cJSON *m = cJSON_GetObjectItem(msg, "message");
        cJSON *t = extra ? cJSON_GetObjectItem(extra, "timestamp") : NULL;
        if (cJSON_IsString(cs)) out = dt_xstrdup(cs->valuestring);
        else if (cJSON_IsString(m)) out = dt_xstrdup(m->valuestring);
        if (cJSON_IsString(t)) *ts = atof(t->valuestring);
        else if (cJSON_IsNumber(t)) *ts = t->valuedouble;
    }
    cJSON_Delete(root);
    free(buf);
    return out;
}

void dt_agent_add_failure(agent_t *ag, const failure_t *f) {
    ag->fails = dt_xrealloc(ag->fails, (size_t)(ag->nfails + 1) * sizeof *ag->fails);
    ag->fails[ag->nfails++] = *f;
}

failure_t dt_agent_worker_failure(agent_t *ag, worker_t *w) {
    failure_t f;
    memset(&f, 0, sizeof f);
    f.time = w->end_wall;
    snprintf(f.host, sizeof f.host, "%s", ag->host);
    f.rank = w->rank;
    f.local_rank = w->local_rank;
    f.pid = w->pid;
    f.exitcode = WIFSIGNALED(w->wstatus) ? -WTERMSIG(w->wstatus) : WEXITSTATUS(w->wstatus);
    double ts = 0;
    char *msg = read_error_file(w->error_file, &ts);
    if (msg) {
        snprintf(f.error_file, sizeof f.error_file, "%s", w->error_file);
        if (ts > 0) f.time = ts;
    } else {
        snprintf(f.error_file, sizeof f.error_file, "<N/A>");
    }
    char tail[DT_LOGPIPE_TAIL_LINES * DT_LOGPIPE_TAIL_WIDTH + 16];
    dt_logpipe_tail(&w->lp[1], tail, sizeof tail);
    char head[256] = "";
    if (f.exitcode < 0)
        snprintf(head, sizeof head, "Signal %d (%s) received by PID %ld", -f.exitcode,
                 dt_agent_signame(-f.exitcode), f.pid);
    size_t len = strlen(head) + strlen(tail) + (msg ? strlen(msg) : 0) + 64;
    f.message = dt_xmalloc(len);
    if (msg) snprintf(f.message, len, "%s", msg);
    else if (tail[0]) snprintf(f.message, len, "%s%slast lines of stderr:\n%s", head,
                               head[0] ? "\n" : "", tail);
    else if (head[0]) snprintf(f.message, len, "%s", head);
    else snprintf(f.message, len, "<no error file, no stderr output>");
    free(msg);
    return f;
}

char *dt_agent_failure_json(const failure_t *f) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "time", f->time);
    cJSON_AddStringToObject(o, "host", f->host);
    cJSON_AddNumberToObject(o, "rank", f->rank);
    cJSON_AddNumberToObject(o, "local_rank", f->local_rank);
    cJSON_AddNumberToObject(o, "pid", (double)f->pid);
    cJSON_AddNumberToObject(o, "exitcode", f->exitcode);
    cJSON_AddBoolToObject(o, "lost", f->lost);
    cJSON_AddStringToObject(o, "error_file", f->error_file);
    cJSON_AddStringToObject(o, "message", f->message ? f->message : "");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    size_t n = strlen(s);
    char *line = dt_xmalloc(n + 2);
    memcpy(line, s, n);
    line[n] = '\n';
    line[n + 1] = '\0';
    cJSON_free(s);
    return line;
}

static int parse_failures(const char *jsonl, failure_t **out) {
    int n = 0;
    failure_t *fs = NULL;
    const char *p = jsonl;
    while (p && *p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char *line = dt_xmalloc(len + 1);
        memcpy(line, p, len);
        line[len] = '\0';
        cJSON *o = cJSON_Parse(line);
        free(line);
        if (o) {
            failure_t f;
            memset(&f, 0, sizeof f);
            cJSON *v;
            if ((v = cJSON_GetObjectItem(o, "time")) && cJSON_IsNumber(v)) f.time = v->valuedouble;
            if ((v = cJSON_GetObjectItem(o, "host")) && cJSON_IsString(v))
                snprintf(f.host, sizeof f.host, "%s", v->valuestring);
            if ((v = cJSON_GetObjectItem(o, "rank")) && cJSON_IsNumber(v)) f.rank = v->valueint;
            if ((v = cJSON_GetObjectItem(o, "local_rank")) && cJSON_IsNumber(v)) f.local_rank = v->valueint;
            if ((v = cJSON_GetObjectItem(o, "pid")) && cJSON_IsNumber(v)) f.pid = (long)v->valuedouble;
            if ((v = cJSON_GetObjectItem(o, "exitcode")) && cJSON_IsNumber(v)) f.exitcode = v->valueint;
            f.lost = cJSON_IsTrue(cJSON_GetObjectItem(o, "lost"));
            if ((v = cJSON_GetObjectItem(o, "error_file")) && cJSON_IsString(v))
                snprintf(f.error_file, sizeof f.error_file, "%s", v->valuestring);
            if ((v = cJSON_GetObjectItem(o, "message")) && cJSON_IsString(v))
                f.message = dt_xstrdup(v->valuestring);
            cJSON_Delete(o);
            fs = dt_xrealloc(fs, (size_t)(n + 1) * sizeof *fs);
            fs[n++] = f;
        }
        p = nl ? nl + 1 : NULL;
    }
    *out = fs;
    return n;
}

/* Appends s to a growing buffer. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf_t;

static void sb_add(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf_t *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        b->cap = (b->cap + (size_t)n + 1) * 2;
        b->p = dt_xrealloc(b->p, b->cap);
    }
}

static void format_failure(sbuf_t *b, int idx, const failure_t *f) {
    char t[64];
    iso_time(f->time, t, sizeof t);
    sb_add(b, "[%d]:\n  time      : %s\n  host      : %s\n  rank      : %d (local_rank: %d)\n",
           idx, t, f->host, f->rank, f->local_rank);
    if (f->lost) sb_add(b, "  exitcode  : <N/A> (node lost)\n");
    else if (f->hung) sb_add(b, "  exitcode  : <N/A> (pid: %ld) (never arrived: stopped, stuck or desynced)\n", f->pid);
    else if (f->exitcode < 0)
        sb_add(b, "  exitcode  : %d (pid: %ld) (%s)\n", f->exitcode, f->pid, dt_agent_signame(-f->exitcode));
    else sb_add(b, "  exitcode  : %d (pid: %ld)\n", f->exitcode, f->pid);
    sb_add(b, "  error_file: %s\n  traceback : ", f->error_file);
    const char *m = f->message ? f->message : "<N/A>";
    size_t mlen = strlen(m);
    while (mlen && m[mlen - 1] == '\n') mlen--;
    for (size_t i = 0; i < mlen; i++) {
        if (m[i] == '\n') sb_add(b, "\n  ");
        else sb_add(b, "%c", m[i]);
    }
    sb_add(b, "\n");
}

/* torchrun's ChildFailedError.format_msg layout: title, "Failures:" (the others),
 * "Root Cause (first observed failure):". */
static void print_summary(const char *job, failure_t *fs, int n, int flight_root) {
    if (n == 0) return;
    int root = 0;
    for (int i = 1; i < n; i++)
        if (fs[i].time < fs[root].time) root = i;
    if (flight_root >= 0) root = flight_root; /* the rank the others waited for */
    sbuf_t others = {0}, rootb = {0};
    int idx = 0;
    for (int i = 0; i < n; i++) {
        if (i == root) continue;
        format_failure(&others, ++idx, &fs[i]);
    }
    format_failure(&rootb, 0, &fs[root]);
    char title[300];
    snprintf(title, sizeof title, "%s FAILED", job);
    size_t width = strlen(title);
    const char *bufs[] = {others.p, rootb.p};
    for (int k = 0; k < 2; k++) {
        const char *p = bufs[k];
        while (p && *p) {
            const char *nl = strchr(p, '\n');
            size_t l = nl ? (size_t)(nl - p) : strlen(p);
            if (l > width) width = l;
            p = nl ? nl + 1 : NULL;
        }
    }
    if (width > 60) width = 60;
    char border[61], section[61];
    memset(border, '=', width);
    border[width] = '\0';
    memset(section, '-', width);
    section[width] = '\0';
    sbuf_t out = {0};
    sb_add(&out, "\n%s\n%s\n%s\nFailures:\n%s%s\nRoot Cause (%s):\n%s%s\n",
           border, title, section, others.p ? others.p : "  <NO_OTHER_FAILURES>\n", section,
           flight_root >= 0 ? "the rank the others waited for, from the flight recorder" : "first observed failure",
           rootb.p, border);
    ssize_t wr = write(STDERR_FILENO, out.p, out.len);
    (void)wr;
    free(out.p);
    free(others.p);
    free(rootb.p);
}


void dt_agent_failures_free(failure_t *fs, int n) {
    for (int i = 0; i < n; i++) free(fs[i].message);
    free(fs);
}


char *dt_agent_lost_node_failures(const dt_rdzv_node_t *nd, const char *reason) {
    sbuf_t b = {0};
    for (int r = 0; r < nd->nproc; r++) {
        failure_t f;
        memset(&f, 0, sizeof f);
        f.time = dt_wall_s();
        snprintf(f.host, sizeof f.host, "%s", nd->host);
        f.rank = nd->base_rank + r;
        f.local_rank = r;
        f.lost = 1;
        snprintf(f.error_file, sizeof f.error_file, "<N/A>");
        f.message = (char *)reason;
        char *line = dt_agent_failure_json(&f);
        sb_add(&b, "%s", line);
        free(line);
    }
    return b.p;
}

void dt_agent_report_failures(agent_t *ag) {
    /* Every node's failures when there is a store, else this node's. */
    int printed = 0;
    if (ag->rz) {
        /* every node's flight records before the analysis: the ranks of lost nodes post none */
        char *pre = NULL;
        int lost = 0;
        if (dt_rdzv_get_failures(ag->rz, &pre) == DT_STATUS_OK && pre && *pre) {
            failure_t *pf = NULL;
            int np = parse_failures(pre, &pf);
            for (int i = 0; i < np; i++) lost += pf[i].lost;
            dt_agent_failures_free(pf, np);
        }
        free(pre);
        dt_agent_flight_wait(ag, ag->world_size - lost, 3.0);
        char *jsonl = NULL;
        if (dt_rdzv_get_failures(ag->rz, &jsonl) == DT_STATUS_OK && jsonl && *jsonl) {
            failure_t *remote = NULL;
            int nr = parse_failures(jsonl, &remote);
            int fr = nr > 0 ? dt_agent_flight_root(ag, &remote, &nr) : -1;
            if (nr > 0) print_summary(ag->title, remote, nr, fr);
            printed = nr > 0;
            dt_agent_failures_free(remote, nr);
        }
        free(jsonl);
    }
    if (!printed && ag->nfails > 0) {
        print_summary(ag->title, ag->fails, ag->nfails, dt_agent_flight_root(ag, &ag->fails, &ag->nfails));
        printed = 1;
    }
    if (!printed && ag->stop_note[0]) fprintf(stderr, "dtrun: the group was stopped: %s\n", ag->stop_note);
}

void dt_agent_report_refusal(agent_t *ag) {
    failure_t *fs = ag->fails, *remote = NULL;
    int n = ag->nfails, nr = 0;
    char *jsonl = NULL;
    if (ag->rz && dt_rdzv_get_failures(ag->rz, &jsonl) == DT_STATUS_OK && jsonl && *jsonl &&
        (nr = parse_failures(jsonl, &remote)) > 0) {
        fs = remote; /* every node's: the refusal may be another node's */
        n = nr;
    }
    free(jsonl);
    int root = -1;
    for (int i = 0; i < n; i++)
        if (fs[i].exitcode == DT_EXIT_USAGE && (root < 0 || fs[i].time < fs[root].time)) root = i;
    if (root >= 0) {
        /* the rank's first line of its own words (past the "last lines of stderr:" header) */
        const char *m = fs[root].message ? fs[root].message : "";
        if (!strncmp(m, "last lines of stderr:\n", 22)) m += 22;
        size_t len = strcspn(m, "\n");
        fprintf(stderr, "dtrun: error: rank %d (%s) refused the job before training (exit 2; not restarted): %.*s\n",
                fs[root].rank, fs[root].host, (int)(len > 600 ? 600 : len), m);
    } else {
        fprintf(stderr, "dtrun: error: a rank refused the job before training (exit 2; not restarted)\n");
    }
    dt_agent_failures_free(remote, nr);
}

/* The exit code of the first observed failure of fs[0..n) (-1: none). */
static int first_exit(const failure_t *fs, int n) {
    int first = -1;
    for (int i = 0; i < n; i++)
        if (!fs[i].lost && (first < 0 || fs[i].time < fs[first].time)) first = i;
    return first >= 0 ? fs[first].exitcode : -1;
}

int dt_agent_failure_first_exit(agent_t *ag) {
    int usage = first_exit(ag->fails, ag->nfails);
    if (ag->rz) { /* every node's failures: another node's worker may have refused */
        char *jsonl = NULL;
        if (dt_rdzv_get_failures(ag->rz, &jsonl) == DT_STATUS_OK && jsonl && *jsonl) {
            failure_t *remote = NULL;
            int nr = parse_failures(jsonl, &remote);
            if (nr > 0) usage = first_exit(remote, nr);
            dt_agent_failures_free(remote, nr);
        }
        free(jsonl);
    }
    return usage;
}
