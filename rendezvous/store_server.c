/*
 * store_server.c - the TCPStore server: one libuv loop on a background thread,
 * a hash map of keys, and waiters that are woken by the writes that make their
 * keys exist (no polling). Wire layout and limits: rendezvous/proto.h. This file
 * starts and stops it; the rest is in store_server_*.c (store_server_impl.h
 * says which file does what). Everything runs on the loop thread except start,
 * stop and the counters.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/resource.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/log.h"
#include "common/mem.h"
#include "common/status.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"
#include "rendezvous/store_server_impl.h"

/* How often connections that never sent VALIDATE are looked for. */
#define SWEEP_INTERVAL_MS 1000
/* After input, the loop polls without sleeping this long before it blocks: a client
 * in a request loop sends its next request within a round trip, and finding it
 * without a sleep and a wake-up halves that client's round trip where a wake-up
 * from idle is slow (set/get, one client: 17 k -> 40 k/s on the 2-core test
 * machine). A burst costs at most this much more CPU. Spinning pays only while a
 * CPU would otherwise be idle: with more tasks runnable than CPUs it takes time
 * from them (the clients among them), so the loop then sleeps as usual. */
#define SPIN_NS 50000
/* How often, while spinning, the runnable tasks are counted (/proc/loadavg). */
#define SPIN_CHECK_NS 1000000

/* ---- start / stop ----------------------------------------------------------- */

static void on_stop(uv_async_t *a) {
    dt_store_server_t *srv = a->data;
    for (client_t *c = srv->clients; c; c = c->next) dt_store_conn_close_(c, NULL);
    uv_close((uv_handle_t *)&srv->sweep, NULL);
    uv_close((uv_handle_t *)&srv->drain, NULL);
    uv_close((uv_handle_t *)&srv->listener, NULL);
    uv_close((uv_handle_t *)&srv->stop_async, NULL);
}

/* 1 when no task waits for a CPU: /proc/loadavg's count of runnable tasks (this
 * thread among them) is at most the CPUs online. 0 when it cannot be read. */
static int cpu_free(int loadavg_fd, long ncpus) {
    char buf[128];
    int running = 0;
    ssize_t n = loadavg_fd >= 0 ? pread(loadavg_fd, buf, sizeof buf - 1, 0) : -1;
    if (n <= 0) return 0;
    buf[n] = '\0';
    return sscanf(buf, "%*s %*s %*s %d", &running) == 1 && running <= ncpus;
}

/* The loop: after each callback that read or accepted, polls (UV_RUN_NOWAIT) for up
 * to SPIN_NS before it sleeps in epoll again (UV_RUN_ONCE), while a CPU is free. */
static void *server_thread(void *arg) {
    dt_store_server_t *srv = arg;
    int loadavg_fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    long ncpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t seen = srv->inputs, spin_until = 0, checked = 0;
    int free_cpu = 0;
    for (;;) {
        int spin = uv_hrtime() < spin_until;
        if (!uv_run(&srv->loop, spin ? UV_RUN_NOWAIT : UV_RUN_ONCE)) break;
        if (srv->inputs == seen) continue;
        seen = srv->inputs;
        uint64_t now = uv_hrtime();
        if (now - checked >= SPIN_CHECK_NS) {
            free_cpu = cpu_free(loadavg_fd, ncpus);
            checked = now;
        }
        spin_until = free_cpu ? now + SPIN_NS : 0;
    }
    if (loadavg_fd >= 0) close(loadavg_fd);
    return NULL;
}

static int read_somaxconn(void) {
    int v = 0;
    FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
    if (f) {
        if (fscanf(f, "%d", &v) != 1) v = 0;
        fclose(f);
    }
    return v > 0 ? v : 4096;
}

/* Raises the soft file descriptor limit to the hard one (a store is worth the
 * descriptors the system allows) and returns the limit now in force. */
static long raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : rl.rlim_max;
        struct rlimit up = {.rlim_cur = want, .rlim_max = rl.rlim_max};
        if (want > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &up) == 0) {
            DT_LOG_DEBUG("store: file descriptor limit raised from %ld to %ld",
                         (long)rl.rlim_cur, (long)want);
            rl.rlim_cur = want;
        }
    }
    return rl.rlim_cur == RLIM_INFINITY ? 1L << 20 : (long)rl.rlim_cur;
}

dt_status_t dt_store_server_start(const char *host, int port, dt_store_server_t **out) {
    return dt_store_server_start_auth(host, port, NULL, 0, out);
}

dt_status_t dt_store_server_start_auth(const char *host, int port, const dt_store_token_t *token,
                                       int allow_peers, dt_store_server_t **out) {
    *out = NULL;
    if (!host || !*host) host = "0.0.0.0";
    if (port < 0 || port > 65535)
        return dt_error(DT_STATUS_INVALID, "store: port %d is outside 0..65535", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int gr = getaddrinfo(host, NULL, &hints, &ai);
    if (gr != 0 || !ai)
        return dt_error(DT_STATUS_INVALID, "store: cannot resolve host '%s': %s", host,
                        gai_strerror(gr));
    struct sockaddr_storage addr;
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (addr.ss_family == AF_INET6) ((struct sockaddr_in6 *)&addr)->sin6_port = htons(port);
    else ((struct sockaddr_in *)&addr)->sin_port = htons(port);

    dt_store_server_t *srv = dt_xcalloc(1, sizeof *srv);
    dt_status_t st = DT_STATUS_OK;
    snprintf(srv->host, sizeof srv->host, "%s", host);
    srv->nbuckets = 1024;
    srv->buckets = dt_xcalloc(srv->nbuckets, sizeof *srv->buckets);
    srv->fd_limit = raise_fd_limit();
    srv->max_conns = srv->fd_limit > 2 * DT_STORE_FD_RESERVE
                         ? (size_t)(srv->fd_limit - DT_STORE_FD_RESERVE)
                         : (size_t)(srv->fd_limit / 2);
    if (token) srv->auth = dt_store_auth_new(token, allow_peers);
    int r = uv_loop_init(&srv->loop);
    if (r < 0) {
        st = dt_error(DT_STATUS_SYS, "store: uv_loop_init: %s", uv_strerror(r));
        goto out_free;
    }
    uv_tcp_init(&srv->loop, &srv->listener);
    srv->listener.data = srv;
    uv_async_init(&srv->loop, &srv->stop_async, on_stop);
    srv->stop_async.data = srv;
    uv_timer_init(&srv->loop, &srv->sweep);
    srv->sweep.data = srv;
    uv_timer_start(&srv->sweep, dt_store_on_sweep_, SWEEP_INTERVAL_MS, SWEEP_INTERVAL_MS);
    uv_check_init(&srv->loop, &srv->drain);
    srv->drain.data = srv;
    uv_check_start(&srv->drain, dt_store_on_drain_);
    r = uv_tcp_bind(&srv->listener, (const struct sockaddr *)&addr, 0);
    /* Accepted sockets inherit it on Linux (checked on the first one), which saves a
     * system call per connection. */
    if (r == 0) uv_tcp_nodelay(&srv->listener, 1);
    if (r == 0)
        r = uv_listen((uv_stream_t *)&srv->listener, read_somaxconn(), dt_store_on_connection_);
    if (r < 0) {
        st = dt_error(r == UV_EADDRINUSE ? DT_STATUS_IO : DT_STATUS_SYS,
                      "store: cannot listen on %s:%d: %s", host, port, uv_strerror(r));
        goto out_close_loop;
    }
    struct sockaddr_storage bound;
    int bl = sizeof bound;
    uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&bound, &bl);
    srv->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                  : ((struct sockaddr_in *)&bound)->sin_port);
    r = pthread_create(&srv->thread, NULL, server_thread, srv);
    if (r != 0) {
        st = dt_error(DT_STATUS_SYS, "store: cannot start its thread: %s", strerror(r));
        goto out_close_loop;
    }
    DT_LOG_DEBUG("store: listening on %s:%d", host, srv->port);
    *out = srv;
    return DT_STATUS_OK;

out_close_loop:
    uv_close((uv_handle_t *)&srv->sweep, NULL);
    uv_close((uv_handle_t *)&srv->drain, NULL);
    uv_close((uv_handle_t *)&srv->listener, NULL);
    uv_close((uv_handle_t *)&srv->stop_async, NULL);
    uv_run(&srv->loop, UV_RUN_DEFAULT);
    uv_loop_close(&srv->loop);
out_free:
    dt_store_auth_free(srv->auth);
    free(srv->buckets);
    free(srv);
    return st;
}

int dt_store_server_port(const dt_store_server_t *srv) { return srv ? srv->port : -1; }

size_t dt_store_server_num_keys(dt_store_server_t *srv) {
    return srv ? atomic_load(&srv->num_keys) : 0;
}

size_t dt_store_server_num_clients(dt_store_server_t *srv) {
    return srv ? atomic_load(&srv->num_clients) : 0;
}

void dt_store_server_stop(dt_store_server_t *srv) {
    if (!srv) return;
    uv_async_send(&srv->stop_async);
    pthread_join(srv->thread, NULL);
    int r = uv_loop_close(&srv->loop);
    if (r < 0) DT_LOG_WARN("store: loop did not close cleanly: %s", uv_strerror(r));
    dt_store_map_free_(srv);
    dt_store_peers_free_(srv);
    dt_store_auth_free(srv->auth);
    free(srv);
}
