/*
 * flight.c - the communicator's flight recorder (flight.h): the process's ring,
 * in a file the agent can map or in anonymous memory, and the hooks comm.c
 * calls when an op is issued, starts and ends. The same hooks give the job
 * timeline (common/trace.h) each op's span when log.trace is on.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/trace.h"
#include "runtime/comm/comm_impl.h"
#include "runtime/comm/flight.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static dt_flight_ring_t *g_ring;
static int g_skip_rank = -1;
static uint64_t g_skip_seq;
static _Atomic int g_skipped;

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return *end == 0 && x >= INT_MIN && x <= INT_MAX ? (int)x : dflt;
}

/* The ring file's path (flight.h), or "" for anonymous memory. */
static void ring_path(char *buf, size_t len) {
    buf[0] = 0;
    const char *f = getenv("DTRUN_FLIGHT_FILE");
    if (f && *f) {
        snprintf(buf, len, "%s", f);
        return;
    }
    const char *dir = getenv("DTRUN_RUN_DIR"), *rank = getenv("RANK");
    if (dir && *dir && rank && *rank)
        snprintf(buf, len, "%s/attempt_%d/%s/flight.ring", dir, env_int("TORCHELASTIC_RESTART_COUNT", 0), rank);
}

static void ring_setup(void) {
    const char *hook = getenv("DTRUN_TEST_SKIP_COLLECTIVE");
    if (hook && *hook && sscanf(hook, "%d:%" SCNu64, &g_skip_rank, &g_skip_seq) != 2) {
        DT_LOG_WARN("DTRUN_TEST_SKIP_COLLECTIVE=\"%s\": expected RANK:SEQ; ignored", hook);
        g_skip_rank = -1;
    }
    int slots = env_int("DTRUN_FLIGHT_SLOTS", (int)DT_FLIGHT_DEFAULT_SLOTS);
    if (slots <= 0) return;
    if ((unsigned)slots > DT_FLIGHT_MAX_SLOTS) slots = (int)DT_FLIGHT_MAX_SLOTS;
    size_t bytes = dt_flight_ring_bytes((uint32_t)slots);
    char path[PATH_MAX];
    ring_path(path, sizeof path);
    void *p = MAP_FAILED;
    if (path[0]) {
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd >= 0 && ftruncate(fd, (off_t)bytes) == 0)
            p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            DT_LOG_WARN("flight recorder: cannot map %s (%s); keeping the ring in memory", path, strerror(errno));
        if (fd >= 0) close(fd);
    }
    if (p == MAP_FAILED) p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    g_ring = p;
    dt_flight_ring_init(g_ring, (uint32_t)slots, env_int("RANK", -1), (int)getpid());
}

dt_flight_ring_t *dt_comm_flight_ring(void) {
    pthread_once(&g_once, ring_setup);
    return g_ring;
}

static int peer_of(const dt_comm_t *comm, const dt_comm_req_t *req) {
    if ((req->op_ == DT_COMM_OP_SEND || req->op_ == DT_COMM_OP_RECV) && comm->size == 2)
        return comm->members[1 - comm->rank];
    return -1;
}

void dt_comm_flight_issue_(dt_comm_t *comm, dt_comm_req_t *req) {
    dt_flight_ring_t *ring = dt_comm_flight_ring();
    req->flight_ = 0;
    req->trace_issue_ns_ = req->trace_start_ns_ = dt_trace_on() ? dt_now_ns() : 0;
    if (!ring) return;
    int peer = peer_of(comm, req);
    req->flight_ = dt_flight_ring_add(ring, comm->id, dt_comm_op_name(req->op_), dt_comm_dtype_name(req->dtype_),
                                      req->seq_, req->count_, peer);
}

/* The op's span on the timeline: from its start (its issue when it never
 * started: a trivial op) to now. */
static void trace_op(const dt_comm_req_t *req, dt_flight_state_t state) {
    const dt_comm_t *comm = req->comm_;
    dt_trace_rec s = {.t1_ns = dt_now_ns(), .queued_ns = req->trace_issue_ns_, .seq = req->seq_,
                       .count = req->count_, .peer = comm ? peer_of(comm, req) : -1, .cat = DT_TRACE_OP,
                       .p2p = comm && comm->channel, .elem_bytes = (uint8_t)dt_comm_dtype_size(req->dtype_),
                       .failed = state == DT_FLIGHT_FAILED};
    s.t0_ns = req->trace_start_ns_ ? req->trace_start_ns_ : req->trace_issue_ns_;
    if (s.t1_ns < s.t0_ns) s.t1_ns = s.t0_ns;
    snprintf(s.name, sizeof s.name, "%s", dt_comm_op_name(req->op_));
    snprintf(s.dtype, sizeof s.dtype, "%s", dt_comm_dtype_name(req->dtype_));
    const char *id = comm ? comm->id : "?";
    size_t n = strnlen(id, sizeof s.comm - 1); /* ids are short ("0.s1.2"); a longer one is cut */
    memcpy(s.comm, id, n);
    s.comm[n] = 0;
    dt_trace_op(&s);
}

void dt_comm_flight_state_(dt_comm_req_t *req, dt_flight_state_t state) {
    if (g_ring && req->flight_) dt_flight_ring_set_state(g_ring, req->flight_, state);
    if (!dt_trace_on() || !req->trace_issue_ns_) return;
    if (state == DT_FLIGHT_STARTED) req->trace_start_ns_ = dt_now_ns();
    else if (state == DT_FLIGHT_DONE || state == DT_FLIGHT_FAILED) {
        trace_op(req, state);
        req->trace_issue_ns_ = 0; /* once: a watchdog's failure and the wait's both end it */
    }
}

int dt_comm_flight_skip_(dt_comm_t *comm, const dt_comm_req_t *req) {
    pthread_once(&g_once, ring_setup);
    if (g_skip_rank < 0 || comm->global_rank != g_skip_rank || strcmp(comm->id, "0") != 0) return 0;
    if (comm->seq + 1 != g_skip_seq || atomic_exchange(&g_skipped, 1)) return 0;
    DT_LOG_WARN("test hook DTRUN_TEST_SKIP_COLLECTIVE: rank %d skips %s #%" PRIu64 " of communicator 0",
                comm->global_rank, dt_comm_op_name(req->op_), g_skip_seq);
    return 1;
}
