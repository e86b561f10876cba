/*
 * store_harness.h - what the store server tests share (test_store.c,
 * test_store_clients.c): a server on 127.0.0.1 and an ephemeral port, started and
 * stopped around each test (the suites' .init / .fini), a connected client, a GET
 * that expects a NUL-terminated text value, EVENTUALLY (polls a condition the
 * server updates on its thread) and raw sockets (raw_*) that speak the wire
 * protocol directly where the blocking client would refuse to send something bad.
 */
#ifndef DT_TESTS_STORE_HARNESS_H
#define DT_TESTS_STORE_HARNESS_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"

static dt_store_server_t *srv;
static int port;

static inline void start_server(void) {
    dt_log_set_level(DT_LOG_ERROR);
    cr_assert_eq(dt_store_server_start("127.0.0.1", 0, &srv), DT_STATUS_OK, "%s",
                 dt_error_detail());
    port = dt_store_server_port(srv);
    cr_assert_gt(port, 0);
}

static inline void stop_server(void) {
    dt_store_server_stop(srv);
    srv = NULL;
}

static inline dt_store_t *connect_ok(void) {
    dt_store_t *st = NULL;
    cr_assert_eq(dt_store_connect("127.0.0.1", port, 5.0, &st), DT_STATUS_OK, "%s",
                 dt_error_detail());
    return st;
}

static inline char *get_str(dt_store_t *st, const char *key) {
    void *v = NULL;
    size_t n = 0;
    cr_assert_eq(dt_store_get(st, key, &v, &n), DT_STATUS_OK, "get %s: %s", key,
                 dt_error_detail());
    cr_assert_eq(strlen(v), n, "value is NUL-terminated at its length");
    return v;
}

/* Polls a condition the server updates on its thread (up to 5 s). */
#define EVENTUALLY(cond)                                                     \
    do {                                                                     \
        double until_ = dt_now_s() + 5.0;                                    \
        while (!(cond) && dt_now_s() < until_) dt_sleep_ms(5);               \
        cr_assert(cond, "never became true: " #cond);                        \
    } while (0)

/* ---- raw wire helpers ------------------------------------------------------- */

static inline int raw_connect(int p) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(p)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static inline void raw_send(int fd, const dt_store_buf_t *b) {
    cr_assert_eq(send(fd, b->data, b->len, MSG_NOSIGNAL), (ssize_t)b->len);
}

static inline void raw_recv(int fd, void *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)p + got, n - got, 0);
        cr_assert_gt(r, 0, "recv: %s", r < 0 ? strerror(errno) : "EOF");
        got += (size_t)r;
    }
}

/* The server closed this connection (EOF or reset) within the receive timeout. */
static inline void raw_expect_closed(int fd) {
    char c;
    ssize_t r;
    do {
        r = recv(fd, &c, 1, 0);
    } while (r > 0);
    cr_assert(r == 0 || errno == ECONNRESET, "expected close, got %s", strerror(errno));
}

/* Nothing arrives within ms milliseconds. */
static inline void raw_expect_silence(int fd, int ms) {
    struct timeval tv = {.tv_sec = 0, .tv_usec = ms * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    ssize_t r = recv(fd, &c, 1, 0);
    cr_assert(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "unexpected data/close");
    struct timeval tv5 = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv5, sizeof tv5);
}

static inline int raw_validated(void) {
    int fd = raw_connect(port);
    dt_store_buf_t b = {0};
    dt_store_encode_validate(&b);
    raw_send(fd, &b);
    dt_store_buf_free(&b);
    return fd;
}

#endif /* DT_TESTS_STORE_HARNESS_H */
