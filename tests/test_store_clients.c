/*
 * test_store_clients.c - the store server and client over real loopback sockets,
 * with many or misbehaving clients: hundreds of blocking and two thousand
 * nonblocking clients passing a barrier, a client vanishing mid-wait, stopping the
 * server with clients waiting, connect retries until a server appears, connect
 * and handshake timeouts, bad arguments, IPv6 loopback. Shared helpers (the
 * per-test server, raw_* sockets): store_harness.h.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"
#include "rendezvous/store_bench.h"
#include "store_harness.h"

TestSuite(store, .init = start_server, .fini = stop_server, .timeout = 30);

/* ---- many clients, vanishing clients ------------------------------------------ */

typedef struct {
    int port;
    int n;
    int ok;
} barrier_arg_t;

static void *barrier_worker(void *p) {
    barrier_arg_t *a = p;
    dt_store_t *st = NULL;
    if (dt_store_connect("127.0.0.1", a->port, 10.0, &st) != DT_STATUS_OK) return NULL;
    int64_t r = 0;
    if (dt_store_add(st, "arrived", 1, &r) == DT_STATUS_OK) {
        if (r == a->n) dt_store_set(st, "go", "1", 1);
        const char *key = "go";
        if (dt_store_wait(st, &key, 1, 10.0) == DT_STATUS_OK) __atomic_add_fetch(&a->ok, 1, 0);
    }
    dt_store_close(st);
    return NULL;
}

Test(store, hundreds_of_blocking_clients_pass_a_barrier) {
    enum { N = 200 };
    pthread_t th[N];
    barrier_arg_t a = {.port = port, .n = N};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (int i = 0; i < N; i++) cr_assert_eq(pthread_create(&th[i], &attr, barrier_worker, &a), 0);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    cr_assert_eq(a.ok, N);
    EVENTUALLY(dt_store_server_num_clients(srv) == 0);
}

Test(store, two_thousand_nonblocking_clients_pass_a_barrier) {
    dt_store_bench_barrier_t b;
    cr_assert_eq(dt_store_bench_barrier("127.0.0.1", port, 2000, 20.0, &b), DT_STATUS_OK, "%s",
                 dt_error_detail());
    cr_assert_lt(b.release_s, 5.0);
    EVENTUALLY(dt_store_server_num_clients(srv) == 0);
    /* The counter and the barrier key are the only keys left. */
    cr_assert_eq(dt_store_server_num_keys(srv), 2);
}

Test(store, client_vanishing_mid_wait_is_cleaned_up) {
    /* Waiters on WAIT, on a blocked GET and on a BARRIER, then gone. */
    int fds[3];
    for (int i = 0; i < 3; i++) fds[i] = raw_validated();
    dt_store_buf_t b = {0};
    const char *keys[] = {"v1", "v2"};
    dt_store_encode_keys(&b, DT_STORE_CMD_WAIT, keys, 2);
    raw_send(fds[0], &b);
    b.len = 0;
    dt_store_encode_key(&b, DT_STORE_CMD_GET, "v1", 2);
    raw_send(fds[1], &b);
    b.len = 0;
    dt_store_encode_barrier(&b, "vb", 2, 5);
    raw_send(fds[2], &b);
    EVENTUALLY(dt_store_server_num_clients(srv) == 3);
    dt_sleep_ms(50);
    for (int i = 0; i < 3; i++) close(fds[i]);
    EVENTUALLY(dt_store_server_num_clients(srv) == 0);
    /* Waking the keys now must touch nothing that was freed (ASan run). */
    dt_store_t *st = connect_ok();
    cr_assert_eq(dt_store_set(st, "v1", "1", 1), DT_STATUS_OK);
    cr_assert_eq(dt_store_set(st, "v2", "1", 1), DT_STATUS_OK);
    int64_t r;
    cr_assert_eq(dt_store_add(st, "vb", 10, &r), DT_STATUS_OK);
    cr_assert_eq(r, 11);
    int64_t nk = 0;
    cr_assert_eq(dt_store_num_keys(st, &nk), DT_STATUS_OK);
    cr_assert_eq(nk, 3);
    dt_store_buf_free(&b);
    dt_store_close(st);
}

Test(store, stop_with_clients_waiting) {
    /* fini stops the server while these wait: nothing may leak or crash. */
    int fd = raw_validated();
    dt_store_buf_t b = {0};
    dt_store_encode_key(&b, DT_STORE_CMD_GET, "never", 5);
    const char *keys[] = {"never2"};
    dt_store_encode_keys(&b, DT_STORE_CMD_WAIT, keys, 1);
    raw_send(fd, &b);
    int fd2 = raw_validated();
    b.len = 0;
    dt_store_encode_keys(&b, DT_STORE_CMD_WAIT, keys, 1);
    raw_send(fd2, &b);
    EVENTUALLY(dt_store_server_num_clients(srv) == 2);
    dt_store_server_stop(srv);
    srv = NULL;
    raw_expect_closed(fd);
    raw_expect_closed(fd2);
    close(fd);
    close(fd2);
    dt_store_buf_free(&b);
}

/* ---- connecting ---------------------------------------------------------------- */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

typedef struct {
    int port;
    dt_store_server_t *srv;
} late_arg_t;

static void *late_server(void *p) {
    late_arg_t *a = p;
    dt_sleep_ms(400);
    dt_store_server_start("127.0.0.1", a->port, &a->srv);
    return NULL;
}

Test(store, connect_retries_until_a_server_appears) {
    late_arg_t a = {.port = free_port()};
    pthread_t th;
    pthread_create(&th, NULL, late_server, &a);
    double t0 = dt_now_s();
    dt_store_t *st = NULL;
    dt_status_t s = dt_store_connect("127.0.0.1", a.port, 10.0, &st);
    double dt = dt_now_s() - t0;
    pthread_join(th, NULL);
    cr_assert_not_null(a.srv, "late server failed to start");
    cr_assert_eq(s, DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert(dt > 0.35 && dt < 3.0, "took %.3f s", dt);
    int64_t r;
    cr_assert_eq(dt_store_add(st, "x", 2, &r), DT_STATUS_OK);
    cr_assert_eq(r, 2);
    dt_store_close(st);
    dt_store_server_stop(a.srv);
}

Test(store, connect_timeout_names_the_endpoint) {
    int p = free_port();
    double t0 = dt_now_s();
    dt_store_t *st = NULL;
    cr_assert_eq(dt_store_connect("127.0.0.1", p, 0.5, &st), DT_STATUS_TIMEOUT);
    double dt = dt_now_s() - t0;
    cr_assert_null(st);
    cr_assert(dt >= 0.45 && dt < 2.0, "took %.3f s", dt);
    char want[32];
    snprintf(want, sizeof want, "127.0.0.1:%d", p);
    cr_assert(strstr(dt_error_detail(), want), "%s", dt_error_detail());
    cr_assert(strstr(dt_error_detail(), "refused"), "%s", dt_error_detail());
}

Test(store, connect_to_something_that_is_not_a_store_times_out_in_the_handshake) {
    /* A socket that listens but never answers: TCP connects, VALIDATE + PING don't. */
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(ls, 16), 0);
    socklen_t l = sizeof a;
    getsockname(ls, (struct sockaddr *)&a, &l);
    dt_store_t *st = NULL;
    double t0 = dt_now_s();
    cr_assert_eq(dt_store_connect("127.0.0.1", ntohs(a.sin_port), 0.4, &st), DT_STATUS_TIMEOUT);
    double dt = dt_now_s() - t0;
    cr_assert(dt >= 0.35 && dt < 2.0, "took %.3f s", dt);
    cr_assert(strstr(dt_error_detail(), "handshake"), "%s", dt_error_detail());
    close(ls);
}

Test(store, bad_arguments_are_clear_errors) {
    dt_store_t *st = NULL;
    cr_assert_eq(dt_store_connect("127.0.0.1", 0, 1.0, &st), DT_STATUS_INVALID);
    cr_assert_eq(dt_store_connect("127.0.0.1", 70000, 1.0, &st), DT_STATUS_INVALID);
    cr_assert_eq(dt_store_connect("", 1234, 1.0, &st), DT_STATUS_INVALID);
    dt_store_server_t *s2 = NULL;
    cr_assert_eq(dt_store_server_start("127.0.0.1", port, &s2), DT_STATUS_IO,
                 "port in use: %s", dt_error_detail());
    cr_assert(strstr(dt_error_detail(), "address already in use"), "%s", dt_error_detail());
    cr_assert_neq(dt_store_server_start("no.such.host.invalid", 0, &s2), DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "no.such.host.invalid"), "%s", dt_error_detail());
    cr_assert_eq(dt_store_server_start("127.0.0.1", -1, &s2), DT_STATUS_INVALID);
    cr_assert_null(s2);
    dt_store_server_stop(NULL);
    dt_store_close(NULL);
}

Test(store, ipv6_loopback) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int have_v6 = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0) close(fd);
    if (!have_v6) cr_skip_test("no IPv6 loopback on this kernel");
    dt_store_server_t *s6 = NULL;
    cr_assert_eq(dt_store_server_start("::1", 0, &s6), DT_STATUS_OK, "%s", dt_error_detail());
    dt_store_t *st = NULL;
    cr_assert_eq(dt_store_connect("::1", dt_store_server_port(s6), 5.0, &st), DT_STATUS_OK, "%s",
                 dt_error_detail());
    cr_assert_eq(dt_store_set(st, "v6", "yes", 3), DT_STATUS_OK);
    char *v = get_str(st, "v6");
    cr_assert_str_eq(v, "yes");
    free(v);
    dt_store_close(st);
    dt_store_server_stop(s6);
}
