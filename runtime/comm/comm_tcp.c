/*
 * comm_tcp.c - TCP ring backend: each rank sends to rank+1 and receives from
 * rank-1 over tcp_conns connections each way (TCP_NODELAY, non-blocking, one
 * poll loop driving sends and receives at once).
 *
 * Bootstrap: every rank listens on an ephemeral port of the address it is
 * reached on (DTRUN_COMM_ADDR / config, else the local address of the route to
 * the store's host: 127.0.0.1 for a loopback store) and publishes "addr port"
 * in the store; then connects to the next rank and accepts from the previous
 * one. A hello on each connection names rank and connection index.
 *
 * Every op starts with a 40-byte header to the next rank (op, seq, count, dtype,
 * reduction, root); a rank whose previous neighbour is in another op fails at
 * once with DT_STATUS_MISMATCH naming both. On a 2-rank point-to-point channel
 * (comm_p2p.c) a send meets a recv: their headers must agree on count and
 * dtype, then the payload goes as a broadcast from the sender (rank 0).
 *
 * Algorithms (n ranks, slices as in comm.h):
 *   all_reduce: ring reduce-scatter (n-1 steps) then ring all-gather (n-1 steps).
 *     At reduce-scatter step s rank r sends slice (r-s-1) mod n and receives
 *     slice (r-s-2) mod n, which it adds to its own as bytes arrive; after n-1
 *     steps it holds slice r reduced (in ring order r+1, r+2, ..., r+n), divides
 *     it for avg, and the all-gather circulates the reduced slices. Every step's
 *     bytes are striped over the tcp_conns connections.
 *   reduce_scatter: the first half. all_gather: n-1 forwarding steps.
 *   Steps are pipelined: on each connection, bytes of step s go out as soon as
 *   the same bytes of step s-1 arrived (the ring forwards what it received).
 *   broadcast: a chain from the root, pipelined in chunks.
 *   bf16: partial sums travel as fp32 (inputs are widened first, so the sum
 *   is rounded once, as comm.h promises); final values travel as bf16: the
 *   all-gather half of a bf16 all_reduce (each rank rounds its reduced slice,
 *   then gathers), all_gather and broadcast. A bf16 all_reduce puts
 *   6(n-1)/n bytes per element on each link instead of 8(n-1)/n.
 *
 * Knobs (environment): DTRUN_COMM_TCP_CONNS (connections per neighbour, 1..8,
 * default 1: on loopback with 2 cores more did not measurably help),
 * DTRUN_COMM_TCP_SPIN_US (poll without sleeping this long before blocking,
 * default 200), DTRUN_COMM_TCP_BUF (SO_SNDBUF/SO_RCVBUF bytes; default: the
 * kernel's autotuning).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/meminfo.h" /* defines: dt_meminfo_cpus */
#include "runtime/comm/comm_impl.h"

#define TCP_MAX_CONNS 8
#define TCP_HELLO_MAGIC 0x64747470u /* "dttp" */
#define TCP_OP_MAGIC 0x6474636fu    /* "dtco" */
#define TCP_BCAST_CHUNK (512u * 1024u)
#define TCP_STAGE_BYTES (256u * 1024u) /* per connection; a multiple of 4 */

typedef struct tcp_be {
    int n, r, nconn;
    int next[TCP_MAX_CONNS]; /* to rank r+1 */
    int prev[TCP_MAX_CONNS]; /* from rank r-1 */
    float *work, *stage;
    size_t work_cap, stage_cap; /* in floats */
    uint64_t spin_ns; /* poll without sleeping this long before blocking */
    int oversub;      /* more ranks than CPUs on this host: yield while spinning */
} tcp_be_t;

typedef struct op_header {
    uint32_t magic, op, dtype, redop;
    uint64_t seq, count;
    int32_t root;
    uint32_t pad;
} op_header_t;

/* ---- bootstrap ----------------------------------------------------------------- */

/* The local address used to reach host (no packet is sent). */
static dt_status_t route_addr(const char *host, int port, char *out, size_t len) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_DGRAM;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int e = getaddrinfo(host, ps, &hints, &ai);
    if (e) return dt_error(DT_STATUS_CONFIG, "tcp comm: cannot resolve store host %s: %s", host, gai_strerror(e));
    dt_status_t st = DT_STATUS_OK;
    int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        st = dt_error(DT_STATUS_SYS, "tcp comm: no route to %s: %s", host, strerror(errno));
    } else if (getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)len, NULL, 0, NI_NUMERICHOST) != 0) {
        st = dt_error(DT_STATUS_SYS, "tcp comm: cannot name the local address towards %s", host);
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return st;
}

static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const char *b = getenv("DTRUN_COMM_TCP_BUF");
    if (b && atoi(b) > 0) {
        int sz = atoi(b);
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
    }
}

static dt_status_t io_full(int fd, void *buf, size_t n, int is_send, double deadline, const char *what) {
    uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t k = is_send ? send(fd, p + done, n - done, MSG_NOSIGNAL) : recv(fd, p + done, n - done, 0);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k == 0) return dt_error(DT_STATUS_CLOSED, "tcp comm: %s: connection closed", what);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return dt_error(dt_status_from_errno(errno), "tcp comm: %s: %s", what, strerror(errno));
        if (dt_now_s() > deadline) return dt_error(DT_STATUS_TIMEOUT, "tcp comm: %s: timed out", what);
        struct pollfd pf = {fd, (short)(is_send ? POLLOUT : POLLIN), 0};
        poll(&pf, 1, 100);
    }
    return DT_STATUS_OK;
}

static void tcp_free(dt_comm_t *comm) {
    tcp_be_t *be = comm->be;
    if (!be) return;
    for (int k = 0; k < TCP_MAX_CONNS; k++) {
        if (be->next[k] >= 0) close(be->next[k]);
        if (be->prev[k] >= 0) close(be->prev[k]);
    }
    dt_mem_free(be->work);
    dt_mem_free(be->stage);
    free(be);
    comm->be = NULL;
}

static dt_status_t connect_next(dt_comm_t *comm, tcp_be_t *be, const char *host, const char *port, int k,
                                double deadline) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    int e = getaddrinfo(host, port, &hints, &ai);
    if (e) return dt_error(DT_STATUS_PROTOCOL, "tcp comm: bad peer address %s:%s: %s", host, port, gai_strerror(e));
    int fd = -1;
    dt_status_t st = DT_STATUS_OK;
    for (;;) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        int err = errno;
        if (fd >= 0) close(fd);
        fd = -1;
        if (dt_now_s() > deadline || (err != ECONNREFUSED && err != EINTR)) {
            st = dt_error(DT_STATUS_REFUSED, "tcp comm: rank %d cannot connect to rank %d at %s:%s: %s", comm->rank,
                          (comm->rank + 1) % comm->size, host, port, strerror(err));
            break;
        }
        dt_sleep_ms(20);
    }
    freeaddrinfo(ai);
    if (st != DT_STATUS_OK) return st;
    tune(fd);
    uint32_t hello[3] = {TCP_HELLO_MAGIC, (uint32_t)comm->rank, (uint32_t)k};
    st = io_full(fd, hello, sizeof(hello), 1, deadline, "hello");
    if (st != DT_STATUS_OK) {
        close(fd);
        return st;
    }
    be->next[k] = fd;
    return DT_STATUS_OK;
}

static dt_status_t tcp_init(dt_comm_t *comm) {
    dt_status_t st = DT_STATUS_OK;
    tcp_be_t *be = dt_xcalloc(1, sizeof(*be));
    comm->be = be;
    be->n = comm->size;
    be->r = comm->rank;
    be->nconn = comm->tcp_conns >= 1 && comm->tcp_conns <= TCP_MAX_CONNS ? comm->tcp_conns : 1;
    for (int k = 0; k < TCP_MAX_CONNS; k++) be->next[k] = be->prev[k] = -1;
    const char *spin = getenv("DTRUN_COMM_TCP_SPIN_US");
    be->spin_ns = (uint64_t)(spin && *spin ? atof(spin) : 200.0) * 1000u;
    int ncpu = dt_meminfo_cpus(); /* the job's cpuset, not every CPU online */
    be->oversub = comm->local_world_size > ncpu;

    char addr[NI_MAXHOST];
    if (comm->tcp_addr)
        snprintf(addr, sizeof(addr), "%s", comm->tcp_addr);
    else
        DT_CHECK(route_addr(comm->store_host, comm->store_port, addr, sizeof(addr)));

    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
    int e = getaddrinfo(addr, "0", &hints, &ai);
    if (e) return dt_error(DT_STATUS_CONFIG, "tcp comm: address \"%s\" (DTRUN_COMM_ADDR?): %s", addr, gai_strerror(e));
    int lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(lfd, 64) != 0) {
        st = dt_error(DT_STATUS_SYS, "tcp comm: cannot listen on %s: %s", addr, strerror(errno));
        freeaddrinfo(ai);
        if (lfd >= 0) close(lfd);
        return st;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char port[16];
    getsockname(lfd, (struct sockaddr *)&ss, &sl);
    getnameinfo((struct sockaddr *)&ss, sl, NULL, 0, port, sizeof(port), NI_NUMERICSERV);
    char me[NI_MAXHOST + 32];
    snprintf(me, sizeof(me), "%s %s", addr, port);
    DT_CHECK_GOTO(dt_comm_kv_set_(comm, me, strlen(me), "tcp/%d", comm->rank), st, out_close_listen);

    int nxt = (be->r + 1) % be->n;
    char *peer = NULL;
    DT_CHECK_GOTO(dt_comm_kv_get_(comm, &peer, NULL, "tcp/%d", nxt), st, out_close_listen);
    char phost[NI_MAXHOST], pport[16];
    if (sscanf(peer, "%1024s %15s", phost, pport) != 2) {
        st = dt_error(DT_STATUS_PROTOCOL, "tcp comm: malformed address of rank %d: \"%s\"", nxt, peer);
        free(peer);
        goto out_close_listen;
    }
    free(peer);
    double deadline = dt_now_s() + (comm->timeout_s < 60 ? 60 : comm->timeout_s);
    for (int k = 0; k < be->nconn; k++) DT_CHECK_GOTO(connect_next(comm, be, phost, pport, k, deadline), st, out_close_listen);
    int prv = (be->r - 1 + be->n) % be->n;
    for (int got = 0; got < be->nconn;) {
        struct pollfd pf = {lfd, POLLIN, 0};
        if (poll(&pf, 1, 200) <= 0) {
            if (dt_now_s() > deadline) {
                st = dt_error(DT_STATUS_TIMEOUT, "tcp comm: rank %d: rank %d did not connect", be->r, prv);
                goto out_close_listen;
            }
            continue;
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        tune(fd);
        uint32_t hello[3];
        st = io_full(fd, hello, sizeof(hello), 0, deadline, "hello");
        if (st != DT_STATUS_OK || hello[0] != TCP_HELLO_MAGIC || (int)hello[1] != prv || hello[2] >= (uint32_t)be->nconn ||
            be->prev[hello[2]] >= 0) {
            close(fd);
            st = DT_STATUS_OK; /* not our peer: ignore it */
            continue;
        }
        be->prev[hello[2]] = fd;
        got++;
    }
    for (int k = 0; k < be->nconn; k++) {
        fcntl(be->next[k], F_SETFL, fcntl(be->next[k], F_GETFL) | O_NONBLOCK);
        fcntl(be->prev[k], F_SETFL, fcntl(be->prev[k], F_GETFL) | O_NONBLOCK);
    }
out_close_listen:
    close(lfd);
    return st;
}

/* ---- the progress engine --------------------------------------------------------- */

typedef void (*arrived_fn)(void *arg, size_t lo, size_t hi); /* bytes [lo, hi) of the recv buffer */

/* Part k of nbytes over nconn connections, aligned to align bytes. */
static void part(size_t nbytes, int nconn, int k, size_t align, size_t *lo, size_t *hi) {
    size_t units = nbytes / align;
    size_t a = dt_comm_slice_offset(units, nconn, k) * align, b = a + dt_comm_slice_count(units, nconn, k) * align;
    if (k == nconn - 1) b = nbytes;
    *lo = a;
    *hi = b;
}

/* Sends sbytes of sbuf to the next rank while receiving rbytes into rbuf from the
 * previous one, striped over the connections; calls arrived as whole aligned
 * units land. */
static dt_status_t exchange(dt_comm_t *comm, tcp_be_t *be, const void *sbuf, size_t sbytes, void *rbuf,
                            size_t rbytes, size_t align, arrived_fn arrived, void *arg) {
    int K = be->nconn;
    size_t slo[TCP_MAX_CONNS], shi[TCP_MAX_CONNS], rlo[TCP_MAX_CONNS], rhi[TCP_MAX_CONNS];
    size_t sdone[TCP_MAX_CONNS], rdone[TCP_MAX_CONNS], rfed[TCP_MAX_CONNS];
    for (int k = 0; k < K; k++) {
        part(sbytes, K, k, align, &slo[k], &shi[k]);
        part(rbytes, K, k, align, &rlo[k], &rhi[k]);
        sdone[k] = slo[k];
        rdone[k] = rfed[k] = rlo[k];
    }
    const uint8_t *sp = sbuf;
    uint8_t *rp = rbuf;
    uint32_t idle = 0;
    for (;;) {
        int pending = 0, progress = 0;
        for (int k = 0; k < K; k++) {
            if (sdone[k] < shi[k]) {
                ssize_t m = send(be->next[k], sp + sdone[k], shi[k] - sdone[k], MSG_NOSIGNAL);
                if (m > 0) {
                    sdone[k] += (size_t)m;
                    progress = 1;
                } else if (m < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    return dt_error(DT_STATUS_CLOSED, "tcp comm: rank %d: sending to rank %d: %s", be->r,
                                    (be->r + 1) % be->n, strerror(errno));
                }
                if (sdone[k] < shi[k]) pending = 1;
            }
            if (rdone[k] < rhi[k]) {
                ssize_t m = recv(be->prev[k], rp + rdone[k], rhi[k] - rdone[k], 0);
                if (m > 0) {
                    rdone[k] += (size_t)m;
                    progress = 1;
                    size_t upto = rdone[k] == rhi[k] ? rhi[k] : rlo[k] + (rdone[k] - rlo[k]) / align * align;
                    if (arrived && upto > rfed[k]) {
                        arrived(arg, rfed[k], upto);
                        rfed[k] = upto;
                    }
                } else if (m == 0) {
                    return dt_error(DT_STATUS_CLOSED, "tcp comm: rank %d: rank %d closed the connection",
                                    be->r, (be->r - 1 + be->n) % be->n);
                } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    return dt_error(DT_STATUS_CLOSED, "tcp comm: rank %d: receiving from rank %d: %s", be->r,
                                    (be->r - 1 + be->n) % be->n, strerror(errno));
                }
                if (rdone[k] < rhi[k]) pending = 1;
            }
        }
        if (!pending) return DT_STATUS_OK;
        if (progress) {
            idle = 0;
            continue;
        }
        struct pollfd pf[2 * TCP_MAX_CONNS];
        int np = 0;
        for (int k = 0; k < K; k++) {
            if (sdone[k] < shi[k]) pf[np++] = (struct pollfd){be->next[k], POLLOUT, 0};
            if (rdone[k] < rhi[k]) pf[np++] = (struct pollfd){be->prev[k], POLLIN, 0};
        }
        int pr = poll(pf, (nfds_t)np, ++idle > 4 ? 50 : 0);
        if (pr == 0 && idle > 4) {
            DT_CHECK(dt_comm_tick_slow_(comm));
        } else if ((idle & 1023) == 0) {
            DT_CHECK(dt_comm_tick_slow_(comm));
        }
    }
}

static dt_status_t ensure(float **buf, size_t *cap, size_t n) {
    if (*cap >= n) return DT_STATUS_OK;
    dt_mem_free(*buf);
    *cap = 0;
    *buf = dt_mem_alloc(DT_MEM_COMM, n * sizeof(float) + 64);
    if (!*buf) return DT_STATUS_NOMEM;
    *cap = n;
    return DT_STATUS_OK;
}

/* ---- ops ------------------------------------------------------------------------- */

static dt_status_t exchange_header(dt_comm_t *comm, tcp_be_t *be, const dt_comm_req_t *req) {
    op_header_t mine = {TCP_OP_MAGIC, (uint32_t)req->op_, (uint32_t)req->dtype_, (uint32_t)req->redop_, req->seq_,
                        req->count_, req->root_, 0};
    op_header_t theirs;
    int K = be->nconn;
    be->nconn = 1; /* the header goes over the first connection */
    dt_status_t st = exchange(comm, be, &mine, sizeof(mine), &theirs, sizeof(theirs), sizeof(theirs), NULL, NULL);
    be->nconn = K;
    DT_CHECK(st);
    if (theirs.magic != TCP_OP_MAGIC)
        return dt_error(DT_STATUS_PROTOCOL, "tcp comm: rank %d: bad op header from rank %d", be->r,
                        (be->r - 1 + be->n) % be->n);
    if (req->op_ == DT_COMM_OP_SEND || req->op_ == DT_COMM_OP_RECV) {
        uint32_t want = req->op_ == DT_COMM_OP_SEND ? DT_COMM_OP_RECV : DT_COMM_OP_SEND;
        if (theirs.op != want)
            return dt_error(DT_STATUS_PROTOCOL, "tcp comm: rank %d: %s met op %u on a point-to-point channel",
                            be->r, dt_comm_op_name(req->op_), theirs.op);
        if (theirs.count != mine.count || theirs.dtype != mine.dtype)
            return dt_comm_p2p_mismatch_(req, theirs.count, theirs.dtype, theirs.seq);
        return DT_STATUS_OK;
    }
    if (theirs.op != mine.op || theirs.dtype != mine.dtype || theirs.seq != mine.seq || theirs.count != mine.count ||
        (req->op_ <= DT_COMM_OP_REDUCE_SCATTER && theirs.redop != mine.redop) ||
        (req->op_ == DT_COMM_OP_BROADCAST && theirs.root != mine.root)) {
        dt_comm_req_t other = *req;
        other.op_ = (dt_comm_op_t)theirs.op;
        other.dtype_ = (dt_comm_dtype_t)theirs.dtype;
        other.redop_ = (dt_comm_redop_t)theirs.redop;
        other.seq_ = theirs.seq;
        other.count_ = (size_t)theirs.count;
        char a[200], b[200];
        dt_comm_describe_(req, a, sizeof(a));
        dt_comm_describe_(&other, b, sizeof(b));
        return dt_error(DT_STATUS_MISMATCH, "%s on rank %d: ranks disagree: rank %d is in %s", a, be->r,
                        (be->r - 1 + be->n) % be->n, b);
    }
    return DT_STATUS_OK;
}

/* One step of a ring pass: what goes to the next rank and where the previous
 * rank's bytes land. Reduce steps land in the stage and are combined with the
 * own contribution (in) into acc as they arrive. */
typedef struct ring_step {
    const uint8_t *sbuf;
    size_t slen;
    uint8_t *rbuf;
    size_t rlen;
    float *acc;       /* reduce steps: destination of this segment */
    const float *in;  /* reduce steps: own contribution */
    int divide;       /* reduce step after which the segment is final: AVG divides */
} ring_step_t;

/* Runs the steps pipelined: on each connection k, part k of step s (s >= 1) is
 * sent as soon as the same bytes of step s-1 have arrived (and been reduced):
 * in a ring the segment sent at step s is the one received at step s-1. */
static dt_status_t ring_pipeline(dt_comm_t *comm, tcp_be_t *be, const ring_step_t *st, int nsteps,
                                 dt_comm_redop_t redop) {
    int K = be->nconn;
    int ss[TCP_MAX_CONNS], rs[TCP_MAX_CONNS];
    size_t soff[TCP_MAX_CONNS], roff[TCP_MAX_CONNS], rfed[TCP_MAX_CONNS];
    for (int k = 0; k < K; k++) ss[k] = rs[k] = 0, soff[k] = roff[k] = rfed[k] = 0;
    dt_comm_redop_t op = redop == DT_COMM_MAX ? DT_COMM_MAX : DT_COMM_SUM;
    float d = (float)be->n;
    uint32_t idle = 0;
    uint64_t spin_start = 0;
    for (;;) {
        int pending = 0, progress = 0, can_send[TCP_MAX_CONNS] = {0};
        for (int k = 0; k < K; k++) {
            size_t lo, hi;
            /* send */
            while (ss[k] < nsteps) {
                part(st[ss[k]].slen, K, k, 4, &lo, &hi);
                if (lo + soff[k] < hi) break;
                ss[k]++, soff[k] = 0;
            }
            if (ss[k] < nsteps) {
                pending = 1;
                size_t avail = hi - lo; /* bytes of this part that may go now */
                if (ss[k] > 0 && rs[k] <= ss[k] - 1) avail = rs[k] == ss[k] - 1 ? rfed[k] : 0;
                if (avail > soff[k]) {
                    ssize_t m = send(be->next[k], st[ss[k]].sbuf + lo + soff[k], avail - soff[k], MSG_NOSIGNAL);
                    if (m > 0) {
                        soff[k] += (size_t)m;
                        progress = 1;
                    } else if (m < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                        can_send[k] = 1; /* allowed, but the socket is full */
                    } else if (m < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                        return dt_error(DT_STATUS_CLOSED, "tcp comm: rank %d: sending to rank %d: %s", be->r,
                                        (be->r + 1) % be->n, strerror(errno));
                    }
                }
            }
            /* receive */
            while (rs[k] < nsteps) {
                part(st[rs[k]].rlen, K, k, 4, &lo, &hi);
                if (lo + roff[k] < hi) break;
                rs[k]++, roff[k] = rfed[k] = 0;
            }
            if (rs[k] < nsteps) {
                pending = 1;
                const ring_step_t *p = &st[rs[k]];
                size_t part_len = hi - lo;
                ssize_t m;
                if (p->acc) {
                    /* reduce step: through this connection's small stage, so the
                     * bytes are added while they are in cache */
                    uint8_t *stage = (uint8_t *)be->stage + (size_t)k * TCP_STAGE_BYTES;
                    size_t pend = roff[k] - rfed[k], want = part_len - roff[k];
                    if (want > TCP_STAGE_BYTES - pend) want = TCP_STAGE_BYTES - pend;
                    m = recv(be->prev[k], stage + pend, want, 0);
                    if (m > 0) {
                        roff[k] += (size_t)m;
                        progress = 1;
                        size_t have = pend + (size_t)m;
                        size_t use = roff[k] == part_len ? have : have / 4 * 4;
                        size_t i0 = (lo + rfed[k]) / 4, ne = use / 4;
                        const float *src[2] = {p->in + i0, (const float *)stage};
                        dt_comm_reduce_f32_(p->acc + i0, src, 2, ne, op, 0);
                        if (p->divide)
                            for (size_t i = i0; i < i0 + ne; i++) p->acc[i] /= d;
                        rfed[k] += use;
                        if (have > use) memmove(stage, stage + use, have - use);
                    }
                } else {
                    m = recv(be->prev[k], p->rbuf + lo + roff[k], part_len - roff[k], 0);
                    if (m > 0) {
                        roff[k] += (size_t)m;
                        rfed[k] = roff[k];
                        progress = 1;
                    }
                }
                if (m == 0) {
                    return dt_error(DT_STATUS_CLOSED, "tcp comm: rank %d: rank %d closed the connection", be->r,
                                    (be->r - 1 + be->n) % be->n);
                } else if (m < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    return dt_error(DT_STATUS_CLOSED, "tcp comm: rank %d: receiving from rank %d: %s", be->r,
                                    (be->r - 1 + be->n) % be->n, strerror(errno));
                }
            }
        }
        if (!pending) return DT_STATUS_OK;
        if (progress) {
            idle = 0;
            continue;
        }
        /* wait for buffer space only where sending is allowed, else for input */
        struct pollfd pf[2 * TCP_MAX_CONNS];
        int np = 0;
        for (int k = 0; k < K; k++) {
            if (can_send[k]) pf[np++] = (struct pollfd){be->next[k], POLLOUT, 0};
            if (rs[k] < nsteps) pf[np++] = (struct pollfd){be->prev[k], POLLIN, 0};
        }
        /* Spin (polling without sleeping) for a short while before blocking:
         * a sleeping rank costs a wake-up per socket buffer refill. */
        if (idle++ == 0) spin_start = dt_now_ns();
        int spinning = dt_now_ns() - spin_start < be->spin_ns;
        if (spinning && (be->oversub || dt_now_ns() - spin_start > 20000)) sched_yield();
        int pr = poll(pf, (nfds_t)np, spinning ? 0 : 50);
        if ((pr == 0 && !spinning) || (idle & 1023) == 0) DT_CHECK(dt_comm_tick_slow_(comm));
    }
}

/* Ring reduce-scatter (then all-gather when gather) over fp32: in is this rank's
 * input, acc receives the results (may equal in). Slice j is summed in ring
 * order j+1, j+2, ..., j+n. */
static dt_status_t ring_reduce(dt_comm_t *comm, tcp_be_t *be, const float *in, float *acc, size_t count,
                               dt_comm_redop_t redop, int gather) {
    int n = be->n, r = be->r;
    DT_CHECK(ensure(&be->stage, &be->stage_cap, (size_t)be->nconn * TCP_STAGE_BYTES / 4));
    ring_step_t steps[2 * 64];
    int nsteps = gather ? 2 * n - 2 : n - 1;
    if (n > 64) return dt_error(DT_STATUS_UNSUPPORTED, "tcp comm: at most 64 ranks in a ring");
    for (int s = 0; s < nsteps; s++) {
        int ssl = ((r - s - 1) % n + 2 * n) % n, rsl = ((r - s - 2) % n + 2 * n) % n;
        size_t so = dt_comm_slice_offset(count, n, ssl), ro = dt_comm_slice_offset(count, n, rsl);
        ring_step_t *p = &steps[s];
        p->sbuf = (const uint8_t *)((s == 0 ? in : acc) + so);
        p->slen = dt_comm_slice_count(count, n, ssl) * 4;
        p->rlen = dt_comm_slice_count(count, n, rsl) * 4;
        if (s < n - 1) { /* reduce-scatter step: land in the stage, add into acc */
            p->rbuf = (uint8_t *)be->stage;
            p->acc = acc + ro;
            p->in = in + ro;
            p->divide = s == n - 2 && redop == DT_COMM_AVG;
        } else {
            p->rbuf = (uint8_t *)(acc + ro);
            p->acc = NULL;
            p->in = NULL;
            p->divide = 0;
        }
    }
    return ring_pipeline(comm, be, steps, nsteps, redop);
}

/* Ring all-gather of the n slices of a count-element vector (slices as in
 * comm.h) in place in buf, es bytes per element: rank r already holds slice r. */
static dt_status_t ring_gather_slices(dt_comm_t *comm, tcp_be_t *be, uint8_t *buf, size_t count, size_t es) {
    int n = be->n, r = be->r;
    if (n > 64) return dt_error(DT_STATUS_UNSUPPORTED, "tcp comm: at most 64 ranks in a ring");
    ring_step_t steps[64];
    for (int s = 0; s < n - 1; s++) {
        int sb = ((r - s) % n + n) % n, rb = ((r - s - 1) % n + n) % n;
        steps[s] = (ring_step_t){buf + dt_comm_slice_offset(count, n, sb) * es, dt_comm_slice_count(count, n, sb) * es,
                                 buf + dt_comm_slice_offset(count, n, rb) * es, dt_comm_slice_count(count, n, rb) * es,
                                 NULL, NULL, 0};
    }
    return ring_pipeline(comm, be, steps, n - 1, DT_COMM_SUM);
}

static dt_status_t tcp_all_reduce(dt_comm_t *comm, tcp_be_t *be, dt_comm_req_t *req) {
    size_t count = req->count_;
    if (req->dtype_ == DT_COMM_F32) return ring_reduce(comm, be, req->send_, req->recv_, count, req->redop_, 1);
    /* bf16: the reduce-scatter half in fp32 (partial sums are not rounded),
     * then each rank rounds its final slice once and the all-gather half
     * carries bf16: 6 bytes per element on the wire instead of 8. */
    int n = be->n, r = be->r;
    size_t off = dt_comm_slice_offset(count, n, r), len = dt_comm_slice_count(count, n, r);
    DT_CHECK(ensure(&be->work, &be->work_cap, count));
    dt_comm_bf16_to_f32_n_(be->work, req->send_, count);
    DT_CHECK(ring_reduce(comm, be, be->work, be->work, count, req->redop_, 0));
    uint16_t *out = req->recv_;
    dt_comm_f32_to_bf16_n_(out + off, be->work + off, len, DT_COMM_SUM, 0);
    return ring_gather_slices(comm, be, (uint8_t *)out, count, 2);
}

static dt_status_t tcp_reduce_scatter(dt_comm_t *comm, tcp_be_t *be, dt_comm_req_t *req) {
    size_t count = req->count_;
    int n = be->n, r = be->r;
    size_t off = dt_comm_slice_offset(count, n, r), len = dt_comm_slice_count(count, n, r);
    DT_CHECK(ensure(&be->work, &be->work_cap, count));
    if (req->dtype_ == DT_COMM_F32) {
        DT_CHECK(ring_reduce(comm, be, req->send_, be->work, count, req->redop_, 0));
        memmove(req->recv_, be->work + off, len * 4);
    } else {
        dt_comm_bf16_to_f32_n_(be->work, req->send_, count);
        DT_CHECK(ring_reduce(comm, be, be->work, be->work, count, req->redop_, 0));
        dt_comm_f32_to_bf16_n_(req->recv_, be->work + off, len, DT_COMM_SUM, 0);
    }
    return DT_STATUS_OK;
}

static dt_status_t tcp_all_gather(dt_comm_t *comm, tcp_be_t *be, dt_comm_req_t *req) {
    int n = be->n, r = be->r;
    size_t bytes = req->count_ * dt_comm_dtype_size(req->dtype_);
    uint8_t *out = req->recv_;
    if ((const uint8_t *)req->send_ != out + (size_t)r * bytes) memcpy(out + (size_t)r * bytes, req->send_, bytes);
    if (n > 64) return dt_error(DT_STATUS_UNSUPPORTED, "tcp comm: at most 64 ranks in a ring");
    ring_step_t steps[64];
    for (int s = 0; s < n - 1; s++) {
        int sb = ((r - s) % n + n) % n, rb = ((r - s - 1) % n + n) % n;
        steps[s] = (ring_step_t){out + (size_t)sb * bytes, bytes, out + (size_t)rb * bytes, bytes, NULL, NULL, 0};
    }
    return ring_pipeline(comm, be, steps, n - 1, DT_COMM_SUM);
}

static dt_status_t tcp_broadcast(dt_comm_t *comm, tcp_be_t *be, dt_comm_req_t *req) {
    size_t bytes = req->count_ * dt_comm_dtype_size(req->dtype_);
    uint8_t *buf = req->recv_;
    int root = req->root_, r = be->r;
    int forward = (r + 1) % be->n != root;
    size_t nch = (bytes + TCP_BCAST_CHUNK - 1) / TCP_BCAST_CHUNK;
    for (size_t k = 0; k <= nch; k++) {
        const uint8_t *sp = NULL;
        size_t sn = 0;
        uint8_t *rp = NULL;
        size_t rn = 0;
        size_t sk = r == root ? k : k - 1; /* chunk to send now */
        if (forward && (r == root ? k < nch : k >= 1)) {
            sp = buf + sk * TCP_BCAST_CHUNK;
            sn = bytes - sk * TCP_BCAST_CHUNK < TCP_BCAST_CHUNK ? bytes - sk * TCP_BCAST_CHUNK : TCP_BCAST_CHUNK;
        }
        if (r != root && k < nch) {
            rp = buf + k * TCP_BCAST_CHUNK;
            rn = bytes - k * TCP_BCAST_CHUNK < TCP_BCAST_CHUNK ? bytes - k * TCP_BCAST_CHUNK : TCP_BCAST_CHUNK;
        }
        if (sn || rn) DT_CHECK(exchange(comm, be, sp, sn, rp, rn, 1, NULL, NULL));
    }
    return DT_STATUS_OK;
}

static dt_status_t tcp_dispatch(dt_comm_t *comm, tcp_be_t *be, dt_comm_req_t *req) {
    switch (req->op_) {
    case DT_COMM_OP_ALL_REDUCE: return tcp_all_reduce(comm, be, req);
    case DT_COMM_OP_REDUCE_SCATTER: return tcp_reduce_scatter(comm, be, req);
    case DT_COMM_OP_ALL_GATHER: return tcp_all_gather(comm, be, req);
    case DT_COMM_OP_BROADCAST:
    case DT_COMM_OP_SEND: /* from the channel's rank 0 (root_ 0) */
    case DT_COMM_OP_RECV: return tcp_broadcast(comm, be, req);
    case DT_COMM_OP_BARRIER: {
        float one = 1.0f, sum = 0.0f;
        return ring_reduce(comm, be, &one, &sum, 1, DT_COMM_SUM, 1);
    }
    }
    return dt_error(DT_STATUS_INVALID, "tcp: unknown op %d", (int)req->op_);
}

static dt_status_t tcp_run(dt_comm_t *comm, dt_comm_req_t *req) {
    tcp_be_t *be = comm->be;
    dt_status_t st = exchange_header(comm, be, req);
    if (st == DT_STATUS_OK) st = tcp_dispatch(comm, be, req);
    if (st != DT_STATUS_OK && st != DT_STATUS_TIMEOUT && st != DT_STATUS_MISMATCH) { /* timeouts already name the op */
        char what[200], detail[600];
        dt_comm_describe_(req, what, sizeof(what));
        snprintf(detail, sizeof(detail), "%s", dt_error_detail());
        return dt_error(st, "%s failed: %s", what, detail);
    }
    return st;
}

const dt_comm_backend_ops_t dt_comm_tcp_ops = {
    .name = "tcp",
    .init = tcp_init,
    .free = tcp_free,
    .run = tcp_run,
};
