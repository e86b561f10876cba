/*
 * fuzz_store_server.c - libFuzzer target for the running store server: sequences
 * of frames over several connections at once (tests/fuzz/fuzz_store_frame.c covers
 * the parser alone). Built by `make fuzz-server` and the fuzz smoke test.
 *
 * One server runs on loopback for the whole session. An input is a script:
 *   byte 0           bit 0: every new connection starts with a valid VALIDATE
 *   then steps of    [sel][len][len bytes]
 *     sel bits 0-1   which of 4 connections (opened on first use)
 *     sel bit 2      close that connection after sending
 *     sel bit 3      read whatever replies are waiting on it
 * After the script every connection is closed. The server must then still answer
 * a fresh client's PING, and must have let go of every connection of the script
 * (a leak, a crash, a hang or a sanitizer report is a finding).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"

#define CONNS 4

static dt_store_server_t *srv;
static int port;

static int open_conn(int validate) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) abort();
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) abort();
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (validate) {
        dt_store_buf_t b = {0};
        dt_store_encode_validate(&b);
        if (send(fd, b.data, b.len, MSG_NOSIGNAL) != (ssize_t)b.len) abort();
        dt_store_buf_free(&b);
    }
    return fd;
}

/* Reads what is there without waiting (the server may have closed: fine). */
static void drain(int fd) {
    char buf[4096];
    while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    dt_log_set_level(DT_LOG_OFF); /* the script's refusals are expected */
    signal(SIGPIPE, SIG_IGN);     /* as dtrun's agent and `dtrun store` do: a closed peer is EPIPE */
    if (dt_store_server_start("127.0.0.1", 0, &srv) != DT_STATUS_OK) abort();
    port = dt_store_server_port(srv);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int validate = data[0] & 1;
    int fds[CONNS];
    for (int i = 0; i < CONNS; i++) fds[i] = -1;
    size_t off = 1;
    while (off + 2 <= size) {
        uint8_t sel = data[off], len = data[off + 1];
        off += 2;
        size_t n = len <= size - off ? len : size - off;
        int i = sel & (CONNS - 1);
        if (fds[i] < 0) fds[i] = open_conn(validate);
        /* A full socket buffer (the server stopped reading) drops the rest. */
        if (n) (void)send(fds[i], data + off, n, MSG_NOSIGNAL);
        off += n;
        if (sel & 8) drain(fds[i]);
        if (sel & 4) {
            close(fds[i]);
            fds[i] = -1;
        }
    }
    for (int i = 0; i < CONNS; i++)
        if (fds[i] >= 0) close(fds[i]);

    /* A bystander is served, and the script's connections are all let go. */
    dt_store_t *st = NULL;
    if (dt_store_connect("127.0.0.1", port, 5.0, &st) != DT_STATUS_OK) abort();
    if (dt_store_ping(st, NULL) != DT_STATUS_OK) abort();
    dt_store_close(st);
    double until = dt_now_s() + 5.0;
    while (dt_store_server_num_clients(srv) > 0) {
        if (dt_now_s() > until) abort();
        dt_sleep_ms(1);
    }
    return 0;
}
