/*
 * store_auth.h - who may talk to a store that has a token: the token file, the
 * challenge-response both sides run before any other command, and the addresses
 * from which unauthenticated clients (PyTorch's, under --exec) are let in.
 *
 * The token is a secret shared by the job's nodes in a file only its owner may
 * read (like ssh keys: a group- or world-accessible file is refused). The secret
 * never crosses the network; the exchange, right after connecting, is
 *
 *   client -> AUTH_HELLO  (u8 64, 32-byte client nonce)
 *   server <- 32-byte server nonce
 *   client -> AUTH_PROOF  (u8 65, HMAC(key, "dtrun-store-client" | sn | cn))
 *   server <- u8 1 and HMAC(key, "dtrun-store-server" | cn | sn)  (accepted; the
 *             client checks it, so a store without the token is found out too)
 *          or u8 0, then the server closes the connection (refused)
 *
 * where key = SHA-256 of the file's contents without trailing white space. Then
 * VALIDATE and the usual commands follow. A connection that sends anything else
 * first is closed and logged with its address, unless the store lets in clients
 * that cannot authenticate (--exec) and its address is one from which a client
 * has authenticated (a node of the job). Traffic is not encrypted.
 */
#ifndef DT_RENDEZVOUS_STORE_AUTH_H
#define DT_RENDEZVOUS_STORE_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/sha256.h" /* defines: DT_SHA256_BYTES */
#include "common/status.h"

/* The variable that names the token file (also how the agent tells its workers). */
#define DT_STORE_TOKEN_ENV "DTRUN_RDZV_TOKEN_FILE"
#define DT_STORE_AUTH_NONCE_BYTES 32
/* A token file larger than this is not a token. */
#define DT_STORE_TOKEN_MAX_BYTES 4096
/* Distinct node addresses remembered for unauthenticated (--exec) clients. */
#define DT_STORE_AUTH_MAX_PEERS 4096

typedef struct dt_store_token {
    uint8_t key[DT_SHA256_BYTES]; /* SHA-256 of the secret */
    char path[512];               /* the file it came from, for messages */
} dt_store_token_t;

/* Reads the token file at path: a regular file owned by this user, with no group
 * or other permission bits, 1..4096 bytes that are not all white space.
 * DT_STATUS_USAGE (exit 2) naming the file and what is wrong otherwise. */
dt_status_t dt_store_token_load(const char *path, dt_store_token_t *out);
/* Loads the file named by DTRUN_RDZV_TOKEN_FILE; *have = 0 when it is unset or empty. */
dt_status_t dt_store_token_from_env(dt_store_token_t *out, int *have);

/* The two proofs: the client's over (sn, cn), the server's over (cn, sn). */
void dt_store_auth_client_proof(const dt_store_token_t *t, const uint8_t *sn, const uint8_t *cn,
                                uint8_t out[DT_SHA256_BYTES]);
void dt_store_auth_server_proof(const dt_store_token_t *t, const uint8_t *cn, const uint8_t *sn,
                                uint8_t out[DT_SHA256_BYTES]);

/* ---- the server's side --------------------------------------------------- */

typedef struct dt_store_auth dt_store_auth_t;

/* allow_peers: let clients that cannot authenticate in from the addresses of
 * clients that did (for --exec workers). */
dt_store_auth_t *dt_store_auth_new(const dt_store_token_t *token, int allow_peers);
void dt_store_auth_free(dt_store_auth_t *a);

/* One connection's progress through the exchange. */
typedef struct dt_store_auth_conn {
    int state; /* DT_STORE_AUTH_* */
    uint8_t sn[DT_STORE_AUTH_NONCE_BYTES], cn[DT_STORE_AUTH_NONCE_BYTES];
} dt_store_auth_conn_t;

enum {
    DT_STORE_AUTH_NONE = 0,   /* nothing yet */
    DT_STORE_AUTH_HELLO,      /* nonce sent, proof awaited */
    DT_STORE_AUTH_OK,         /* proved it holds the token */
    DT_STORE_AUTH_PEER,       /* did not authenticate, let in by its address */
};

/* AUTH_HELLO: records the client nonce and fills reply with the server's. Fails
 * (reason filled) when the connection is past its first command. */
int dt_store_auth_hello(dt_store_auth_t *a, dt_store_auth_conn_t *c, const uint8_t *cn,
                        uint8_t reply[DT_STORE_AUTH_NONCE_BYTES], char *reason, size_t rlen);
/* AUTH_PROOF: 1 accepted (server_proof filled, peer remembered), 0 refused (reason). */
int dt_store_auth_proof(dt_store_auth_t *a, dt_store_auth_conn_t *c, const uint8_t *proof,
                        const struct sockaddr *peer, uint8_t server_proof[DT_SHA256_BYTES],
                        char *reason, size_t rlen);
/* Any other command: 1 when the connection may send it (authenticated, or let in
 * by its address), else 0 with the reason. */
int dt_store_auth_admit(dt_store_auth_t *a, dt_store_auth_conn_t *c, const struct sockaddr *peer,
                        char *reason, size_t rlen);

#endif /* DT_RENDEZVOUS_STORE_AUTH_H */
