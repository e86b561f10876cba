/*
 * sha256.h - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), written here from
 * the standards, for the store's challenge-response (rendezvous/store_auth.c).
 * Checked against the FIPS 180-4 examples and the RFC 4231 vectors
 * (tests/test_sha256.c). Not constant-time in its inputs' lengths, which are public.
 */
#ifndef DT_COMMON_SHA256_H
#define DT_COMMON_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define DT_SHA256_BYTES 32
#define DT_SHA256_BLOCK_BYTES 64

/* A running hash: init, update any number of times, final. */
typedef struct dt_sha256 {
    uint32_t h[8];
    uint64_t total;                       /* bytes hashed so far */
    uint8_t block[DT_SHA256_BLOCK_BYTES]; /* the partial block */
    size_t used;                          /* bytes in block */
} dt_sha256_ctx;

void dt_sha256_init(dt_sha256_ctx *c);
void dt_sha256_update(dt_sha256_ctx *c, const void *data, size_t n);
void dt_sha256_final(dt_sha256_ctx *c, uint8_t out[DT_SHA256_BYTES]);
/* One call: out = SHA-256(data). */
void dt_sha256(const void *data, size_t n, uint8_t out[DT_SHA256_BYTES]);

/* A running HMAC-SHA256 under one key (a key longer than a block is hashed first). */
typedef struct dt_hmac_sha256 {
    dt_sha256_ctx inner, outer;
} dt_hmac_sha256_ctx;

void dt_hmac_sha256_init(dt_hmac_sha256_ctx *c, const void *key, size_t klen);
void dt_hmac_sha256_update(dt_hmac_sha256_ctx *c, const void *data, size_t n);
void dt_hmac_sha256_final(dt_hmac_sha256_ctx *c, uint8_t out[DT_SHA256_BYTES]);
/* One call: out = HMAC-SHA256(key, data). */
void dt_hmac_sha256(const void *key, size_t klen, const void *data, size_t n,
                    uint8_t out[DT_SHA256_BYTES]);

/* 1 when a and b (n bytes each) are equal, in time that does not depend on where
 * they differ (for comparing MACs). */
int dt_mem_equal_ct(const void *a, const void *b, size_t n);

#endif /* DT_COMMON_SHA256_H */
