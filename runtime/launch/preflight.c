/*
 * preflight.c - before a round's workers start, the agents check that the job can
 * work, in seconds, and refuse it on every node naming the node and the difference:
 *
 *   1. agreement: each agent SETs pf/desc/<node> (under the round's keys, through the
 *      same store and token as the rendezvous): dtrun's version and build, the launch
 *      flags that must agree, and what the launcher gave it (spec->preflight_desc: the
 *      resolved config minus the per-node keys, the data's and weights' identity), plus
 *      "@" lines that are this node's own (address, CPU slots, memory, GPUs). Every
 *      agent reads every record and compares each node's lines with node 0's: all of
 *      them find the same differences and exit 2 with the same lines.
 *   2. reachability: each agent listens on the address its workers' collectives will
 *      use (DTRUN_COMM_ADDR, else the local address of the route to the store's host,
 *      as comm_tcp.c does) and every agent connects to every other one, all at once,
 *      PF_TRIES tries of PF_CONNECT_S each. The listener answers each connection with
 *      its wall clock, so the same connection gives the clock offset (midpoint of the
 *      round trip). Each agent SETs pf/reach/<node>: the pairs it could not open and
 *      its offset to node 0; a pair that cannot connect is exit 3 on every node.
 *   3. warnings: a clock more than PF_CLOCK_WARN_S off node 0's, fewer CPU slots than
 *      --nproc_per_node on a CPU run, less memory than the node's ranks need, GPU
 *      counts that differ between nodes.
 *
 * `dtrun check` runs the same and prints a table per node (dt_agent_preflight_table).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fs.h"      /* defines: dt_fs_printable */
#include "common/gpuinfo.h" /* defines: dt_gpuinfo_count */
#include "common/log.h"
#include "common/mem.h"
#include "common/meminfo.h" /* defines: dt_meminfo_host_available, dt_meminfo_cpus */
#include "common/sha256.h"
#include "runtime/launch/agent_impl.h"

#define PF_TRIES 2           /* connection tries per pair */
#define PF_CONNECT_S 2.0     /* each try's bound */
#define PF_WAIT_S 15.0       /* for the other nodes' records (they come in milliseconds) */
#define PF_CLOCK_WARN_S 5.0  /* a clock further off node 0's is a warning */
#define PF_MAX_LINES 12      /* difference lines printed before "and N more" */
#define KEY_MAX 512

/* ---- the records ---------------------------------------------------------- */

typedef struct line {
    const char *key, *val; /* into the record's text, NUL-terminated there */
} line_t;

typedef struct record {
    char *text; /* as posted, split in place */
    line_t *lines;
    int n;
} record_t;

static void record_parse(record_t *r, const void *val, size_t len) {
    r->text = dt_xmalloc(len + 1);
    memcpy(r->text, val, len);
    r->text[len] = '\0';
    int cap = 16;
    r->lines = dt_xmalloc((size_t)cap * sizeof *r->lines);
    r->n = 0;
    for (char *p = r->text; *p;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        char *tab = strchr(p, '\t');
        if (tab) {
            *tab = '\0';
            if (r->n == cap) r->lines = dt_xrealloc(r->lines, (size_t)(cap *= 2) * sizeof *r->lines);
            r->lines[r->n++] = (line_t){p, tab + 1};
        }
        if (!nl) break;
        p = nl + 1;
    }
}

static void record_free(record_t *r) {
    free(r->text);
    free(r->lines);
}

static const char *record_get(const record_t *r, const char *key) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->lines[i].key, key)) return r->lines[i].val;
    return NULL;
}

static void pf_key(const agent_t *ag, char *buf, const char *what, int node) {
    snprintf(buf, KEY_MAX, "/dtrun/%s/r%d/pf/%s/%d", ag->rz->run_id, ag->rz->round, what, node);
}

static const char *mode_name(const dt_launch_spec_t *sp) {
    switch (sp->mode) {
    case DT_LAUNCH_MODE_CONFIG: return "the built-in trainer (CONFIG.json)";
    case DT_LAUNCH_MODE_EXEC: return "--exec";
    case DT_LAUNCH_MODE_BENCH_COMM: return "bench comm";
    case DT_LAUNCH_MODE_CHECK: return "check (no config)";
    }
    return "?";
}

/* The token's identity: a digest of its key (itself a digest of the secret), never
 * the secret; "(none)" without a token. */
static void token_identity(const dt_launch_spec_t *sp, char *out, size_t len) {
    if (!sp->have_token) {
        snprintf(out, len, "(none)");
        return;
    }
    uint8_t d[DT_SHA256_BYTES];
    dt_hmac_sha256("dtrun preflight token identity", 30, sp->token.key, sizeof sp->token.key, d);
    snprintf(out, len, "%02x%02x%02x%02x%02x%02x", d[0], d[1], d[2], d[3], d[4], d[5]);
}

/* This node's record (malloc'ed). addr: "ADDR PORT" of its probe listener, or why
 * there is none. */
static char *own_record(agent_t *ag, const char *addr) {
    const dt_launch_spec_t *sp = ag->spec;
    const char *what = NULL;
    double mem = dt_meminfo_host_available(&what);
    const char *build = getenv("DTRUN_TEST_BUILD_ID"); /* a test facility: inert unless set */
    char tok[32];
    token_identity(sp, tok, sizeof tok);
    size_t cap = 4096 + 8192 + (sp->preflight_desc ? strlen(sp->preflight_desc) : 0);
    char *r = dt_xmalloc(cap);
    int n = snprintf(r, cap,
                     "@host\t%s\n@addr\t%s\n@slots\t%d\n@mem\t%.0f\n@need_mem\t%.0f\n@gpus\t%d\n@nproc\t%d\n"
                     "@cpu_run\t%d\n@nproc_given\t%d\n"
                     "dtrun.version\t%s\ndtrun.build\t%s\nlaunch.mode\t%s\nlaunch.check_only\t%s\n"
                     "--max_restarts\t%d\n--rdzv_conf heartbeat_interval\t%g\n"
                     "--rdzv_conf last_call_timeout\t%g\n--rdzv_conf token_file (identity)\t%s\n"
                     "--preflight_min_busbw\t%g\n",
                     ag->host, addr, dt_meminfo_cpus() /* the slots of a CPU run: its affinity mask */, mem, sp->preflight_mem_need, dt_gpuinfo_count(),
                     sp->nproc_per_node, sp->preflight_cpu, !strcmp(sp->nproc_source, "N"), DT_VERSION,
                     build && *build ? build : DT_GIT_REV, mode_name(sp), sp->check_only ? "yes" : "no",
                     sp->max_restarts, sp->heartbeat_s, sp->last_call_s, tok, sp->preflight_min_busbw);
    if (n < 0 || (size_t)n >= cap) n = (int)cap - 1; /* (host and addr are bounded: never) */
    /* the built-in trainer resolves the config for nnodes x nproc_per_node ranks */
    if (sp->mode == DT_LAUNCH_MODE_CONFIG && (size_t)n < cap)
        n += snprintf(r + n, cap - (size_t)n, "--nproc_per_node\t%d\n", sp->nproc_per_node);
    if (n < 0 || (size_t)n >= cap) n = (int)cap - 1;
    n += (int)dt_pf_gpu_record(sp, r + n, 8192 < cap - (size_t)n ? 8192 : cap - (size_t)n);
    if (sp->preflight_desc) snprintf(r + n, cap - (size_t)n, "%s", sp->preflight_desc);
    return r;
}

/* ---- the probe listener --------------------------------------------------- */

typedef struct probe {
    int lfd;
    int stop[2];
    pthread_t thread;
    int running;
    char addr[NI_MAXHOST];
    int port;
    double skew; /* DTRUN_TEST_CLOCK_SKEW seconds added to the clock it answers with */
} probe_t;

/* Answers every connection with this node's wall clock ("%.6f\n") and closes it. */
static void *probe_main(void *arg) {
    probe_t *p = arg;
    for (;;) {
        struct pollfd fds[2] = {{p->lfd, POLLIN, 0}, {p->stop[0], POLLIN, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[1].revents) break;
        if (!fds[0].revents) continue;
        int fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        char b[64];
        int n = snprintf(b, sizeof b, "%.6f\n", dt_wall_s() + p->skew);
        ssize_t w = write(fd, b, (size_t)n);
        (void)w;
        close(fd);
    }
    return NULL;
}

/* The address this node's workers will be reached on (comm_tcp.c's rule). */
static dt_status_t comm_addr(agent_t *ag, char *out, size_t len) {
    const char *env = getenv("DTRUN_COMM_ADDR");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return DT_STATUS_OK;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", ag->master_port > 0 ? ag->master_port : 1);
    int e = getaddrinfo(ag->master_addr, ps, &hints, &ai);
    if (e) return dt_error(DT_STATUS_RENDEZVOUS, "cannot resolve the store's host %s: %s", ag->master_addr, gai_strerror(e));
    dt_status_t st = DT_STATUS_OK;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)len, NULL, 0, NI_NUMERICHOST) != 0)
        st = dt_error(DT_STATUS_RENDEZVOUS, "no route to the store's host %s: %s", ag->master_addr, strerror(errno));
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return st;
}

static dt_status_t probe_start(agent_t *ag, probe_t *p) {
    memset(p, 0, sizeof *p);
    p->lfd = p->stop[0] = p->stop[1] = -1;
    const char *skew = getenv("DTRUN_TEST_CLOCK_SKEW"); /* a test facility: inert unless set */
    p->skew = skew && *skew ? atof(skew) : 0;
    DT_CHECK(comm_addr(ag, p->addr, sizeof p->addr));
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICHOST}, *ai = NULL;
    int e = getaddrinfo(p->addr, "0", &hints, &ai);
    if (e) return dt_error(DT_STATUS_RENDEZVOUS, "the collectives' address %s: %s", p->addr, gai_strerror(e));
    dt_status_t st = DT_STATUS_OK;
    p->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (p->lfd < 0 || bind(p->lfd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(p->lfd, SOMAXCONN) != 0) {
        st = dt_error(DT_STATUS_RENDEZVOUS, "cannot listen on %s (the collectives' address): %s", p->addr, strerror(errno));
        goto out_free_ai;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char port[16];
    getsockname(p->lfd, (struct sockaddr *)&ss, &sl);
    getnameinfo((struct sockaddr *)&ss, sl, NULL, 0, port, sizeof port, NI_NUMERICSERV);
    p->port = atoi(port);
    if (pipe2(p->stop, O_CLOEXEC) != 0 || pthread_create(&p->thread, NULL, probe_main, p) != 0) {
        st = dt_error(DT_STATUS_SYS, "preflight: cannot start the probe listener: %s", strerror(errno));
        goto out_free_ai;
    }
    p->running = 1;
out_free_ai:
    freeaddrinfo(ai);
    return st;
}

static void probe_stop(probe_t *p) {
    if (p->running) {
        ssize_t w = write(p->stop[1], "x", 1);
        (void)w;
        pthread_join(p->thread, NULL);
        p->running = 0;
    }
    if (p->lfd >= 0) close(p->lfd);
    if (p->stop[0] >= 0) close(p->stop[0]);
    if (p->stop[1] >= 0) close(p->stop[1]);
    p->lfd = p->stop[0] = p->stop[1] = -1;
}

/* ---- connecting to every peer --------------------------------------------- */

typedef struct peer {
    int node;
    char addr[NI_MAXHOST];
    int port; /* 0: the peer has no listener (addr says why) */
    int fd;
    int state; /* 0 to try, 1 connecting, 2 reading, 3 done, 4 failed this try */
    double t_start, rtt, offset;
    char why[160];
    char got[64];
    size_t ngot;
} peer_t;

static void peer_fail(peer_t *p, const char *why) {
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    p->state = 4;
    snprintf(p->why, sizeof p->why, "%s", why);
}

static void peer_begin(peer_t *p) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", p->port);
    p->fd = -1;
    p->ngot = 0;
    if (getaddrinfo(p->addr, ps, &hints, &ai) != 0) {
        peer_fail(p, "not a numeric address");
        return;
    }
    p->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    p->t_start = dt_wall_s();
    if (p->fd < 0) {
        peer_fail(p, strerror(errno));
    } else if (connect(p->fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        p->state = 2;
    } else if (errno == EINPROGRESS) {
        p->state = 1;
    } else {
        peer_fail(p, strerror(errno));
    }
    freeaddrinfo(ai);
}

/* Every peer with a listener, all at once, PF_TRIES tries of PF_CONNECT_S each: the
 * connection opens and the peer's clock line arrives. */
static void connect_peers(peer_t *ps, int n) {
    for (int t = 0; t < PF_TRIES; t++) {
        int left = 0;
        for (int i = 0; i < n; i++)
            if (ps[i].port > 0 && ps[i].state != 3) {
                ps[i].state = 0;
                peer_begin(&ps[i]);
                left++;
            }
        if (!left) return;
        double end = dt_now_s() + PF_CONNECT_S;
        struct pollfd *fds = dt_xcalloc((size_t)n, sizeof *fds);
        for (;;) {
            int k = 0;
            for (int i = 0; i < n; i++) {
                fds[i].fd = (ps[i].state == 1 || ps[i].state == 2) ? ps[i].fd : -1;
                fds[i].events = ps[i].state == 1 ? POLLOUT : POLLIN;
                fds[i].revents = 0;
                k += fds[i].fd >= 0;
            }
            double now = dt_now_s();
            if (!k || now >= end) break;
            int r = poll(fds, (nfds_t)n, (int)((end - now) * 1000) + 1);
            if (r < 0 && errno != EINTR) break;
            for (int i = 0; i < n && r > 0; i++) {
                peer_t *p = &ps[i];
                if (fds[i].fd < 0 || !fds[i].revents) continue;
                if (p->state == 1) {
                    int err = 0;
                    socklen_t el = sizeof err;
                    getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &el);
                    if (err) peer_fail(p, strerror(err));
                    else p->state = 2;
                    continue;
                }
                ssize_t got = read(p->fd, p->got + p->ngot, sizeof p->got - 1 - p->ngot);
                if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                if (got > 0) p->ngot += (size_t)got;
                p->got[p->ngot] = '\0';
                if (got > 0 && !strchr(p->got, '\n') && p->ngot < sizeof p->got - 1) continue;
                if (!strchr(p->got, '\n')) {
                    peer_fail(p, got == 0 ? "closed without answering (is it a dtrun agent?)" : strerror(errno));
                    continue;
                }
                double t_end = dt_wall_s();
                p->rtt = t_end - p->t_start;
                p->offset = atof(p->got) - (p->t_start + t_end) / 2;
                close(p->fd);
                p->fd = -1;
                p->state = 3;
            }
        }
        free(fds);
        for (int i = 0; i < n; i++) {
            peer_t *p = &ps[i];
            if (p->state == 1) peer_fail(p, "connection timed out");
            else if (p->state == 2) peer_fail(p, "connected, but no answer came");
        }
        if (t + 1 < PF_TRIES) { /* a refusal returns at once: give the peer a moment */
            int refused = 0;
            for (int i = 0; i < n; i++) refused |= ps[i].state == 4 && strstr(ps[i].why, "refused") != NULL;
            if (refused) dt_sleep_ms(200);
        }
    }
}

/* ---- the comparison and the table ----------------------------------------- */

static int is_data_key(const char *k) {
    return strstr(k, " file") != NULL || !strncmp(k, "model.pretrained (", 18);
}

static int is_launch_key(const char *k) {
    return !strncmp(k, "dtrun.", 6) || !strncmp(k, "launch.", 7) || !strncmp(k, "--", 2);
}

/* The differences of node i's record from node 0's, one line each into out
 * ("node 1 (127.0.0.3): optimizer.params.lr is 0.01, node 0 has 0.001"); returns
 * their count; *first_key (may be NULL) the first differing key. */
static int compare(const record_t *r0, const record_t *ri, int node, char *out, size_t len, size_t *o,
                   int *printed, const char **first_key) {
    int diffs = 0;
    const char *host = record_get(ri, "@host");
    char shown_host[300];
    dt_fs_printable(host ? host : "?", shown_host, sizeof shown_host);
    if (first_key) *first_key = NULL;
    for (int pass = 0; pass < 2; pass++) {
        const record_t *a = pass ? ri : r0, *b = pass ? r0 : ri;
        for (int k = 0; k < a->n; k++) {
            const char *key = a->lines[k].key;
            if (key[0] == '@') continue;
            const char *vb = record_get(b, key);
            if (pass && vb) continue; /* compared in the first pass */
            const char *v0 = pass ? vb : a->lines[k].val, *vi = pass ? a->lines[k].val : vb;
            if (v0 && vi && !strcmp(v0, vi)) continue;
            diffs++;
            if (first_key && !*first_key) *first_key = key;
            if (*printed >= PF_MAX_LINES) continue;
            char sk[300], s0[600], si[600];
            dt_fs_printable(key, sk, sizeof sk);
            dt_fs_printable(vi ? vi : "(not set)", si, sizeof si);
            dt_fs_printable(v0 ? v0 : "(not set)", s0, sizeof s0);
            if (*o + 100 < len)
                *o += (size_t)snprintf(out + *o, len - *o, "dtrun: error: node %d (%s): %s is %s, node 0 has %s\n", node,
                                       shown_host, sk, si, s0);
            (*printed)++;
        }
    }
    return diffs;
}

/* First 8 hex digits of the digest of a record's lines that pass keep(). */
static void digest(const record_t *r, int (*keep)(const char *), char *out) {
    dt_sha256_ctx c;
    dt_sha256_init(&c);
    int any = 0;
    for (int k = 0; k < r->n; k++) {
        const char *key = r->lines[k].key;
        if (key[0] == '@' || !keep(key)) continue;
        dt_sha256_update(&c, key, strlen(key) + 1);
        dt_sha256_update(&c, r->lines[k].val, strlen(r->lines[k].val) + 1);
        any = 1;
    }
    uint8_t d[DT_SHA256_BYTES];
    dt_sha256_final(&c, d);
    if (any) snprintf(out, 9, "%02x%02x%02x%02x", d[0], d[1], d[2], d[3]);
    else snprintf(out, 9, "-");
}

static int config_key(const char *k) { return !is_data_key(k) && !is_launch_key(k); }

/* What the preflight found, per node, for the table and the verdict. */
typedef struct verdict {
    int diffs;             /* keys that differ from node 0's */
    const char *first_key; /* the first of them */
    int unreachable;       /* peers this node could not connect to */
    char reach_note[200];  /* the first of them, "no: node 2" */
    int have_clock;
    double clock;          /* offset of node 0's clock from this node's (s) */
    char warn[5][640];     /* slots, memory, gpus, clock, GPU health: "" when fine */
    char gpu_err[600];     /* GPUs a rank must not use (exit 3) */
    char gpu_cell[64];     /* the table's "gpus" text */
} verdict_t;

static void fmt_bytes(double b, char *out, size_t len) {
    if (b <= 0) snprintf(out, len, "?");
    else if (b >= 1024.0 * 1024 * 1024) snprintf(out, len, "%.1f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) snprintf(out, len, "%.0f MiB", b / (1024.0 * 1024));
    else snprintf(out, len, "%.0f KiB", b / 1024.0);
}

static void print_table(record_t *recs, verdict_t *v, int n, double secs) {
    printf("preflight: %d node(s), %.3f s\n", n, secs);
    printf("%-4s  %-15s  %-26s  %-11s  %-20s  %-18s  %-10s  %-10s  %-24s  %s\n", "node", "address", "version",
           "config", "data", "reach", "clock", "slots", "memory", "gpus");
    for (int i = 0; i < n; i++) {
        record_t *r = &recs[i];
        const char *host = record_get(r, "@host");
        char sh[64], ver[80], cfgd[16], data[40], reach[40], clock[32], slots[40], mem[64], gpus[80], dd[16];
        dt_fs_printable(host ? host : "?", sh, sizeof sh);
        const char *vv = record_get(r, "dtrun.version"), *vb = record_get(r, "dtrun.build");
        snprintf(ver, sizeof ver, "%s (%.12s)", vv ? vv : "?", vb ? vb : "?");
        digest(r, config_key, cfgd);
        digest(r, is_data_key, dd);
        int data_diff = 0, cfg_diff = 0, ver_diff = 0;
        for (int k = 0; i > 0 && k < r->n; k++) {
            const char *key = r->lines[k].key, *v0;
            if (key[0] == '@') continue;
            if ((v0 = record_get(&recs[0], key)) && !strcmp(v0, r->lines[k].val)) continue;
            if (is_data_key(key)) data_diff = 1;
            else if (!strncmp(key, "dtrun.", 6)) ver_diff = 1;
            else cfg_diff = 1;
        }
        if (ver_diff) snprintf(ver + strlen(ver), sizeof ver - strlen(ver), " DIFFERS");
        if (cfg_diff) snprintf(cfgd + strlen(cfgd), sizeof cfgd - strlen(cfgd), " !=");
        snprintf(data, sizeof data, "%s%s", dd, data_diff ? " DIFFERS" : strcmp(dd, "-") ? " ok" : "");
        if (v[i].unreachable) snprintf(reach, sizeof reach, "%.38s", v[i].reach_note);
        else if (n == 1) snprintf(reach, sizeof reach, "- (one node)");
        else snprintf(reach, sizeof reach, "ok (%d peer(s))", n - 1);
        double off = -v[i].clock; /* this node's clock minus node 0's */
        if (off > -0.0005 && off < 0.0005) off = 0;
        if (v[i].have_clock) snprintf(clock, sizeof clock, "%+.3f s%s", off, v[i].warn[3][0] ? " !" : "");
        else snprintf(clock, sizeof clock, "?");
        const char *s = record_get(r, "@slots"), *np = record_get(r, "@nproc");
        snprintf(slots, sizeof slots, "%s/%s%s", s ? s : "?", np ? np : "?", v[i].warn[0][0] ? " LOW" : " ok");
        const char *m = record_get(r, "@mem"), *need = record_get(r, "@need_mem");
        char ma[24], mn[24];
        fmt_bytes(m ? atof(m) : 0, ma, sizeof ma);
        if (need && atof(need) > 0) {
            fmt_bytes(atof(need), mn, sizeof mn);
            snprintf(mem, sizeof mem, "%s, needs %s%s", ma, mn, v[i].warn[1][0] ? " LOW" : "");
        } else {
            snprintf(mem, sizeof mem, "%s ok", ma);
        }
        const char *g = record_get(r, "@gpus");
        if (strcmp(v[i].gpu_cell, "-")) snprintf(gpus, sizeof gpus, "%s%s", v[i].gpu_cell, v[i].warn[4][0] ? " !" : "");
        else snprintf(gpus, sizeof gpus, "%s%s", g ? g : "?", v[i].warn[2][0] ? " !=" : "");
        printf("%-4d  %-15s  %-26s  %-11s  %-20s  %-18s  %-10s  %-10s  %-24s  %s\n", i, sh, ver, cfgd, data, reach,
               clock, slots, mem, gpus);
    }
    fflush(stdout);
}

/* Every node's record at key what/<node>, parsed into recs (n of them). */
static dt_status_t read_all(agent_t *ag, const char *what, int n, record_t *recs) {
    char(*names)[KEY_MAX] = dt_xmalloc((size_t)n * KEY_MAX);
    const char **keys = dt_xmalloc((size_t)n * sizeof *keys);
    void **vals = dt_xcalloc((size_t)n, sizeof *vals);
    size_t *lens = dt_xcalloc((size_t)n, sizeof *lens);
    for (int i = 0; i < n; i++) {
        pf_key(ag, names[i], what, i);
        keys[i] = names[i];
    }
    dt_status_t st = dt_store_wait(ag->rz->store, keys, (size_t)n, PF_WAIT_S);
    if (st == DT_STATUS_TIMEOUT) {
        int missing = -1;
        for (int i = 0; i < n && missing < 0; i++) {
            int ready = 0;
            if (dt_store_check(ag->rz->store, &keys[i], 1, &ready) == DT_STATUS_OK && !ready) missing = i;
        }
        char sh[300];
        st = dt_error(DT_STATUS_RENDEZVOUS, "preflight: node %d (%s) joined the rendezvous but posted no %s "
                      "record within %.0f s", missing, missing >= 0 ? dt_fs_printable(ag->rz->nodes[missing].host, sh, sizeof sh) : "?",
                      what, PF_WAIT_S);
    } else if (st == DT_STATUS_OK) {
        st = dt_store_multi_get(ag->rz->store, keys, (size_t)n, vals, lens);
        if (st != DT_STATUS_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", dt_error_detail());
            st = dt_error(DT_STATUS_RENDEZVOUS, "preflight: lost the rendezvous store at %s: %s", ag->rz->endpoint, why);
        }
        for (int i = 0; i < n && st == DT_STATUS_OK; i++) record_parse(&recs[i], vals[i], lens[i]);
    } else {
        char why[512];
        snprintf(why, sizeof why, "%s", dt_error_detail());
        st = dt_error(DT_STATUS_RENDEZVOUS, "preflight: lost the rendezvous store at %s: %s", ag->rz->endpoint, why);
    }
    for (int i = 0; i < n; i++) free(vals[i]);
    free(vals);
    free(lens);
    free(keys);
    free(names);
    return st;
}

/* The warnings of node i (slots, memory, GPUs against node 0's, clock). */
static const char *get_line(const void *rec, const char *key) { return record_get(rec, key); }

static void node_warnings(const record_t *recs, int i, verdict_t *v) {
    const record_t *r = &recs[i];
    dt_pf_gpu_judge(get_line, r, &recs[0], v->gpu_err, sizeof v->gpu_err, v->warn[4], sizeof v->warn[4],
                    v->gpu_cell, sizeof v->gpu_cell);
    const char *s = record_get(r, "@slots"), *np = record_get(r, "@nproc"), *cpu = record_get(r, "@cpu_run"),
               *given = record_get(r, "@nproc_given");
    if (s && np && cpu && given && atoi(cpu) && atoi(given) && atoi(s) < atoi(np))
        snprintf(v->warn[0], sizeof v->warn[0], "has %s CPU slot(s) for --nproc_per_node %s on a CPU run", s, np);
    const char *m = record_get(r, "@mem"), *need = record_get(r, "@need_mem");
    if (m && need && atof(need) > 0 && atof(m) > 0 && atof(m) < atof(need)) {
        char a[24], b[24];
        fmt_bytes(atof(m), a, sizeof a);
        fmt_bytes(atof(need), b, sizeof b);
        snprintf(v->warn[1], sizeof v->warn[1], "has %s of memory available, its ranks need %s", a, b);
    }
    const char *g = record_get(r, "@gpus"), *g0 = record_get(&recs[0], "@gpus");
    if (i > 0 && g && g0 && strcmp(g, g0))
        snprintf(v->warn[2], sizeof v->warn[2], "sees %s GPU(s), node 0 sees %s", g, g0);
    if (v->have_clock && (v->clock > PF_CLOCK_WARN_S || v->clock < -PF_CLOCK_WARN_S))
        snprintf(v->warn[3], sizeof v->warn[3], "clock is %+.1f s off node 0's (more than %.0f s: timeouts and log "
                 "times across nodes will not line up; is NTP running?)", -v->clock, PF_CLOCK_WARN_S);
}

dt_status_t dt_agent_preflight_skip(agent_t *ag) {
    if (!ag->rz) return DT_STATUS_OK;
    char k[KEY_MAX];
    pf_key(ag, k, "desc", ag->rz->node_rank);
    dt_status_t st = dt_store_set(ag->rz->store, k, "@skip\t1\n", 7);
    if (st != DT_STATUS_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", dt_error_detail());
        st = dt_error(DT_STATUS_RENDEZVOUS, "preflight: lost the rendezvous store at %s: %s", ag->rz->endpoint, why);
    }
    return st;
}

dt_status_t dt_agent_preflight(agent_t *ag) {
    const dt_launch_spec_t *sp = ag->spec;
    ag->preflight_off = 0;
    double t0 = dt_now_s();
    int n = ag->rz ? ag->rz->nnodes : 1, me = ag->rz ? ag->rz->node_rank : 0;
    dt_status_t st = DT_STATUS_OK;
    probe_t probe;
    memset(&probe, 0, sizeof probe);
    probe.lfd = probe.stop[0] = probe.stop[1] = -1;
    record_t *recs = dt_xcalloc((size_t)n, sizeof *recs), *reach = dt_xcalloc((size_t)n, sizeof *reach);
    verdict_t *v = dt_xcalloc((size_t)n, sizeof *v);
    peer_t *peers = dt_xcalloc((size_t)n, sizeof *peers);
    for (int i = 0; i < n; i++) peers[i].fd = -1;
    int have_reach = 0;
    char addr[NI_MAXHOST + 200];

    if (ag->rz) {
        if (probe_start(ag, &probe) == DT_STATUS_OK) {
            snprintf(addr, sizeof addr, "%s %d", probe.addr, probe.port);
        } else { /* the others are told, and stop too */
            snprintf(addr, sizeof addr, "- %s", dt_error_detail());
            dt_error_clear();
        }
    } else {
        snprintf(addr, sizeof addr, "- one node");
    }
    char *mine = own_record(ag, addr);
    if (!ag->rz) {
        record_parse(&recs[0], mine, strlen(mine));
    } else {
        char k[KEY_MAX];
        pf_key(ag, k, "desc", me);
        st = dt_store_set(ag->rz->store, k, mine, strlen(mine));
        if (st != DT_STATUS_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", dt_error_detail());
            st = dt_error(DT_STATUS_RENDEZVOUS, "preflight: lost the rendezvous store at %s: %s", ag->rz->endpoint, why);
            goto out_free;
        }
        DT_CHECK_GOTO(read_all(ag, "desc", n, recs), st, out_free);
    }

    /* a node launched with --no-preflight posted "skip": the job skips the checks */
    for (int i = 0; i < n; i++) {
        if (!record_get(&recs[i], "@skip")) continue;
        char sh[300];
        DT_LOG_WARN("preflight: node %d (%s) was launched with --no-preflight: no node checks the job "
                    "(give the same flag to every node)",
                    i, dt_fs_printable(ag->rz->nodes[i].host, sh, sizeof sh));
        ag->preflight_off = 1;
        goto out_free;
    }

    /* 1. agreement: every node compares every node with node 0, and finds the same */
    char msg[8192];
    size_t o = 0;
    int printed = 0, diffs = 0;
    for (int i = 1; i < n; i++) {
        v[i].diffs = compare(&recs[0], &recs[i], i, msg, sizeof msg, &o, &printed, &v[i].first_key);
        diffs += v[i].diffs;
    }
    if (diffs > printed && o + 100 < sizeof msg)
        o += (size_t)snprintf(msg + o, sizeof msg - o, "dtrun: error: ... and %d more difference(s)\n", diffs - printed);

    /* 2. reachability, unless the job is refused already (every node knows it) */
    if (ag->rz && (!diffs || sp->check_only)) {
        int np = 0;
        for (int i = 0; i < n; i++) {
            if (i == me) continue;
            peer_t *p = &peers[np++];
            p->node = i;
            p->fd = -1;
            const char *a = record_get(&recs[i], "@addr");
            if (a && a[0] != '-' && sscanf(a, "%1024s %d", p->addr, &p->port) == 2 && p->port > 0) continue;
            p->port = 0;
            snprintf(p->why, sizeof p->why, "it has no listener (%s)", a && a[0] == '-' ? a + 2 : "no address posted");
            p->state = 4;
        }
        connect_peers(peers, np);
        size_t cap = 256 + (size_t)np * 600, ro = 0;
        char *rrec = dt_xmalloc(cap);
        rrec[0] = '\0';
        for (int j = 0; j < np; j++) {
            peer_t *p = &peers[j];
            if (p->node == 0 && p->state == 3)
                ro += (size_t)snprintf(rrec + ro, cap - ro, "@clock\t%.6f\n", p->offset);
            if (p->state != 3)
            {
                char tries[64] = "";
                if (p->port > 0) snprintf(tries, sizeof tries, " (%d tries of %g s)", PF_TRIES, PF_CONNECT_S);
                ro += (size_t)snprintf(rrec + ro, cap - ro, "fail %d\t%s%s%s%d: %s%s\n", p->node,
                                       strchr(p->addr, ':') ? "[" : "", p->addr, strchr(p->addr, ':') ? "]:" : ":",
                                       p->port, p->why, tries);
            }
        }
        if (me == 0) ro += (size_t)snprintf(rrec + ro, cap - ro, "@clock\t0\n");
        if (ro == 0) snprintf(rrec, cap, "@ok\t1\n");
        char k[KEY_MAX];
        pf_key(ag, k, "reach", me);
        st = dt_store_set(ag->rz->store, k, rrec, strlen(rrec));
        free(rrec);
        if (st != DT_STATUS_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", dt_error_detail());
            st = dt_error(DT_STATUS_RENDEZVOUS, "preflight: lost the rendezvous store at %s: %s", ag->rz->endpoint, why);
            goto out_free;
        }
        /* every node's connections are over once every record is in: the listener may go */
        DT_CHECK_GOTO(read_all(ag, "reach", n, reach), st, out_free);
        have_reach = 1;
        probe_stop(&probe);
    }
    probe_stop(&probe);

    int unreachable = 0;
    char netmsg[4096];
    size_t no = 0;
    for (int i = 0; i < n; i++) {
        if (!have_reach) {
            v[i].have_clock = !ag->rz;
            node_warnings(recs, i, &v[i]);
            continue;
        }
        const char *c = record_get(&reach[i], "@clock");
        v[i].have_clock = c != NULL;
        v[i].clock = c ? atof(c) : 0;
        for (int k = 0; k < reach[i].n; k++) {
            int peer = -1;
            if (sscanf(reach[i].lines[k].key, "fail %d", &peer) != 1 || peer < 0 || peer >= n) continue;
            if (!v[i].unreachable++) snprintf(v[i].reach_note, sizeof v[i].reach_note, "no: node %d", peer);
            unreachable++;
            char s1[300], s2[300], sw[600];
            const char *h1 = record_get(&recs[i], "@host"), *h2 = record_get(&recs[peer], "@host");
            if (no + 200 < sizeof netmsg)
                no += (size_t)snprintf(netmsg + no, sizeof netmsg - no,
                                       "dtrun: error: node %d (%s) cannot reach node %d (%s) at %s\n", i,
                                       dt_fs_printable(h1 ? h1 : "?", s1, sizeof s1), peer,
                                       dt_fs_printable(h2 ? h2 : "?", s2, sizeof s2),
                                       dt_fs_printable(reach[i].lines[k].val, sw, sizeof sw));
        }
        node_warnings(recs, i, &v[i]);
    }
    double secs = dt_now_s() - t0;
    ag->preflight_s = secs;

    if (sp->check_only) print_table(recs, v, n, secs);
    for (int i = 0; i < n; i++)
        for (int w = 0; w < 5; w++)
            if (v[i].warn[w][0]) {
                const char *h = record_get(&recs[i], "@host");
                char sh[300];
                DT_LOG_WARN("preflight: node %d (%s) %s", i, dt_fs_printable(h ? h : "?", sh, sizeof sh), v[i].warn[w]);
            }
    int nodes_differ = 0, compared = 0, bad_gpus = 0;
    char gpumsg[4096];
    size_t go = 0;
    for (int i = 0; i < n; i++) {
        if (!v[i].gpu_err[0]) continue;
        bad_gpus++;
        const char *h = record_get(&recs[i], "@host");
        char sh[300];
        if (go + 200 < sizeof gpumsg)
            go += (size_t)snprintf(gpumsg + go, sizeof gpumsg - go, "dtrun: error: node %d (%s): %s\n", i,
                                   dt_fs_printable(h ? h : "?", sh, sizeof sh), v[i].gpu_err);
    }
    for (int i = 1; i < n; i++) nodes_differ += v[i].diffs > 0;
    for (int k = 0; k < recs[0].n; k++) compared += recs[0].lines[k].key[0] != '@';
    if (diffs) {
        fputs(msg, stderr);
        st = dt_error(DT_STATUS_CONFIG, "preflight: %d node(s) differ from node 0 in what must be equal on every "
                      "node (nothing was started; README \"Preflight\"; --no-preflight skips the check)",
                      nodes_differ);
    } else if (unreachable || bad_gpus) {
        if (unreachable) fputs(netmsg, stderr);
        if (bad_gpus) fputs(gpumsg, stderr);
        if (unreachable)
            st = dt_error(DT_STATUS_RENDEZVOUS, "preflight: %d connection(s) between nodes failed, on the address "
                          "and port each node's collectives would use (nothing was started; is a firewall in the "
                          "way?)", unreachable);
        else
            st = dt_error(DT_STATUS_RENDEZVOUS, "preflight: %d node(s) have a GPU their ranks must not use "
                          "(nothing was started; drain the node, or hide the GPU with CUDA_VISIBLE_DEVICES)",
                          bad_gpus);
    } else if (ag->rz) {
        DT_LOG_INFO("preflight: %d node(s) agree on %d key(s), every pair connects, store at %s (%.0f ms)", n,
                    compared, ag->rz->endpoint, secs * 1e3);
    }
out_free:
    probe_stop(&probe);
    free(mine);
    for (int i = 0; i < n; i++) {
        record_free(&recs[i]); /* (zeroed when never read) */
        record_free(&reach[i]);
        if (peers[i].fd >= 0) close(peers[i].fd);
    }
    free(recs);
    free(reach);
    free(v);
    free(peers);
    return st;
}
