/*
 * test_store_auth.c - a store with a token over real loopback sockets: the token
 * file's checks (permissions, owner, kind, size), clients with the same token,
 * another token, none at all; raw sockets that skip or fake the exchange get a
 * close and nothing else; --exec's unauthenticated clients let in only from an
 * address where a client authenticated.
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"

static char dir[] = "/tmp/dt_auth_XXXXXX";

static void setup(void) {
    dt_log_set_level(DT_LOG_ERROR);
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) cr_log_warn("could not remove %s", dir);
}

TestSuite(store_auth, .init = setup, .fini = teardown, .timeout = 30);

/* Writes content to dir/name with mode; returns the path (static buffer per call site). */
static const char *token_file(const char *name, const char *content, mode_t mode, char *path) {
    sprintf(path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    close(fd);
    cr_assert_eq(chmod(path, mode), 0);
    return path;
}

static void load_ok(const char *name, const char *content, dt_store_token_t *t) {
    char p[256];
    cr_assert_eq(dt_store_token_load(token_file(name, content, 0600, p), t), DT_STATUS_OK, "%s",
                 dt_error_detail());
}

static dt_store_server_t *start(const dt_store_token_t *t, int allow_peers) {
    dt_store_server_t *srv = NULL;
    cr_assert_eq(dt_store_server_start_auth("127.0.0.1", 0, t, allow_peers, &srv), DT_STATUS_OK,
                 "%s", dt_error_detail());
    return srv;
}

static int raw_connect(int p) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(p)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Sends b, then reads until the server closes: returns the bytes that came first
 * (-1 when the connection stayed open 5 s). */
static ssize_t raw_reply_then_close(int fd, const dt_store_buf_t *b, uint8_t *got, size_t cap) {
    cr_assert_eq(send(fd, b->data, b->len, MSG_NOSIGNAL), (ssize_t)b->len);
    size_t n = 0;
    for (;;) {
        ssize_t r = recv(fd, got + n, cap - n, 0);
        if (r == 0) return (ssize_t)n;
        if (r < 0) return errno == ECONNRESET ? (ssize_t)n : -1;
        n += (size_t)r;
        if (n == cap) return -1;
    }
}

Test(store_auth, token_file_checks) {
    char p[256];
    dt_store_token_t t;
    cr_assert_eq(dt_store_token_load(token_file("g", "s3cret\n", 0640, p), &t), DT_STATUS_USAGE);
    cr_assert(strstr(dt_error_detail(), "chmod 600"), "%s", dt_error_detail());
    cr_assert_eq(dt_store_token_load(token_file("w", "s3cret\n", 0604, p), &t), DT_STATUS_USAGE);
    cr_assert(strstr(dt_error_detail(), "everyone"), "%s", dt_error_detail());
    cr_assert_eq(dt_store_token_load(token_file("e", " \n\n", 0600, p), &t), DT_STATUS_USAGE);
    cr_assert(strstr(dt_error_detail(), "empty"), "%s", dt_error_detail());
    sprintf(p, "%s/missing", dir);
    cr_assert_eq(dt_store_token_load(p, &t), DT_STATUS_USAGE);
    cr_assert_eq(dt_store_token_load(dir, &t), DT_STATUS_USAGE); /* a directory */
    sprintf(p, "%s/fifo", dir);
    cr_assert_eq(mkfifo(p, 0600), 0);
    cr_assert_eq(dt_store_token_load(p, &t), DT_STATUS_USAGE); /* refused, not a hang */
    cr_assert(strstr(dt_error_detail(), "not a regular file"), "%s", dt_error_detail());
    static char big[DT_STORE_TOKEN_MAX_BYTES + 2];
    memset(big, 'x', sizeof big - 1);
    cr_assert_eq(dt_store_token_load(token_file("big", big, 0600, p), &t), DT_STATUS_USAGE);
    /* Trailing white space is not part of the secret. */
    dt_store_token_t a, b;
    load_ok("a", "s3cret\n", &a);
    load_ok("b", "s3cret", &b);
    cr_assert(!memcmp(a.key, b.key, sizeof a.key));
    load_ok("c", "other", &b);
    cr_assert(memcmp(a.key, b.key, sizeof a.key));
}

Test(store_auth, same_token_works) {
    dt_store_token_t t, t2;
    load_ok("t", "shared secret\n", &t);
    load_ok("t2", "shared secret", &t2);
    dt_store_server_t *srv = start(&t, 0);
    dt_store_t *st = NULL;
    cr_assert_eq(dt_store_connect_auth("127.0.0.1", dt_store_server_port(srv), 5.0, &t2, &st),
                 DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_store_set(st, "/k", "v", 1), DT_STATUS_OK);
    void *v = NULL;
    size_t n = 0;
    cr_assert_eq(dt_store_get(st, "/k", &v, &n), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(n, 1);
    free(v);
    dt_store_close(st);
    dt_store_server_stop(srv);
}

Test(store_auth, other_token_refused_at_once) {
    dt_store_token_t t, bad;
    load_ok("t", "right", &t);
    load_ok("bad", "wrong", &bad);
    dt_store_server_t *srv = start(&t, 1);
    dt_store_t *st = NULL;
    double t0 = dt_now_s();
    cr_assert_eq(dt_store_connect_auth("127.0.0.1", dt_store_server_port(srv), 20.0, &bad, &st),
                 DT_STATUS_REFUSED, "%s", dt_error_detail());
    cr_assert_lt(dt_now_s() - t0, 10.0, "a refused token is not retried until the timeout");
    cr_assert(strstr(dt_error_detail(), "refused this node's token"), "%s", dt_error_detail());
    cr_assert_null(st);
    /* Nothing of it stayed: no key, and a right client still works. */
    cr_assert_eq(dt_store_connect_auth("127.0.0.1", dt_store_server_port(srv), 5.0, &t, &st),
                 DT_STATUS_OK, "%s", dt_error_detail());
    dt_store_close(st);
    dt_store_server_stop(srv);
}

Test(store_auth, client_without_token_gets_only_a_close) {
    dt_store_token_t t;
    load_ok("t", "right", &t);
    dt_store_server_t *srv = start(&t, 0);
    int port = dt_store_server_port(srv);
    /* torch's opening: VALIDATE then PING, then a SET: no reply, closed, nothing stored. */
    dt_store_buf_t b = {0};
    dt_store_encode_validate(&b);
    dt_store_encode_ping(&b, 0x1234);
    dt_store_encode_set(&b, DT_STORE_CMD_SET, "/x", 2, "y", 1);
    uint8_t got[64];
    int fd = raw_connect(port);
    cr_assert_eq(raw_reply_then_close(fd, &b, got, sizeof got), 0, "no byte before the close");
    close(fd);
    /* A fake proof without the hello, and a hello followed by garbage: closed too. */
    uint8_t zeros[32] = {0};
    b.len = 0;
    dt_store_encode_auth(&b, DT_STORE_CMD_AUTH_PROOF, zeros);
    fd = raw_connect(port);
    cr_assert_eq(raw_reply_then_close(fd, &b, got, sizeof got), 1, "only the verdict byte");
    cr_assert_eq(got[0], 0, "refused");
    close(fd);
    b.len = 0;
    dt_store_encode_auth(&b, DT_STORE_CMD_AUTH_HELLO, zeros);
    dt_store_encode_auth(&b, DT_STORE_CMD_AUTH_PROOF, zeros);
    fd = raw_connect(port);
    cr_assert_eq(raw_reply_then_close(fd, &b, got, sizeof got), 33, "nonce, then a 0 verdict");
    cr_assert_eq(got[32], 0);
    close(fd);
    cr_assert_eq(dt_store_server_num_keys(srv), 0);
    /* dtrun's own client without the token fails too (by timeout: it is not told why). */
    dt_store_t *st = NULL;
    cr_assert_neq(dt_store_connect("127.0.0.1", port, 1.0, &st), DT_STATUS_OK);
    dt_store_buf_free(&b);
    dt_store_server_stop(srv);
}

Test(store_auth, store_without_the_token_is_found_out) {
    dt_store_token_t t;
    load_ok("t", "right", &t);
    dt_store_server_t *srv = NULL;
    cr_assert_eq(dt_store_server_start("127.0.0.1", 0, &srv), DT_STATUS_OK);
    dt_store_t *st = NULL;
    cr_assert_neq(dt_store_connect_auth("127.0.0.1", dt_store_server_port(srv), 1.0, &t, &st),
                  DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "token"), "%s", dt_error_detail());
    dt_store_server_stop(srv);
}

/* A torch-style client (VALIDATE + PING, no token) from 127.0.0.1: 1 answered. */
static int torch_client_answered(int port) {
    dt_store_buf_t b = {0};
    dt_store_encode_validate(&b);
    dt_store_encode_ping(&b, 0xfeed);
    int fd = raw_connect(port);
    cr_assert_eq(send(fd, b.data, b.len, MSG_NOSIGNAL), (ssize_t)b.len);
    uint32_t echo = 0;
    ssize_t r = recv(fd, &echo, sizeof echo, MSG_WAITALL);
    close(fd);
    dt_store_buf_free(&b);
    return r == 4 && echo == 0xfeed;
}

Test(store_auth, exec_clients_only_from_joined_addresses) {
    dt_store_token_t t;
    load_ok("t", "right", &t);
    dt_store_server_t *srv = start(&t, 1), *strict = start(&t, 0);
    int port = dt_store_server_port(srv), sport = dt_store_server_port(strict);
    cr_assert(!torch_client_answered(port), "no node has joined from 127.0.0.1 yet");
    dt_store_t *st = NULL, *st2 = NULL;
    cr_assert_eq(dt_store_connect_auth("127.0.0.1", port, 5.0, &t, &st), DT_STATUS_OK);
    cr_assert_eq(dt_store_connect_auth("127.0.0.1", sport, 5.0, &t, &st2), DT_STATUS_OK);
    cr_assert(torch_client_answered(port), "a node authenticated from 127.0.0.1");
    cr_assert(!torch_client_answered(sport), "without allow_peers, never");
    dt_store_close(st);
    dt_store_close(st2);
    dt_store_server_stop(srv);
    dt_store_server_stop(strict);
}
