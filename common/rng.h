/*
 * rng.h - a small deterministic random generator (xoshiro256**, seeded through
 * splitmix64). Its state is four words, so checkpoints can save and restore it
 * exactly; the same seed gives the same stream on every rank and machine.
 */
#ifndef DT_COMMON_RNG_H
#define DT_COMMON_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct dt_rng {
    uint64_t s[4];
} dt_rng;

/* Seeds from (seed, stream): different streams of one seed are independent. */
void dt_rng_seed(dt_rng *rng, uint64_t seed, uint64_t stream);
uint64_t dt_rng_u64(dt_rng *rng);
/* Uniform in [0, n) without modulo bias; n > 0. */
uint64_t dt_rng_below(dt_rng *rng, uint64_t n);
/* Uniform in [0, 1) with 53 random bits. */
double dt_rng_uniform(dt_rng *rng);
/* Standard normal (Box-Muller; no cached second value, so the state alone
 * determines the stream). */
double dt_rng_normal(dt_rng *rng);

/* n bytes from the kernel's random source (getrandom: nonces, run ids), not a
 * deterministic stream. DT_STATUS_SYS when the kernel has none. */
dt_status_t dt_random_bytes(void *out, size_t n);

#endif /* DT_COMMON_RNG_H */
