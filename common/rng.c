/*
 * rng.c - xoshiro256** with splitmix64 seeding.
 */
#include "common/rng.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/random.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void dt_rng_seed(dt_rng *rng, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull + 0x632be59bd9b4e019ull);
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
}

uint64_t dt_rng_u64(dt_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t dt_rng_below(dt_rng *rng, uint64_t n) {
    /* Rejection sampling on the top of the range keeps it unbiased. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = dt_rng_u64(rng);
    } while (x >= limit);
    return x % n;
}

double dt_rng_uniform(dt_rng *rng) { return (double)(dt_rng_u64(rng) >> 11) * 0x1.0p-53; }

double dt_rng_normal(dt_rng *rng) {
    double u1 = dt_rng_uniform(rng);
    double u2 = dt_rng_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

dt_status_t dt_random_bytes(void *out, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom((char *)out + got, n - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return dt_error(DT_STATUS_SYS, "getrandom: %s", strerror(errno));
        got += (size_t)r;
    }
    return DT_STATUS_OK;
}
