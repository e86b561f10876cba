/*
 * store_client.c - the blocking TCPStore client (API in rendezvous/store.h).
 *
 * Every call is bounded by the client's timeout: sockets are non-blocking and
 * each send and receive waits in poll() for what is left of the deadline.
 * Connecting retries refused or unreachable endpoints with exponential backoff
 * and jitter until the deadline, then sends VALIDATE and a PING (as torch's
 * client does) so that a server whose backlog dropped us is retried too.
 * GET and MULTI_GET first WAIT for their keys, so a missing key is a timeout that
 * names it and leaves the connection usable (CANCEL_WAIT), not a stuck stream.
 * A timeout in the middle of any other reply leaves the stream out of step: the
 * connection is then marked broken and later calls fail with CLOSED.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rng.h" /* defines: dt_random_bytes */
#include "common/log.h"
#include "common/mem.h"
#include "common/status.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"

struct dt_store {
    int fd;
    double timeout_s;
    int broken;
    char endpoint[300];
    dt_store_buf_t buf;
    uint8_t rx[4096]; /* received, not yet consumed: rx[rx_pos..rx_len) */
    size_t rx_pos, rx_len;
};

/* ---- sockets with deadlines -------------------------------------------------- */

static int ms_left(double deadline) {
    double left = deadline - dt_now_s();
    if (left <= 0) return 0;
    if (left > 86400.0 * 24) return 86400 * 1000 * 24;
    return (int)(left * 1000.0) + 1;
}

/* Waits for events on fd until the deadline: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int ms = ms_left(deadline);
        int r = poll(&p, 1, ms);
        if (r > 0) return 1;
        if (r == 0) {
            if (ms == 0 || dt_now_s() >= deadline) return 0;
            continue;
        }
        if (errno != EINTR) return -1;
    }
}

static dt_status_t send_all(dt_store_t *st, const void *p, size_t n, double deadline) {
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = send(st->fd, b, n, MSG_NOSIGNAL);
        if (w > 0) {
            b += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int r = wait_fd(st->fd, POLLOUT, deadline);
            if (r == 0) {
                st->broken = 1;
                return dt_error(DT_STATUS_TIMEOUT, "store %s: send timed out after %.1f s",
                                st->endpoint, st->timeout_s);
            }
            if (r > 0) continue;
        }
        st->broken = 1;
        return dt_error(dt_status_from_errno(errno), "store %s: send failed: %s", st->endpoint,
                        strerror(errno));
    }
    return DT_STATUS_OK;
}

/* Receives exactly n bytes, first from what an earlier recv left in st->rx; a
 * timeout leaves the stream out of step (broken). ready says fd was just found
 * readable; otherwise it waits before its first recv (the reply to a request just
 * sent is rarely there yet: a poll and a recv, not a recv that fails, a poll and a
 * recv). Small replies land in st->rx, so a value's length and bytes, or several
 * replies, take one recv. */
static dt_status_t recv_ready(dt_store_t *st, void *p, size_t n, double deadline, int ready) {
    uint8_t *b = p;
    size_t have = st->rx_len - st->rx_pos;
    if (have) {
        size_t k = have < n ? have : n;
        memcpy(b, st->rx + st->rx_pos, k);
        st->rx_pos += k;
        b += k;
        n -= k;
    }
    while (n > 0) {
        if (!ready) {
            int w = wait_fd(st->fd, POLLIN, deadline);
            if (w == 0) {
                st->broken = 1;
                return dt_error(DT_STATUS_TIMEOUT, "store %s: no reply within %.1f s",
                                st->endpoint, st->timeout_s);
            }
            if (w < 0) break;
        }
        /* Large reads go straight to the caller's memory; small ones through st->rx. */
        int direct = n >= sizeof st->rx;
        size_t want = direct ? n : sizeof st->rx;
        ssize_t r = recv(st->fd, direct ? b : st->rx, want, 0);
        if (r > 0) {
            size_t k = (size_t)r;
            if (!direct) {
                st->rx_pos = k < n ? k : n;
                st->rx_len = k;
                memcpy(b, st->rx, st->rx_pos);
                k = st->rx_pos;
            }
            b += k;
            n -= k;
            ready = (size_t)r == want; /* a full read: more may be waiting */
            continue;
        }
        if (r == 0) {
            st->broken = 1;
            return dt_error(DT_STATUS_CLOSED, "store %s: the server closed the connection",
                            st->endpoint);
        }
        if (errno == EINTR) {
            ready = 1;
            continue;
        }
        ready = 0;
        if (errno != EAGAIN && errno != EWOULDBLOCK) break;
    }
    if (n == 0) return DT_STATUS_OK;
    st->broken = 1;
    return dt_error(dt_status_from_errno(errno), "store %s: receive failed: %s", st->endpoint,
                    strerror(errno));
}

static dt_status_t recv_all(dt_store_t *st, void *p, size_t n, double deadline) {
    return recv_ready(st, p, n, deadline, 0);
}

static double deadline_of(const dt_store_t *st) { return dt_now_s() + st->timeout_s; }

/* Checks the connection is usable and resets the request buffer. */
static dt_status_t begin(dt_store_t *st) {
    if (!st) return dt_error(DT_STATUS_INVALID, "store: NULL client");
    if (st->broken)
        return dt_error(DT_STATUS_CLOSED,
                        "store %s: connection unusable after an earlier failure",
                        st->endpoint);
    st->buf.len = 0;
    return DT_STATUS_OK;
}

static dt_status_t check_key(const dt_store_t *st, const char *key) {
    if (!key) return dt_error(DT_STATUS_INVALID, "store %s: NULL key", st->endpoint);
    size_t n = strlen(key);
    if (n > DT_STORE_MAX_KEY_BYTES)
        return dt_error(DT_STATUS_LIMIT, "store %s: key of %zu bytes exceeds the %u-byte limit",
                        st->endpoint, n, DT_STORE_MAX_KEY_BYTES);
    return DT_STATUS_OK;
}

static dt_status_t check_value(const dt_store_t *st, const void *v, size_t n) {
    if (n && !v) return dt_error(DT_STATUS_INVALID, "store %s: NULL value", st->endpoint);
    if (n > DT_STORE_MAX_VALUE_BYTES)
        return dt_error(DT_STATUS_LIMIT,
                        "store %s: value of %zu bytes exceeds the %u-byte limit", st->endpoint,
                        n, DT_STORE_MAX_VALUE_BYTES);
    return DT_STATUS_OK;
}

static dt_status_t check_keys(const dt_store_t *st, const char *const *keys, size_t n) {
    if (n > DT_STORE_MAX_KEYS_PER_REQUEST)
        return dt_error(DT_STATUS_LIMIT, "store %s: %zu keys exceed the %u-key limit",
                        st->endpoint, n, DT_STORE_MAX_KEYS_PER_REQUEST);
    if (n && !keys) return dt_error(DT_STATUS_INVALID, "store %s: NULL key list", st->endpoint);
    for (size_t i = 0; i < n; i++) DT_CHECK(check_key(st, keys[i]));
    return DT_STATUS_OK;
}

static dt_status_t flush(dt_store_t *st, double deadline) {
    return send_all(st, st->buf.data, st->buf.len, deadline);
}

/* Reads a uint64 length + bytes reply into a malloc'ed, NUL-terminated buffer. */
static dt_status_t recv_value(dt_store_t *st, void **val, size_t *len, double deadline) {
    uint64_t n;
    DT_CHECK(recv_all(st, &n, sizeof n, deadline));
    if (n > DT_STORE_MAX_VALUE_BYTES) {
        st->broken = 1;
        return dt_error(DT_STATUS_PROTOCOL, "store %s: reply announces %llu bytes",
                        st->endpoint, (unsigned long long)n);
    }
    uint8_t *p = dt_xmalloc((size_t)n + 1);
    dt_status_t s = recv_all(st, p, (size_t)n, deadline);
    if (s != DT_STATUS_OK) {
        free(p);
        return s;
    }
    p[n] = '\0';
    *val = p;
    if (len) *len = (size_t)n;
    return DT_STATUS_OK;
}

/* ---- connect ------------------------------------------------------------------ */

/* One non-blocking connect attempt to each resolved address, bounded by deadline. */
static int try_connect(const char *host, int port, double deadline, int *err) {
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int gr = getaddrinfo(host, ports, &hints, &ai);
    if (gr != 0) {
        *err = gr == EAI_SYSTEM ? errno : EHOSTUNREACH;
        if (gr == EAI_NONAME || gr == EAI_AGAIN || gr == EAI_FAIL) *err = -1; /* the name does not resolve */
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            *err = errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        if (errno == EINPROGRESS) {
            int r = wait_fd(fd, POLLOUT, deadline);
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (r > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
                break;
            *err = r == 0 ? ETIMEDOUT : soerr ? soerr : errno;
        } else {
            *err = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

/* The client's half of the token exchange (rendezvous/store_auth.h). REFUSED when
 * the store says the token is wrong or cannot prove it holds the token itself. */
static dt_status_t authenticate(dt_store_t *st, const dt_store_token_t *tok, double deadline) {
    uint8_t cn[DT_STORE_AUTH_NONCE_BYTES], sn[DT_STORE_AUTH_NONCE_BYTES];
    uint8_t mac[DT_SHA256_BYTES], want[DT_SHA256_BYTES], verdict = 0;
    DT_CHECK(dt_random_bytes(cn, sizeof cn));
    st->buf.len = 0;
    dt_store_encode_auth(&st->buf, DT_STORE_CMD_AUTH_HELLO, cn);
    DT_CHECK(flush(st, deadline));
    DT_CHECK(recv_all(st, sn, sizeof sn, deadline));
    dt_store_auth_client_proof(tok, sn, cn, mac);
    st->buf.len = 0;
    dt_store_encode_auth(&st->buf, DT_STORE_CMD_AUTH_PROOF, mac);
    DT_CHECK(flush(st, deadline));
    DT_CHECK(recv_all(st, &verdict, 1, deadline));
    if (verdict != 1)
        return dt_error(DT_STATUS_REFUSED,
                        "the store at %s refused this node's token (token_file %s): the nodes "
                        "of one job must share the same token", st->endpoint, tok->path);
    DT_CHECK(recv_all(st, mac, sizeof mac, deadline));
    dt_store_auth_server_proof(tok, cn, sn, want);
    if (!dt_mem_equal_ct(mac, want, sizeof want))
        return dt_error(DT_STATUS_REFUSED,
                        "the store at %s does not hold this node's token (token_file %s)",
                        st->endpoint, tok->path);
    return DT_STATUS_OK;
}

dt_status_t dt_store_connect(const char *host, int port, double timeout_s, dt_store_t **out) {
    return dt_store_connect_auth(host, port, timeout_s, NULL, out);
}

dt_status_t dt_store_connect_auth(const char *host, int port, double timeout_s,
                                  const dt_store_token_t *token, dt_store_t **out) {
    *out = NULL;
    if (!host || !*host) return dt_error(DT_STATUS_INVALID, "store: empty host");
    if (port <= 0 || port > 65535)
        return dt_error(DT_STATUS_INVALID, "store: port %d is outside 1..65535", port);
    if (!(timeout_s > 0)) return dt_error(DT_STATUS_INVALID, "store: timeout must be > 0");
    dt_store_t *st = dt_xcalloc(1, sizeof *st);
    st->fd = -1;
    st->timeout_s = timeout_s;
    if (strchr(host, ':')) snprintf(st->endpoint, sizeof st->endpoint, "[%s]:%d", host, port);
    else snprintf(st->endpoint, sizeof st->endpoint, "%s:%d", host, port);

    double start = dt_now_s(), deadline = start + timeout_s;
    double backoff = 0.01;
    unsigned seed = (unsigned)(dt_now_ns() ^ (uint64_t)getpid() * 2654435761u);
    int attempts = 0, err = 0;
    const char *stage = "connect";
    double report_every = dt_wait_report_s(), next_report = report_every < 2.0 ? report_every : 2.0;
    for (;;) {
        attempts++;
        st->fd = try_connect(host, port, deadline, &err);
        st->rx_pos = st->rx_len = 0;
        if (st->fd >= 0) {
            int one = 1;
            setsockopt(st->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            st->broken = 0;
            dt_status_t s = token ? authenticate(st, token, deadline) : DT_STATUS_OK;
            if (s == DT_STATUS_REFUSED) {
                /* A wrong token stays wrong: no retry (the detail is authenticate's). */
                close(st->fd);
                dt_store_buf_free(&st->buf);
                free(st);
                return s;
            }
            st->buf.len = 0;
            uint32_t nonce = (uint32_t)rand_r(&seed), echoed = 0;
            dt_store_encode_validate(&st->buf);
            dt_store_encode_ping(&st->buf, nonce);
            if (s == DT_STATUS_OK) s = flush(st, deadline);
            if (s == DT_STATUS_OK) s = recv_all(st, &echoed, sizeof echoed, deadline);
            if (s == DT_STATUS_OK && echoed == nonce) {
                *out = st;
                return DT_STATUS_OK;
            }
            stage = token ? "authentication or handshake (does the store have the token?)"
                          : "handshake";
            err = s == DT_STATUS_OK ? EPROTO : s == DT_STATUS_TIMEOUT ? ETIMEDOUT : ECONNRESET;
            close(st->fd);
            st->fd = -1;
        } else {
            stage = "connect";
        }
        double now = dt_now_s();
        if (now >= deadline) break;
        /* Not a word for a short race; then a line, and one every report interval
         * (DTRUN_WAIT_REPORT_S, default 30 s), so that a wait for a node that never
         * comes is never silent (a Kubernetes service name resolves only once its pod
         * runs; a SLURM node may fail to start). */
        if (now - start >= next_report) {
            if (err == -1)
                DT_LOG_WARN("store host '%s' does not resolve yet: retrying until the timeout (%.0f s of %.0f s; "
                            "a Kubernetes headless service's name appears once its pod runs)",
                            host, now - start, timeout_s);
            else
                DT_LOG_WARN("store at %s not reachable yet (%s error: %s): retrying until the timeout (%.0f s of %.0f s)",
                            st->endpoint, stage, strerror(err), now - start, timeout_s);
            next_report = now - start + report_every;
        }
        /* Full jitter around an exponentially growing delay, capped at 1 s. */
        double delay = backoff * (0.5 + (double)rand_r(&seed) / RAND_MAX);
        if (now + delay > deadline) delay = deadline - now;
        dt_sleep_ms((uint64_t)(delay * 1000.0) + 1);
        backoff = backoff * 2 > 1.0 ? 1.0 : backoff * 2;
        if (dt_now_s() >= deadline) {
            attempts++;
            break;
        }
    }
    dt_status_t s = dt_error(DT_STATUS_TIMEOUT,
                             "could not reach the store at %s within %.1f s (%d attempts, "
                             "last %s error: %s)",
                             st->endpoint, dt_now_s() - start, attempts, stage,
                             err == -1 ? "the host name does not resolve" : strerror(err));
    dt_store_buf_free(&st->buf);
    free(st);
    return s;
}

void dt_store_close(dt_store_t *st) {
    if (!st) return;
    if (st->fd >= 0) close(st->fd);
    dt_store_buf_free(&st->buf);
    free(st);
}

void dt_store_set_timeout(dt_store_t *st, double timeout_s) {
    if (st && timeout_s > 0) st->timeout_s = timeout_s;
}

/* ---- commands ----------------------------------------------------------------- */

dt_status_t dt_store_set(dt_store_t *st, const char *key, const void *val, size_t len) {
    DT_CHECK(begin(st));
    DT_CHECK(check_key(st, key));
    DT_CHECK(check_value(st, val, len));
    dt_store_encode_set(&st->buf, DT_STORE_CMD_SET, key, strlen(key), val, len);
    return flush(st, deadline_of(st));
}

dt_status_t dt_store_append(dt_store_t *st, const char *key, const void *val, size_t len) {
    DT_CHECK(begin(st));
    DT_CHECK(check_key(st, key));
    DT_CHECK(check_value(st, val, len));
    dt_store_encode_set(&st->buf, DT_STORE_CMD_APPEND, key, strlen(key), val, len);
    return flush(st, deadline_of(st));
}

/* Names the keys of the list that do not exist yet (CHECK per key, first 32). */
static void describe_missing(dt_store_t *st, const char *const *keys, size_t n, char *out,
                             size_t cap) {
    size_t used = 0, missing = 0, shown = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && i < 32; i++) {
        int ready = 0;
        if (dt_store_check(st, &keys[i], 1, &ready) != DT_STATUS_OK) {
            snprintf(out, cap, "(could not check which)");
            return;
        }
        if (ready) continue;
        missing++;
        if (used + strlen(keys[i]) + 8 < cap) {
            used += (size_t)snprintf(out + used, cap - used, "%s'%s'", shown ? ", " : "",
                                     keys[i]);
            shown++;
        }
    }
    if (n > 32 || shown < missing)
        snprintf(out + used, cap - used, "%s... (%zu keys asked)", used ? ", " : "", n);
}

dt_status_t dt_store_wait(dt_store_t *st, const char *const *keys, size_t n, double timeout_s) {
    DT_CHECK(begin(st));
    DT_CHECK(check_keys(st, keys, n));
    if (!(timeout_s > 0)) timeout_s = st->timeout_s;
    dt_store_encode_keys(&st->buf, DT_STORE_CMD_WAIT, keys, n);
    DT_CHECK(flush(st, deadline_of(st)));
    double wait_deadline = dt_now_s() + timeout_s;
    int r = st->rx_pos < st->rx_len ? 1 : wait_fd(st->fd, POLLIN, wait_deadline);
    uint8_t resp;
    if (r != 0) {
        DT_CHECK(recv_ready(st, &resp, 1, deadline_of(st), r > 0));
        if (resp != DT_STORE_WAIT_STOP_WAITING) {
            st->broken = 1;
            return dt_error(DT_STATUS_PROTOCOL, "store %s: WAIT got reply %u", st->endpoint,
                            resp);
        }
        return DT_STATUS_OK;
    }
    /* Timed out: cancel, then drain a STOP_WAITING that may have raced us. */
    st->buf.len = 0;
    dt_store_encode_simple(&st->buf, DT_STORE_CMD_CANCEL_WAIT);
    DT_CHECK(flush(st, deadline_of(st)));
    DT_CHECK(recv_all(st, &resp, 1, deadline_of(st)));
    if (resp == DT_STORE_WAIT_STOP_WAITING) {
        DT_CHECK(recv_all(st, &resp, 1, deadline_of(st)));
        if (resp != DT_STORE_WAIT_CANCELED) {
            st->broken = 1;
            return dt_error(DT_STATUS_PROTOCOL, "store %s: CANCEL_WAIT got reply %u",
                            st->endpoint, resp);
        }
        return DT_STATUS_OK; /* everything arrived just in time */
    }
    if (resp != DT_STORE_WAIT_CANCELED) {
        st->broken = 1;
        return dt_error(DT_STATUS_PROTOCOL, "store %s: CANCEL_WAIT got reply %u", st->endpoint,
                        resp);
    }
    char missing[700];
    describe_missing(st, keys, n, missing, sizeof missing);
    return dt_error(DT_STATUS_TIMEOUT, "store %s: timed out after %.1f s waiting for keys: %s",
                    st->endpoint, timeout_s, missing);
}

dt_status_t dt_store_get(dt_store_t *st, const char *key, void **val, size_t *len) {
    DT_CHECK(begin(st));
    DT_CHECK(check_key(st, key));
    DT_CHECK(dt_store_wait(st, &key, 1, st->timeout_s));
    DT_CHECK(begin(st));
    double deadline = deadline_of(st);
    dt_store_encode_key(&st->buf, DT_STORE_CMD_GET, key, strlen(key));
    DT_CHECK(flush(st, deadline));
    return recv_value(st, val, len, deadline);
}

dt_status_t dt_store_add(dt_store_t *st, const char *key, int64_t delta, int64_t *result) {
    DT_CHECK(begin(st));
    DT_CHECK(check_key(st, key));
    double deadline = deadline_of(st);
    dt_store_encode_add(&st->buf, key, strlen(key), delta);
    DT_CHECK(flush(st, deadline));
    int64_t v;
    DT_CHECK(recv_all(st, &v, sizeof v, deadline));
    if (result) *result = v;
    return DT_STATUS_OK;
}

dt_status_t dt_store_compare_set(dt_store_t *st, const char *key, const void *expected,
                                 size_t expected_len, const void *desired, size_t desired_len,
                                 void **result, size_t *result_len) {
    DT_CHECK(begin(st));
    DT_CHECK(check_key(st, key));
    DT_CHECK(check_value(st, expected, expected_len));
    DT_CHECK(check_value(st, desired, desired_len));
    double deadline = deadline_of(st);
    dt_store_encode_compare_set(&st->buf, key, strlen(key), expected, expected_len, desired,
                                desired_len);
    DT_CHECK(flush(st, deadline));
    void *v = NULL;
    size_t n = 0;
    DT_CHECK(recv_value(st, &v, &n, deadline));
    if (result) *result = v;
    else free(v);
    if (result_len) *result_len = n;
    return DT_STATUS_OK;
}

dt_status_t dt_store_check(dt_store_t *st, const char *const *keys, size_t n, int *ready) {
    DT_CHECK(begin(st));
    DT_CHECK(check_keys(st, keys, n));
    double deadline = deadline_of(st);
    dt_store_encode_keys(&st->buf, DT_STORE_CMD_CHECK, keys, n);
    DT_CHECK(flush(st, deadline));
    uint8_t r;
    DT_CHECK(recv_all(st, &r, 1, deadline));
    if (r > DT_STORE_CHECK_NOT_READY) {
        st->broken = 1;
        return dt_error(DT_STATUS_PROTOCOL, "store %s: CHECK got reply %u", st->endpoint, r);
    }
    *ready = r == DT_STORE_CHECK_READY;
    return DT_STATUS_OK;
}

static dt_status_t request_i64(dt_store_t *st, int64_t *out) {
    double deadline = deadline_of(st);
    DT_CHECK(flush(st, deadline));
    return recv_all(st, out, sizeof *out, deadline);
}

dt_status_t dt_store_num_keys(dt_store_t *st, int64_t *n) {
    DT_CHECK(begin(st));
    dt_store_encode_simple(&st->buf, DT_STORE_CMD_GETNUMKEYS);
    return request_i64(st, n);
}

dt_status_t dt_store_delete(dt_store_t *st, const char *key, int *deleted) {
    DT_CHECK(begin(st));
    DT_CHECK(check_key(st, key));
    dt_store_encode_key(&st->buf, DT_STORE_CMD_DELETE_KEY, key, strlen(key));
    int64_t n;
    DT_CHECK(request_i64(st, &n));
    if (deleted) *deleted = (int)n;
    return DT_STATUS_OK;
}

dt_status_t dt_store_multi_get(dt_store_t *st, const char *const *keys, size_t n, void **vals,
                               size_t *lens) {
    DT_CHECK(begin(st));
    DT_CHECK(check_keys(st, keys, n));
    DT_CHECK(dt_store_wait(st, keys, n, st->timeout_s));
    DT_CHECK(begin(st));
    double deadline = deadline_of(st);
    dt_store_encode_keys(&st->buf, DT_STORE_CMD_MULTI_GET, keys, n);
    DT_CHECK(flush(st, deadline));
    for (size_t i = 0; i < n; i++) vals[i] = NULL;
    for (size_t i = 0; i < n; i++) {
        dt_status_t s = recv_value(st, &vals[i], &lens[i], deadline);
        if (s != DT_STATUS_OK) {
            for (size_t j = 0; j < i; j++) {
                free(vals[j]);
                vals[j] = NULL;
            }
            return s;
        }
    }
    return DT_STATUS_OK;
}

dt_status_t dt_store_multi_set(dt_store_t *st, const char *const *keys, const void *const *vals,
                               const size_t *lens, size_t n) {
    DT_CHECK(begin(st));
    DT_CHECK(check_keys(st, keys, n));
    for (size_t i = 0; i < n; i++) DT_CHECK(check_value(st, vals[i], lens[i]));
    dt_store_encode_multi_set(&st->buf, keys, vals, lens, n);
    return flush(st, deadline_of(st));
}

dt_status_t dt_store_ping(dt_store_t *st, double *rtt_s) {
    DT_CHECK(begin(st));
    double t0 = dt_now_s(), deadline = t0 + st->timeout_s;
    uint32_t nonce = (uint32_t)(dt_now_ns() * 2654435761u), echoed = 0;
    dt_store_encode_ping(&st->buf, nonce);
    DT_CHECK(flush(st, deadline));
    DT_CHECK(recv_all(st, &echoed, sizeof echoed, deadline));
    if (echoed != nonce) {
        st->broken = 1;
        return dt_error(DT_STATUS_PROTOCOL, "store %s: PING echoed %u, sent %u", st->endpoint,
                        echoed, nonce);
    }
    if (rtt_s) *rtt_s = dt_now_s() - t0;
    return DT_STATUS_OK;
}
