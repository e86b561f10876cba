/*
 * store_server_conn.c - one store connection's life on the loop thread: accept,
 * input, replies, close, and the sweep of connections that never sent VALIDATE.
 *
 * Per connection: unparsed input (only what did not form a whole frame; full
 * frames are served straight from the loop's read buffer), replies gathered in
 * an output buffer and written once per loop callback, and the list of its
 * pending waits. A WAIT never blocks the connection (CANCEL_WAIT must get
 * through); a GET or MULTI_GET of a missing key does: the frame stays unparsed
 * until its keys exist, then the connection resumes where it stopped.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/log.h"
#include "common/mem.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server_impl.h"

/* ---- replies and connection life ------------------------------------------- */

static void mark_dirty(client_t *c) {
    if (c->in_dirty) return;
    c->in_dirty = 1;
    c->dirty_next = c->srv->dirty;
    c->srv->dirty = c;
}

void dt_store_reply_raw_(client_t *c, const void *p, size_t n) {
    if (c->closing) return;
    dt_store_buf_put_raw(&c->out, p, n);
    mark_dirty(c);
}

void dt_store_reply_u8_(client_t *c, uint8_t v) { dt_store_reply_raw_(c, &v, 1); }
void dt_store_reply_i64_(client_t *c, int64_t v) { dt_store_reply_raw_(c, &v, 8); }

/* Value replies (never sent from a wake-up, so closing here is safe): one reply of
 * any size is fine, but not more than DT_STORE_MAX_UNSENT_BYTES waiting behind
 * earlier ones, nor past the budget of all connections' unsent replies. Small
 * replies are bounded by pausing reads instead (client_flush). */
void dt_store_reply_bytes_(client_t *c, const void *p, size_t n) {
    if (c->closing) return;
    size_t pending = c->out.len + uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    if (pending > 0 && pending + n > DT_STORE_MAX_UNSENT_BYTES) {
        dt_store_conn_close_(c, "client is not reading its replies (over 64 MiB unsent)");
        return;
    }
    if (c->srv->unsent + c->out.len + n > DT_STORE_MAX_UNSENT_TOTAL_BYTES) {
        dt_store_conn_close_(c, "the replies of all connections already hold 256 MiB unsent");
        return;
    }
    dt_store_buf_put_bytes(&c->out, p, n);
    mark_dirty(c);
}

static void on_client_closed(uv_handle_t *h) {
    client_t *c = (client_t *)h;
    dt_store_server_t *srv = c->srv;
    if (c->prev) c->prev->next = c->next;
    else srv->clients = c->next;
    if (c->next) c->next->prev = c->prev;
    atomic_fetch_sub(&srv->num_clients, 1);
    srv->buffered -= c->in.len;
    dt_store_buf_free(&c->in);
    dt_store_buf_free(&c->out);
    free(c);
}

/* "1.2.3.4:5" or "[::1]:5" of the peer, looked up only when a log line needs it. */
const char *dt_store_conn_addr_(client_t *c) {
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    char ip[INET6_ADDRSTRLEN] = "?";
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) != 0) return "?";
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        uv_ip6_name(a, ip, sizeof ip);
        snprintf(c->addr, sizeof c->addr, "[%s]:%d", ip, ntohs(a->sin6_port));
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        uv_ip4_name(a, ip, sizeof ip);
        snprintf(c->addr, sizeof c->addr, "%s:%d", ip, ntohs(a->sin_port));
    }
    return c->addr;
}

/* Closes one connection; reason (NULL for an orderly end) goes to the log. */
void dt_store_conn_close_(client_t *c, const char *reason) {
    if (c->closing) return;
    c->closing = 1;
    dt_store_conn_release_(c);
    if (reason)
        DT_LOG_WARN("store: closing connection from %s: %s", dt_store_conn_addr_(c), reason);
    while (c->reqs) dt_store_req_cancel_(c->srv, c->reqs);
    c->out.len = 0;
    uv_close((uv_handle_t *)&c->tcp, on_client_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* The client read enough of its replies: serve its input again. */
static void on_write_done(uv_write_t *req, int status) {
    write_req_t *w = (write_req_t *)req;
    client_t *c = w->client;
    c->srv->unsent -= w->len;
    if (status < 0 && status != UV_ECANCELED) {
        char why[128];
        snprintf(why, sizeof why, "write failed: %s", uv_strerror(status));
        dt_store_conn_close_(c, why);
    }
    free(w);
    if (c->read_paused && !c->closing &&
        uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) <= DT_STORE_READ_PAUSE_BYTES / 2) {
        c->read_paused = 0;
        int r = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
        if (r < 0) dt_store_conn_close_(c, uv_strerror(r));
    }
}

void dt_store_conn_flush_(client_t *c) {
    if (c->closing || c->out.len == 0) return;
    uv_buf_t b = uv_buf_init((char *)c->out.data, (unsigned)c->out.len);
    int r = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    size_t done = r > 0 ? (size_t)r : 0;
    if (r < 0 && r != UV_EAGAIN) {
        char why[128];
        snprintf(why, sizeof why, "write failed: %s", uv_strerror(r));
        dt_store_conn_close_(c, why);
        return;
    }
    if (done < c->out.len) {
        size_t left = c->out.len - done;

        write_req_t *w = dt_xmalloc(sizeof *w + left);
        w->client = c;
        w->len = left;
        memcpy(w->data, c->out.data + done, left);
        uv_buf_t wb = uv_buf_init((char *)w->data, (unsigned)left);
        int wr = uv_write(&w->req, (uv_stream_t *)&c->tcp, &wb, 1, on_write_done);
        if (wr < 0) {
            free(w);
            dt_store_conn_close_(c, "write could not be queued");
            return;
        }
        c->srv->unsent += left;
        /* Not reading its replies: read no more requests until it does. */
        if (!c->read_paused &&
            uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > DT_STORE_READ_PAUSE_BYTES) {
            uv_read_stop((uv_stream_t *)&c->tcp);
            c->read_paused = 1;
        }
    }
    c->out.len = 0;
    if (c->out.cap > (1u << 20)) dt_store_buf_free(&c->out);
}


/* Serves the whole frames at the start of buf; returns the bytes consumed. */
static size_t client_serve(client_t *c, const uint8_t *buf, size_t len) {
    size_t off = 0;
    c->need = 0;
    while (off < len && !c->closing && !c->blocked) {
        dt_store_frame_t f;
        size_t need = 0;
        char why[160];
        /* Judged on its first byte: a stranger's 1 GiB frame is never buffered
         * (the token exchange's fixed-size frames come before VALIDATE). */
        if (!c->validated && buf[off] != DT_STORE_CMD_VALIDATE &&
            buf[off] != DT_STORE_CMD_AUTH_HELLO && buf[off] != DT_STORE_CMD_AUTH_PROOF) {
            snprintf(why, sizeof why, "first command must be VALIDATE, got %s",
                     dt_store_cmd_name(buf[off]));
            dt_store_conn_close_(c, why);
            break;
        }
        dt_store_parse_result_t r = dt_store_parse(buf + off, len - off, &f, &need, why,
                                                   sizeof why);
        if (r == DT_STORE_PARSE_NEED_MORE) {
            if (need > DT_STORE_MAX_FRAME_BYTES) {
                dt_store_conn_close_(c, "request larger than 128 MiB");
                break;
            }
            c->need = need;
            break;
        }
        if (r == DT_STORE_PARSE_BAD) {
            char msg[256];
            snprintf(msg, sizeof msg, "bad frame: %s", why);
            dt_store_conn_close_(c, msg);
            break;
        }
        if (dt_store_handle_frame_(c, &f) != HANDLED) break;
        off += f.size;
    }
    return off;
}

/* Serves what is buffered in c->in (after new bytes or a wake-up). */
static void client_serve_buffered(client_t *c) {
    if (c->closing || c->blocked || c->in.len < c->need) return;
    size_t used = client_serve(c, c->in.data, c->in.len);
    if (!c->closing) {
        dt_store_buf_consume(&c->in, used);
        c->srv->buffered -= used;
    }
}

/* Buffers input that does not form a whole frame yet, within the connection's and
 * the server's budgets (0 when it did not fit and the client is closed). */
static int client_buffer(client_t *c, const uint8_t *p, size_t n) {
    dt_store_server_t *srv = c->srv;
    if (c->in.len + n > DT_STORE_MAX_FRAME_BYTES) {
        dt_store_conn_close_(c, "more than 128 MiB of unanswered input");
        return 0;
    }
    if (srv->buffered + n > DT_STORE_MAX_BUFFERED_BYTES) {
        dt_store_conn_close_(c, "the input buffered for all connections is at its 256 MiB budget");
        return 0;
    }
    dt_store_buf_put_raw(&c->in, p, n);
    srv->buffered += n;
    return 1;
}

/* Serves the connections that wake-ups resumed and writes every connection's
 * gathered replies: once per loop iteration, after all the input that one epoll
 * wait returned was served, so that the replies leave in one burst (a client
 * process with many connections is woken once for them, not once per reply). */
static void server_drain(dt_store_server_t *srv) {
    for (;;) {
        while (srv->resume) {
            client_t *c = srv->resume;
            srv->resume = c->resume_next;
            c->in_resume = 0;
            c->need = 0;
            client_serve_buffered(c);
        }
        if (!srv->dirty) break;
        while (srv->dirty) {
            client_t *c = srv->dirty;
            srv->dirty = c->dirty_next;
            c->in_dirty = 0;
            dt_store_conn_flush_(c);
        }
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    client_t *c = (client_t *)h;
    buf->base = (char *)c->srv->readbuf;
    buf->len = READ_BUF_BYTES;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    client_t *c = (client_t *)s;
    dt_store_server_t *srv = c->srv;
    srv->inputs++;
    if (nread < 0) {
        if (nread == UV_EOF || nread == UV_ECONNRESET) {
            if (dt_log_get_level() <= DT_LOG_DEBUG)
                DT_LOG_DEBUG("store: %s disconnected", dt_store_conn_addr_(c));
            dt_store_conn_close_(c, NULL);
        } else {
            char why[128];
            snprintf(why, sizeof why, "read failed: %s", uv_strerror((int)nread));
            dt_store_conn_close_(c, why);
        }
        return;
    }
    if (nread == 0 || c->closing) return;
    const uint8_t *data = (const uint8_t *)buf->base;
    size_t n = (size_t)nread;
    if (c->in.len == 0 && !c->blocked) {
        /* Fast path: whole frames straight from the read buffer. */
        size_t used = client_serve(c, data, n);
        if (!c->closing && used < n) client_buffer(c, data + used, n - used);
    } else if (client_buffer(c, data, n)) {
        client_serve_buffered(c);
    }
    if (!c->closing && c->in.len == 0 && c->in.cap > (1u << 20)) dt_store_buf_free(&c->in);
}

void dt_store_on_drain_(uv_check_t *h) { server_drain(h->data); }


void dt_store_on_connection_(uv_stream_t *listener, int status) {
    dt_store_server_t *srv = listener->data;
    srv->inputs++;
    if (status < 0) {
        DT_LOG_WARN("store: cannot accept a connection: %s (file descriptor limit %ld)",
                    uv_strerror(status), srv->fd_limit);
        return;
    }
    client_t *c = dt_xcalloc(1, sizeof *c);
    c->srv = srv;
    uv_tcp_init(&srv->loop, &c->tcp);
    c->next = srv->clients;
    if (srv->clients) srv->clients->prev = c;
    srv->clients = c;
    c->accepted_ms = uv_now(&srv->loop);
    atomic_fetch_add(&srv->num_clients, 1);
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) < 0) {
        dt_store_conn_close_(c, "accept failed");
        return;
    }
    int sl = sizeof c->peer;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->peer, &sl) != 0)
        c->peer.ss_family = 0;
    if (!dt_store_admit_conn_(c)) return;
    if (!srv->nodelay_known) {
        uv_os_fd_t fd;
        int v = 0;
        socklen_t vl = sizeof v;
        srv->nodelay_inherited = uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0 &&
                                 getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &vl) == 0 && v;
        srv->nodelay_known = 1;
    }
    if (!srv->nodelay_inherited) uv_tcp_nodelay(&c->tcp, 1);
    int r = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (r < 0) dt_store_conn_close_(c, uv_strerror(r));
}

/* Closes connections that did not send VALIDATE in time; one log line per sweep.
 * The unvalidated list is oldest first: the walk stops at the first one in time. */
void dt_store_on_sweep_(uv_timer_t *t) {
    dt_store_server_t *srv = t->data;
    uint64_t now = uv_now(&srv->loop);
    size_t n = 0;
    char one[64] = "";
    client_t *c;
    while ((c = srv->unval_head) != NULL &&
           now - c->accepted_ms >= (uint64_t)DT_STORE_VALIDATE_TIMEOUT_S * 1000) {
        if (!n) snprintf(one, sizeof one, "%s", dt_store_conn_addr_(c));
        n++;
        dt_store_conn_close_(c, NULL); /* leaves the list */
    }
    if (n)
        DT_LOG_WARN("store: closed %zu connection(s) that sent no VALIDATE within %d s "
                    "(one from %s)", n, DT_STORE_VALIDATE_TIMEOUT_S, one);
}
