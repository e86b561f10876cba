/*
 * store_auth.c - the token file, the challenge-response's proofs and the server's
 * per-connection checks (protocol in rendezvous/store_auth.h). The server's loop
 * calls in from store_server.c; the client's half of the exchange is in
 * store_client.c, which sends and receives with its own deadlines.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs_safe.h" /* defines: dt_fs_open_regular */
#include "common/mem.h"
#include "common/rng.h" /* defines: dt_random_bytes */
#include "rendezvous/store_auth.h"

/* A peer's address without its port: 16 bytes (IPv4 as ::ffff:a.b.c.d). */
typedef struct peer_ip {
    uint8_t b[16];
} peer_ip_t;

struct dt_store_auth {
    dt_store_token_t token;
    int allow_peers;
    peer_ip_t *peers;
    size_t npeers;
};

/* ---- the token file --------------------------------------------------------- */

dt_status_t dt_store_token_load(const char *path, dt_store_token_t *out) {
    dt_status_t st = DT_STATUS_OK;
    memset(out, 0, sizeof *out);
    if (!path || !*path) return dt_error(DT_STATUS_USAGE, "token_file: empty path");
    snprintf(out->path, sizeof out->path, "%s", path);
    int fd; /* a FIFO given as the token must not hang the open */
    struct stat sb;
    uint8_t buf[DT_STORE_TOKEN_MAX_BYTES + 1];
    if (dt_fs_open_regular(path, O_RDONLY, 0, &fd, &sb) != DT_STATUS_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dt_error_detail());
        return dt_error(DT_STATUS_USAGE, "token_file %s", why);
    }
    if (sb.st_mode & 077) {
        st = dt_error(DT_STATUS_USAGE,
                      "token_file %s: permissions %04o let %s read or change it; the token "
                      "must be readable by its owner only (chmod 600 %s)",
                      path, (unsigned)(sb.st_mode & 07777),
                      (sb.st_mode & 007) ? "everyone" : "the group", path);
        goto out_close_fd;
    }
    if (sb.st_uid != geteuid()) {
        st = dt_error(DT_STATUS_USAGE, "token_file %s: owned by uid %u, not by this user (uid %u)",
                      path, (unsigned)sb.st_uid, (unsigned)geteuid());
        goto out_close_fd;
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = dt_error(DT_STATUS_USAGE, "token_file %s: cannot read: %s", path,
                          strerror(errno));
            goto out_close_fd;
        }
        if (r == 0) break;
        n += (size_t)r;
        if (n == sizeof buf) break;
    }
    if (n > DT_STORE_TOKEN_MAX_BYTES) {
        st = dt_error(DT_STATUS_USAGE, "token_file %s: longer than %d bytes", path,
                      DT_STORE_TOKEN_MAX_BYTES);
        goto out_wipe;
    }
    /* Trailing white space (the newline `echo` adds) is not part of the secret. */
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' ||
                     buf[n - 1] == '\t'))
        n--;
    if (n == 0) {
        st = dt_error(DT_STATUS_USAGE, "token_file %s: empty", path);
        goto out_wipe;
    }
    dt_sha256(buf, n, out->key);
out_wipe:
    memset(buf, 0, sizeof buf);
out_close_fd:
    close(fd);
    return st;
}

dt_status_t dt_store_token_from_env(dt_store_token_t *out, int *have) {
    const char *p = getenv(DT_STORE_TOKEN_ENV);
    *have = 0;
    if (!p || !*p) return DT_STATUS_OK;
    DT_CHECK(dt_store_token_load(p, out));
    *have = 1;
    return DT_STATUS_OK;
}

/* ---- proofs ------------------------------------------------------------------ */

static void proof(const dt_store_token_t *t, const char *label, const uint8_t *x,
                  const uint8_t *y, uint8_t out[DT_SHA256_BYTES]) {
    dt_hmac_sha256_ctx c;
    dt_hmac_sha256_init(&c, t->key, sizeof t->key);
    dt_hmac_sha256_update(&c, label, strlen(label));
    dt_hmac_sha256_update(&c, x, DT_STORE_AUTH_NONCE_BYTES);
    dt_hmac_sha256_update(&c, y, DT_STORE_AUTH_NONCE_BYTES);
    dt_hmac_sha256_final(&c, out);
}

void dt_store_auth_client_proof(const dt_store_token_t *t, const uint8_t *sn, const uint8_t *cn,
                                uint8_t out[DT_SHA256_BYTES]) {
    proof(t, "dtrun-store-client", sn, cn, out);
}

void dt_store_auth_server_proof(const dt_store_token_t *t, const uint8_t *cn, const uint8_t *sn,
                                uint8_t out[DT_SHA256_BYTES]) {
    proof(t, "dtrun-store-server", cn, sn, out);
}

/* ---- the server's side --------------------------------------------------------- */

static int peer_ip(const struct sockaddr *sa, peer_ip_t *out) {
    memset(out, 0, sizeof *out);
    if (!sa) return -1;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        out->b[10] = out->b[11] = 0xff;
        memcpy(out->b + 12, &a->sin_addr, 4);
        return 0;
    }
    if (sa->sa_family == AF_INET6) {
        memcpy(out->b, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        return 0;
    }
    return -1;
}

static int peer_known(const dt_store_auth_t *a, const peer_ip_t *p) {
    for (size_t i = 0; i < a->npeers; i++)
        if (!memcmp(a->peers[i].b, p->b, 16)) return 1;
    return 0;
}

dt_store_auth_t *dt_store_auth_new(const dt_store_token_t *token, int allow_peers) {
    dt_store_auth_t *a = dt_xcalloc(1, sizeof *a);
    a->token = *token;
    a->allow_peers = allow_peers;
    return a;
}

void dt_store_auth_free(dt_store_auth_t *a) {
    if (!a) return;
    free(a->peers);
    memset(a, 0, sizeof *a);
    free(a);
}

int dt_store_auth_hello(dt_store_auth_t *a, dt_store_auth_conn_t *c, const uint8_t *cn,
                        uint8_t reply[DT_STORE_AUTH_NONCE_BYTES], char *reason, size_t rlen) {
    if (c->state != DT_STORE_AUTH_NONE) {
        snprintf(reason, rlen, "AUTH_HELLO after the connection's first command");
        return 0;
    }
    if (dt_random_bytes(c->sn, sizeof c->sn) != DT_STATUS_OK) {
        snprintf(reason, rlen, "no random nonce: %s", dt_error_detail());
        return 0;
    }
    memcpy(c->cn, cn, sizeof c->cn);
    memcpy(reply, c->sn, sizeof c->sn);
    c->state = DT_STORE_AUTH_HELLO;
    return 1;
}

int dt_store_auth_proof(dt_store_auth_t *a, dt_store_auth_conn_t *c, const uint8_t *prf,
                        const struct sockaddr *peer, uint8_t server_proof[DT_SHA256_BYTES],
                        char *reason, size_t rlen) {
    uint8_t want[DT_SHA256_BYTES];
    if (c->state != DT_STORE_AUTH_HELLO) {
        snprintf(reason, rlen, "AUTH_PROOF without AUTH_HELLO first");
        return 0;
    }
    dt_store_auth_client_proof(&a->token, c->sn, c->cn, want);
    if (!dt_mem_equal_ct(want, prf, sizeof want)) {
        snprintf(reason, rlen, "token refused (its proof does not match this store's token)");
        c->state = DT_STORE_AUTH_NONE;
        return 0;
    }
    c->state = DT_STORE_AUTH_OK;
    dt_store_auth_server_proof(&a->token, c->cn, c->sn, server_proof);
    peer_ip_t p;
    if (a->allow_peers && peer_ip(peer, &p) == 0 && !peer_known(a, &p) &&
        a->npeers < DT_STORE_AUTH_MAX_PEERS) {
        a->peers = dt_xrealloc(a->peers, (a->npeers + 1) * sizeof *a->peers);
        a->peers[a->npeers++] = p;
    }
    return 1;
}

int dt_store_auth_admit(dt_store_auth_t *a, dt_store_auth_conn_t *c, const struct sockaddr *peer,
                        char *reason, size_t rlen) {
    if (c->state == DT_STORE_AUTH_OK || c->state == DT_STORE_AUTH_PEER) return 1;
    if (c->state == DT_STORE_AUTH_HELLO) {
        snprintf(reason, rlen, "a command between AUTH_HELLO and AUTH_PROOF");
        return 0;
    }
    peer_ip_t p;
    if (a->allow_peers && peer_ip(peer, &p) == 0 && peer_known(a, &p)) {
        c->state = DT_STORE_AUTH_PEER;
        return 1;
    }
    snprintf(reason, rlen, "not authenticated: this store needs the job's token%s",
             a->allow_peers ? " (or a connection from a node that joined)" : "");
    return 0;
}
