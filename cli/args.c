/*
 * args.c - the flags' number parsers (args.h), one per kind of number, so that
 * every flag of every subcommand rejects the same things: a string that is not
 * entirely the number, one out of its flag's bounds, nan and inf.
 */
#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

int dt_arg_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int dt_arg_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

int dt_arg_count(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v)) return -1;
    switch (*end) {
    case 'k': case 'K': v *= 1e3; end++; break;
    case 'M': v *= 1e6; end++; break;
    case 'B': case 'G': v *= 1e9; end++; break;
    case 'T': v *= 1e12; end++; break;
    default: break;
    }
    if (*end || !isfinite(v) || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

int dt_arg_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (!*s || *s == '-' || *s == '+') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return -1;
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1000, end++;
    else if (*end == 'M' || *end == 'm') mul = 1000000, end++;
    else if (*end == 'G' || *end == 'g') mul = 1000000000, end++;
    if (*end || (mul > 1 && v > UINT64_MAX / mul)) return -1;
    v *= mul;
    if (v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int dt_arg_bytes(const char *s, size_t lo, size_t hi, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0) return -1;
    double m = 1;
    if (*end == 'K' || *end == 'k') m = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') m = 1024.0 * 1024.0, end++;
    else if (*end == 'G' || *end == 'g') m = 1024.0 * 1024.0 * 1024.0, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || !(v * m < 0x1p63)) return -1; /* beyond any buffer (and size_t's range) */
    size_t b = (size_t)(v * m);
    if (b < lo || b > hi) return -1;
    *out = b;
    return 0;
}

int dt_arg_int_list(const char *s, long lo, long hi, int *out, int max) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < lo || v > hi || n == max) return -1;
        out[n++] = (int)v;
        if (*end == ',') end++;
        else if (*end) return -1;
        p = end;
    }
    return n ? n : -1;
}
