/*
 * store_bench.c - the store benchmark's load drivers (see store_bench.h).
 *
 * Everything runs on the calling thread: N non-blocking sockets on one epoll
 * set, each with a tiny receive state, so that thousands of "workers" cost one
 * process and the numbers measure the server, not thread scheduling.
 */
#include "rendezvous/store_bench.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/mem.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"

/* Connections per source address when the server is on IPv4 loopback: half the
 * server's per-peer cap, so that thousands of clients look like several hosts (as
 * they would be) and a round's connections still closing do not count against the
 * next round's. */
#define CONNS_PER_SOURCE (DT_STORE_MAX_CONNS_PER_PEER / 2)

typedef struct conn {
    int fd;
    int connected;
    size_t got;       /* reply bytes received in the current step */
    uint8_t rx[64];
    int done;
} conn_t;

dt_status_t dt_store_bench_raise_nofile(long want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return dt_error(DT_STATUS_SYS, "getrlimit: %s", strerror(errno));
    if ((long)rl.rlim_cur >= want) return DT_STATUS_OK;
    if (rl.rlim_max != RLIM_INFINITY && (long)rl.rlim_max < want)
        return dt_error(DT_STATUS_LIMIT,
                        "need %ld open files but the hard limit (ulimit -Hn) is %ld", want,
                        (long)rl.rlim_max);
    rl.rlim_cur = (rlim_t)want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        return dt_error(DT_STATUS_SYS, "setrlimit(RLIMIT_NOFILE, %ld): %s", want,
                        strerror(errno));
    return DT_STATUS_OK;
}

static dt_status_t resolve(const char *host, int port, struct sockaddr_storage *ss,
                           socklen_t *sl) {
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int r = getaddrinfo(host, ports, &hints, &ai);
    if (r != 0 || !ai)
        return dt_error(DT_STATUS_INVALID, "cannot resolve %s: %s", host, gai_strerror(r));
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *sl = ai->ai_addrlen;
    freeaddrinfo(ai);
    return DT_STATUS_OK;
}

static void close_all(conn_t *c, int n, int ep) {
    for (int i = 0; i < n; i++)
        if (c[i].fd >= 0) close(c[i].fd);
    if (ep >= 0) close(ep);
    free(c);
}

/* Opens n connections and waits until all are established. */
static dt_status_t open_conns(const char *host, int port, int n, double deadline, conn_t **out,
                              int *out_ep) {
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    DT_CHECK(resolve(host, port, &ss, &sl));
    /* Twice n when the limit allows (a server in this process holds the other
     * ends), n otherwise (a server in another process). */
    struct rlimit rl;
    long want = (long)n * 2 + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY &&
        (long)rl.rlim_max < want)
        want = (long)rl.rlim_max > (long)n + 256 ? (long)rl.rlim_max : (long)n + 256;
    DT_CHECK(dt_store_bench_raise_nofile(want));
    int spread = 0;
    if (ss.ss_family == AF_INET) {
        uint32_t a = ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr);
        spread = (a >> 24) == 127 && n > CONNS_PER_SOURCE;
    }
    conn_t *c = dt_xcalloc((size_t)n, sizeof *c);
    for (int i = 0; i < n; i++) c[i].fd = -1;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    dt_status_t st = DT_STATUS_OK;
    if (ep < 0) {
        st = dt_error(DT_STATUS_SYS, "epoll_create1: %s", strerror(errno));
        goto out_close;
    }
    for (int i = 0; i < n; i++) {
        c[i].fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (c[i].fd < 0) {
            st = dt_error(DT_STATUS_SYS, "socket #%d: %s", i, strerror(errno));
            goto out_close;
        }
        int one = 1;
        setsockopt(c[i].fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (spread) {
            uint32_t a = 0x7f000001u + (uint32_t)(i / CONNS_PER_SOURCE); /* 127.0.0.1 + k */
            struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(a)};
            setsockopt(c[i].fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
            if (bind(c[i].fd, (struct sockaddr *)&src, sizeof src) != 0) {
                st = dt_error(DT_STATUS_SYS, "bind #%d to a loopback source: %s", i,
                              strerror(errno));
                goto out_close;
            }
        }
        if (connect(c[i].fd, (struct sockaddr *)&ss, sl) == 0) {
            c[i].connected = 1;
        } else if (errno != EINPROGRESS) {
            st = dt_error(DT_STATUS_REFUSED, "connect #%d to %s:%d: %s", i, host, port,
                          strerror(errno));
            goto out_close;
        }
        struct epoll_event ev = {.events = EPOLLOUT, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, c[i].fd, &ev);
    }
    int connected = 0;
    for (int i = 0; i < n; i++) connected += c[i].connected;
    struct epoll_event evs[256];
    while (connected < n) {
        int ms = (int)((deadline - dt_now_s()) * 1000);
        if (ms <= 0) {
            st = dt_error(DT_STATUS_TIMEOUT, "only %d of %d connections to %s:%d established",
                          connected, n, host, port);
            goto out_close;
        }
        int k = epoll_wait(ep, evs, 256, ms);
        for (int j = 0; j < k; j++) {
            conn_t *x = &c[evs[j].data.u32];
            if (x->connected) continue;
            int err = 0;
            socklen_t el = sizeof err;
            getsockopt(x->fd, SOL_SOCKET, SO_ERROR, &err, &el);
            if (err) {
                st = dt_error(DT_STATUS_REFUSED, "connect to %s:%d: %s", host, port,
                              strerror(err));
                goto out_close;
            }
            x->connected = 1;
            connected++;
        }
    }
    for (int i = 0; i < n; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_MOD, c[i].fd, &ev);
    }
    *out = c;
    *out_ep = ep;
    return DT_STATUS_OK;

out_close:
    close_all(c, n, ep);
    return st;
}

static dt_status_t send_small(conn_t *c, const dt_store_buf_t *b) {
    ssize_t w = send(c->fd, b->data, b->len, MSG_NOSIGNAL);
    if (w == (ssize_t)b->len) return DT_STATUS_OK;
    /* A few hundred bytes into an empty socket buffer always fit. */
    return dt_error(DT_STATUS_IO, "short send (%zd of %zu bytes): %s", w, b->len,
                    w < 0 ? strerror(errno) : "buffer full");
}

dt_status_t dt_store_bench_barrier(const char *host, int port, int n, double timeout_s,
                                   dt_store_bench_barrier_t *out) {
    static unsigned seq;
    char count_key[96], go_key[96];
    snprintf(count_key, sizeof count_key, "/dtrun_bench/%d/%u/%d/count", (int)getpid(), seq, n);
    snprintf(go_key, sizeof go_key, "/dtrun_bench/%d/%u/%d/go", (int)getpid(), seq, n);
    seq++;
    double t_start = dt_now_s(), deadline = t_start + timeout_s;
    conn_t *c;
    int ep;
    DT_CHECK(open_conns(host, port, n, deadline, &c, &ep));
    double t0 = dt_now_s();
    out->connect_s = t0 - t_start;

    dt_status_t st = DT_STATUS_OK;
    dt_store_buf_t req = {0}, go = {0};
    const char *keys[1] = {go_key};
    dt_store_encode_validate(&req);
    dt_store_encode_add(&req, count_key, strlen(count_key), 1);
    dt_store_encode_keys(&req, DT_STORE_CMD_WAIT, keys, 1);
    dt_store_encode_set(&go, DT_STORE_CMD_SET, go_key, strlen(go_key), "1", 1);
    for (int i = 0; i < n && st == DT_STATUS_OK; i++) st = send_small(&c[i], &req);

    int released = 0;
    struct epoll_event evs[512];
    while (st == DT_STATUS_OK && released < n) {
        int ms = (int)((deadline - dt_now_s()) * 1000);
        if (ms <= 0) {
            st = dt_error(DT_STATUS_TIMEOUT, "barrier: %d of %d released within %.1f s",
                          released, n, timeout_s);
            break;
        }
        int k = epoll_wait(ep, evs, 512, ms);
        for (int j = 0; j < k && st == DT_STATUS_OK; j++) {
            conn_t *x = &c[evs[j].data.u32];
            ssize_t r = recv(x->fd, x->rx + x->got, 9 - x->got, 0);
            if (r <= 0) {
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                st = dt_error(DT_STATUS_CLOSED, "barrier: server closed a connection (%s)",
                              r < 0 ? strerror(errno) : "EOF");
                break;
            }
            size_t before = x->got;
            x->got += (size_t)r;
            if (before < 8 && x->got >= 8) {
                int64_t v;
                memcpy(&v, x->rx, 8);
                if (v == n) st = send_small(x, &go);
            }
            if (x->got == 9 && !x->done) {
                if (x->rx[8] != DT_STORE_WAIT_STOP_WAITING) {
                    st = dt_error(DT_STATUS_PROTOCOL, "barrier: WAIT answered %u", x->rx[8]);
                    break;
                }
                x->done = 1;
                released++;
            }
        }
    }
    out->release_s = dt_now_s() - t0;
    dt_store_buf_free(&req);
    dt_store_buf_free(&go);
    close_all(c, n, ep);
    return st;
}

dt_status_t dt_store_bench_setget(const char *host, int port, int nconns, double duration_s,
                                  double *per_s) {
    conn_t *c;
    int ep;
    DT_CHECK(open_conns(host, port, nconns, dt_now_s() + 30.0, &c, &ep));
    dt_status_t st = DT_STATUS_OK;
    uint8_t value[32];
    memset(value, 'v', sizeof value);
    dt_store_buf_t *reqs = dt_xcalloc((size_t)nconns, sizeof *reqs);
    for (int i = 0; i < nconns; i++) {
        char key[64];
        snprintf(key, sizeof key, "/dtrun_bench/%d/setget/%d", (int)getpid(), i);
        dt_store_encode_set(&reqs[i], DT_STORE_CMD_SET, key, strlen(key), value, sizeof value);
        dt_store_encode_key(&reqs[i], DT_STORE_CMD_GET, key, strlen(key));
        dt_store_buf_t first = {0};
        dt_store_encode_validate(&first);
        dt_store_buf_put_raw(&first, reqs[i].data, reqs[i].len);
        st = send_small(&c[i], &first);
        dt_store_buf_free(&first);
        if (st != DT_STATUS_OK) goto out_free;
    }
    const size_t reply = 8 + sizeof value;
    long long done = 0;
    double t0 = dt_now_s(), end = t0 + duration_s, now = t0;
    struct epoll_event evs[64];
    while ((now = dt_now_s()) < end) {
        int k = epoll_wait(ep, evs, 64, 1000);
        if (k == 0) {
            st = dt_error(DT_STATUS_TIMEOUT, "set/get: no reply within 1 s");
            goto out_free;
        }
        for (int j = 0; j < k; j++) {
            int i = (int)evs[j].data.u32;
            conn_t *x = &c[i];
            ssize_t r = recv(x->fd, x->rx + x->got, reply - x->got, 0);
            if (r <= 0) {
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                st = dt_error(DT_STATUS_CLOSED, "set/get: server closed a connection");
                goto out_free;
            }
            x->got += (size_t)r;
            if (x->got < reply) continue;
            if (memcmp(x->rx + 8, value, sizeof value) != 0) {
                st = dt_error(DT_STATUS_PROTOCOL, "set/get: GET returned the wrong value");
                goto out_free;
            }
            x->got = 0;
            done++;
            st = send_small(x, &reqs[i]);
            if (st != DT_STATUS_OK) goto out_free;
        }
    }
    *per_s = (double)done / (now - t0);

out_free:
    for (int i = 0; i < nconns; i++) dt_store_buf_free(&reqs[i]);
    free(reqs);
    close_all(c, nconns, ep);
    return st;
}
