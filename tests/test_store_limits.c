/*
 * test_store_limits.c - what a hostile or broken client may cost the store server,
 * over real loopback sockets: a first frame other than VALIDATE is refused on its
 * first byte, a connection that never validates is closed after the deadline, a
 * client that floods PINGs and never reads is no longer read, the store refuses
 * writes once full, buffered input has a budget across connections, and one
 * address may hold DT_STORE_MAX_CONNS_PER_PEER connections. Each time the other
 * clients keep being served.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"

static dt_store_server_t *srv;
static int port;

static void start_server(void) {
    dt_log_set_level(getenv("STORE_LOG") ? DT_LOG_DEBUG : DT_LOG_ERROR);
    cr_assert_eq(dt_store_server_start("127.0.0.1", 0, &srv), DT_STATUS_OK, "%s",
                 dt_error_detail());
    port = dt_store_server_port(srv);
}

static void stop_server(void) {
    dt_store_server_stop(srv);
    srv = NULL;
}

TestSuite(store_limits, .init = start_server, .fini = stop_server, .timeout = 60);

static int raw_connect(int timeout_s) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static int raw_validated(void) {
    int fd = raw_connect(5);
    dt_store_buf_t b = {0};
    dt_store_encode_validate(&b);
    cr_assert_eq(send(fd, b.data, b.len, MSG_NOSIGNAL), (ssize_t)b.len);
    dt_store_buf_free(&b);
    return fd;
}

/* Seconds until the server closed fd (EOF or reset); -1 when it did not within
 * the socket's receive timeout. Replies before the close are skipped. */
static double seconds_to_close(int fd) {
    double t0 = dt_now_s();
    static char sink[1 << 16];
    ssize_t r;
    while ((r = recv(fd, sink, sizeof sink, 0)) > 0) {
    }
    if (r == 0 || errno == ECONNRESET) return dt_now_s() - t0;
    return -1;
}

/* A bystander's round trip still works. */
static void others_are_served(void) {
    dt_store_t *st = NULL;
    cr_assert_eq(dt_store_connect("127.0.0.1", port, 5.0, &st), DT_STATUS_OK, "%s",
                 dt_error_detail());
    cr_assert_eq(dt_store_set(st, "bystander", "1", 1), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_store_ping(st, NULL), DT_STATUS_OK);
    dt_store_close(st);
}

Test(store_limits, a_first_frame_other_than_validate_is_refused_on_its_first_byte) {
    /* The header of a MULTI_SET that announces 128 Ki pairs: before, the server
     * buffered the frame (up to 1 GiB) until it was whole. */
    int fd = raw_connect(3);
    dt_store_buf_t b = {0};
    dt_store_buf_put_u8(&b, DT_STORE_CMD_MULTI_SET);
    dt_store_buf_put_u64(&b, DT_STORE_MAX_KEYS_PER_REQUEST);
    dt_store_buf_put_bytes(&b, "k", 1);
    dt_store_buf_put_u64(&b, DT_STORE_MAX_VALUE_BYTES);
    cr_assert_eq(send(fd, b.data, b.len, MSG_NOSIGNAL), (ssize_t)b.len);
    cr_assert_geq(seconds_to_close(fd), 0, "a stranger's partial frame was kept open");
    close(fd);
    dt_store_buf_free(&b);
    others_are_served();
}

Test(store_limits, a_connection_that_never_validates_is_closed_after_the_deadline) {
    int fd = raw_connect(DT_STORE_VALIDATE_TIMEOUT_S + 10);
    double s = seconds_to_close(fd);
    cr_assert_geq(s, 0, "still open %d s after connecting without VALIDATE",
                  DT_STORE_VALIDATE_TIMEOUT_S + 10);
    cr_assert_geq(s, DT_STORE_VALIDATE_TIMEOUT_S - 1.0, "closed too early: %.1f s", s);
    close(fd);
    /* Half a VALIDATE frame is no better. */
    fd = raw_connect(DT_STORE_VALIDATE_TIMEOUT_S + 10);
    uint8_t half[2] = {DT_STORE_CMD_VALIDATE, 0xCE};
    cr_assert_eq(send(fd, half, 2, MSG_NOSIGNAL), 2);
    cr_assert_geq(seconds_to_close(fd), 0, "half a VALIDATE kept the connection open");
    close(fd);
    /* A validated client that stays idle is not touched. */
    fd = raw_validated();
    dt_sleep_ms((DT_STORE_VALIDATE_TIMEOUT_S + 2) * 1000);
    dt_store_buf_t b = {0};
    dt_store_encode_ping(&b, 77);
    cr_assert_eq(send(fd, b.data, b.len, MSG_NOSIGNAL), (ssize_t)b.len);
    uint32_t nonce = 0;
    cr_assert_eq(recv(fd, &nonce, 4, MSG_WAITALL), 4, "validated idle client was closed");
    cr_assert_eq(nonce, 77);
    close(fd);
    dt_store_buf_free(&b);
}

Test(store_limits, a_ping_flood_that_never_reads_is_not_read_either) {
    int fd = raw_validated();
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    /* 64 KiB of PINGs per send; before, the server read all of it and queued every
     * reply (225 MB in a second). Now it stops reading once replies queue up, so
     * the kernel's buffers fill and send() blocks long before 64 MiB. */
    dt_store_buf_t b = {0};
    while (b.len < 65000) dt_store_encode_ping(&b, 1);
    size_t sent = 0, cap = (size_t)64 << 20;
    double stuck_since = 0;
    while (sent < cap) {
        size_t at = sent % b.len; /* whole frames, even after a partial send */
        ssize_t r = send(fd, b.data + at, b.len - at, MSG_NOSIGNAL);
        if (r > 0) {
            sent += (size_t)r;
            stuck_since = 0;
            continue;
        }
        cr_assert(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "send: %s",
                  strerror(errno));
        if (stuck_since == 0) stuck_since = dt_now_s();
        if (dt_now_s() - stuck_since > 2.0) break;
        dt_sleep_ms(10);
    }
    cr_log_info("PING flood: %zu bytes accepted before the server stopped reading", sent);
    cr_assert_lt(sent, cap / 2, "the server kept reading %zu bytes of PINGs it cannot answer",
                 sent);
    others_are_served();
    close(fd);
    dt_store_buf_free(&b);
}

Test(store_limits, the_store_refuses_writes_once_full) {
    size_t big = DT_STORE_MAX_VALUE_BYTES;
    char *val = calloc(1, big);
    dt_store_t *st = NULL;
    cr_assert_eq(dt_store_connect("127.0.0.1", port, 5.0, &st), DT_STATUS_OK);
    cr_assert_eq(dt_store_set(st, "small", "1", 1), DT_STATUS_OK);
    size_t n = 0, most = DT_STORE_MAX_STORED_BYTES / big + 8;
    char key[32];
    for (; n < most; n++) {
        snprintf(key, sizeof key, "fill/%zu", n);
        if (dt_store_set(st, key, val, big) != DT_STATUS_OK) break;
        if (dt_store_ping(st, NULL) != DT_STATUS_OK) break; /* the SET was refused */
    }
    cr_log_info("store full after %zu values of 8 MiB", n);
    cr_assert_lt(n, most, "stored %zu x 8 MiB without a limit", n);
    cr_assert_geq(n, DT_STORE_MAX_STORED_BYTES / big - 2, "refused too early: %zu", n);
    dt_store_close(st);
    /* What it holds is still served, overwrites that do not grow it still work. */
    cr_assert_eq(dt_store_connect("127.0.0.1", port, 5.0, &st), DT_STATUS_OK);
    void *v = NULL;
    size_t len = 0;
    cr_assert_eq(dt_store_get(st, "fill/0", &v, &len), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(len, big);
    free(v);
    cr_assert_eq(dt_store_set(st, "small", "2", 1), DT_STATUS_OK);
    cr_assert_eq(dt_store_ping(st, NULL), DT_STATUS_OK);
    int deleted = 0;
    cr_assert_eq(dt_store_delete(st, "fill/0", &deleted), DT_STATUS_OK);
    cr_assert_eq(deleted, 1);
    /* Deleting made room again. */
    cr_assert_eq(dt_store_set(st, "again", val, big), DT_STATUS_OK);
    cr_assert_eq(dt_store_ping(st, NULL), DT_STATUS_OK, "room made by DELETE was not reused");
    dt_store_close(st);
    free(val);
}

/* APPEND counts what it adds, as SET does: values grown by APPEND fill the store to
 * the same limit, and a DELETE of an appended value gives back exactly its bytes (the
 * count never wraps below zero, which would refuse every later write). */
Test(store_limits, appended_bytes_count_against_the_limit) {
    size_t big = DT_STORE_MAX_VALUE_BYTES - 1;
    char *val = calloc(1, big);
    dt_store_t *st = NULL;
    cr_assert_eq(dt_store_connect("127.0.0.1", port, 5.0, &st), DT_STATUS_OK);
    /* SET 1 byte, APPEND 5000, DELETE: then small writes still go in */
    cr_assert_eq(dt_store_set(st, "k", "x", 1), DT_STATUS_OK);
    cr_assert_eq(dt_store_append(st, "k", val, 5000), DT_STATUS_OK);
    int deleted = 0;
    cr_assert_eq(dt_store_delete(st, "k", &deleted), DT_STATUS_OK);
    cr_assert_eq(deleted, 1);
    cr_assert_eq(dt_store_set(st, "after", "1", 1), DT_STATUS_OK);
    cr_assert_eq(dt_store_ping(st, NULL), DT_STATUS_OK, "a small SET after APPEND + DELETE was refused");
    /* 1 byte + APPEND of 8 MiB - 1 per key: refused near the limit, not after it */
    size_t n = 0, most = DT_STORE_MAX_STORED_BYTES / (big + 1) + 8;
    char key[32];
    for (; n < most; n++) {
        snprintf(key, sizeof key, "app/%zu", n);
        if (dt_store_set(st, key, "x", 1) != DT_STATUS_OK) break;
        if (dt_store_append(st, key, val, big) != DT_STATUS_OK) break;
        if (dt_store_ping(st, NULL) != DT_STATUS_OK) break; /* refused */
    }
    cr_log_info("store full after %zu appended values of 8 MiB", n);
    cr_assert_lt(n, most, "appended %zu x 8 MiB without a limit", n);
    dt_store_close(st);
    free(val);
}

Test(store_limits, buffered_input_has_a_budget_across_connections) {
    /* Three connections each send 12 of the 16 pairs of 8 MiB a MULTI_SET
     * announces: 300 MiB of incomplete input in all, over the 256 MiB budget.
     * Before, each connection could buffer 1 GiB. */
    enum { CONNS = 3, PAIRS_SENT = 12 };
    size_t big = DT_STORE_MAX_VALUE_BYTES;
    char *zeros = calloc(1, big);
    int fds[CONNS], closed = 0;
    for (int i = 0; i < CONNS; i++) {
        fds[i] = raw_validated();
        struct timeval tv = {.tv_sec = 2};
        setsockopt(fds[i], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        dt_store_buf_t b = {0};
        dt_store_buf_put_u8(&b, DT_STORE_CMD_MULTI_SET);
        dt_store_buf_put_u64(&b, 16);
        int ok = send(fds[i], b.data, b.len, MSG_NOSIGNAL) == (ssize_t)b.len;
        for (int p = 0; ok && p < PAIRS_SENT; p++) {
            b.len = 0;
            dt_store_buf_put_bytes(&b, "k", 1);
            dt_store_buf_put_u64(&b, big);
            ok = send(fds[i], b.data, b.len, MSG_NOSIGNAL) == (ssize_t)b.len &&
                 send(fds[i], zeros, big, MSG_NOSIGNAL) == (ssize_t)big;
        }
        if (!ok) closed++; /* reset by the server, or it stopped reading */
        dt_store_buf_free(&b);
    }
    /* Whatever send() saw, at least one of the three must have been closed. */
    int eof = 0;
    for (int i = 0; i < CONNS; i++) {
        struct timeval tv = {.tv_sec = 0, .tv_usec = 500 * 1000};
        setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char c;
        ssize_t r = recv(fds[i], &c, 1, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET)) eof++;
    }
    cr_log_info("budget: %d send failures, %d closed", closed, eof);
    cr_assert_geq(eof, 1, "300 MiB of incomplete input buffered over 3 connections");
    others_are_served();
    for (int i = 0; i < CONNS; i++) close(fds[i]);
    free(zeros);
}

Test(store_limits, connections_from_one_address_are_capped) {
    /* DT_STORE_MAX_CONNS_PER_PEER validated connections from 127.0.0.1 are served;
     * the next one is closed at once, and served again once one has gone. */
    enum { N = DT_STORE_MAX_CONNS_PER_PEER };
    static int fds[N];
    struct rlimit rl; /* both ends live in this process (the server raised the limit) */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 2 * N + 256)
        cr_skip_test("file descriptor limit %ld is below %d", (long)rl.rlim_cur, 2 * N + 256);
    for (int i = 0; i < N; i++) fds[i] = raw_validated();
    /* Every one of them was admitted: a PING on the last one is answered. */
    dt_store_buf_t b = {0};
    dt_store_encode_ping(&b, 5);
    cr_assert_eq(send(fds[N - 1], b.data, b.len, MSG_NOSIGNAL), (ssize_t)b.len);
    uint32_t nonce = 0;
    cr_assert_eq(recv(fds[N - 1], &nonce, 4, MSG_WAITALL), 4, "connection %d was refused", N);
    int extra = raw_validated();
    cr_assert_geq(seconds_to_close(extra), 0, "connection %d from one address was kept", N + 1);
    close(extra);
    close(fds[0]);
    double until = dt_now_s() + 5;
    while (dt_store_server_num_clients(srv) >= N && dt_now_s() < until) dt_sleep_ms(5);
    others_are_served();
    for (int i = 1; i < N; i++) close(fds[i]);
    dt_store_buf_free(&b);
}
