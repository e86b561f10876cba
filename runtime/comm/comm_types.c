/*
 * comm_types.c - the communicator's small vocabulary (comm.h): names of backends,
 * ops, reductions and dtypes, how a count is sliced over n ranks, bf16 <-> fp32,
 * and the reduction loops the host backends share (comm_impl.h), summing in a
 * fixed source order so every result is deterministic.
 */
#include <stdint.h>
#include <string.h>

#include "runtime/comm/comm_impl.h"

/* ---- names and helpers ------------------------------------------------------ */

#define NAME_(n, s) s,
static const char *const backend_names[] = {DT_COMM_BACKEND_MAP(NAME_)};
#undef NAME_

int dt_comm_backend_parse(const char *s) {
    if (!s) return -1;
    for (int i = 0; i < (int)(sizeof backend_names / sizeof backend_names[0]); i++)
        if (!strcmp(s, backend_names[i])) return i;
    return -1;
}

const char *dt_comm_backend_name(dt_comm_backend_t b) {
    return (unsigned)b < sizeof backend_names / sizeof backend_names[0] ? backend_names[b] : "unknown";
}

const char *dt_comm_op_name(dt_comm_op_t op) {
    switch (op) {
    case DT_COMM_OP_ALL_REDUCE: return "all_reduce";
    case DT_COMM_OP_REDUCE_SCATTER: return "reduce_scatter";
    case DT_COMM_OP_ALL_GATHER: return "all_gather";
    case DT_COMM_OP_BROADCAST: return "broadcast";
    case DT_COMM_OP_BARRIER: return "barrier";
    case DT_COMM_OP_SEND: return "send";
    case DT_COMM_OP_RECV: return "recv";
    }
    return "unknown";
}

const char *dt_comm_redop_name(dt_comm_redop_t r) {
    return r == DT_COMM_SUM ? "sum" : r == DT_COMM_AVG ? "avg" : r == DT_COMM_MAX ? "max" : "?";
}

size_t dt_comm_dtype_size(dt_comm_dtype_t d) { return d == DT_COMM_BF16 ? 2 : 4; }
const char *dt_comm_dtype_name(dt_comm_dtype_t d) { return d == DT_COMM_BF16 ? "bf16" : "f32"; }

size_t dt_comm_slice_count(size_t count, int n, int r) {
    return count / (size_t)n + ((size_t)r < count % (size_t)n ? 1 : 0);
}

size_t dt_comm_slice_offset(size_t count, int n, int r) {
    size_t q = count / (size_t)n, rem = count % (size_t)n;
    return (size_t)r * q + ((size_t)r < rem ? (size_t)r : rem);
}

uint16_t dt_comm_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float dt_comm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- reduction loops -------------------------------------------------------- */

void dt_comm_reduce_f32_(float *dst, const float *const *src, int nsrc, size_t n,
                         dt_comm_redop_t redop, int navg) {
    const float *a = src[0];
    if (nsrc == 1) {
        if (dst != a) memmove(dst, a, n * sizeof(float));
    } else if (redop == DT_COMM_MAX) {
        const float *b = src[1];
        for (size_t i = 0; i < n; i++) dst[i] = a[i] > b[i] ? a[i] : b[i];
        for (int k = 2; k < nsrc; k++) {
            const float *c = src[k];
            for (size_t i = 0; i < n; i++) dst[i] = dst[i] > c[i] ? dst[i] : c[i];
        }
    } else {
        const float *b = src[1];
        for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
        for (int k = 2; k < nsrc; k++) {
            const float *c = src[k];
            for (size_t i = 0; i < n; i++) dst[i] += c[i];
        }
    }
    if (redop == DT_COMM_AVG && navg > 0) {
        float d = (float)navg;
        for (size_t i = 0; i < n; i++) dst[i] /= d;
    }
}

void dt_comm_accum_bf16_(float *acc, const uint16_t *const *src, int nsrc, size_t n,
                         dt_comm_redop_t redop, int first) {
    for (int k = 0; k < nsrc; k++) {
        const uint16_t *s = src[k];
        if (first && k == 0) {
            for (size_t i = 0; i < n; i++) acc[i] = dt_comm_bf16_to_f32(s[i]);
        } else if (redop == DT_COMM_MAX) {
            for (size_t i = 0; i < n; i++) {
                float v = dt_comm_bf16_to_f32(s[i]);
                acc[i] = acc[i] > v ? acc[i] : v;
            }
        } else {
            for (size_t i = 0; i < n; i++) acc[i] += dt_comm_bf16_to_f32(s[i]);
        }
    }
}

void dt_comm_f32_to_bf16_n_(uint16_t *dst, const float *acc, size_t n, dt_comm_redop_t redop,
                            int navg) {
    if (redop == DT_COMM_AVG && navg > 0) {
        float d = (float)navg;
        for (size_t i = 0; i < n; i++) dst[i] = dt_comm_f32_to_bf16(acc[i] / d);
    } else {
        for (size_t i = 0; i < n; i++) dst[i] = dt_comm_f32_to_bf16(acc[i]);
    }
}

void dt_comm_bf16_to_f32_n_(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = dt_comm_bf16_to_f32(src[i]);
}
