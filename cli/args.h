/*
 * args.h - the number parsers of the subcommands' flags (private to cli/): each
 * takes the whole string, a number in [lo, hi] (finite: nan and inf are never
 * numbers here), and returns 0, or -1 leaving *out alone; the caller prints its
 * message naming the flag and exits 2.
 */
#ifndef DT_CLI_ARGS_H
#define DT_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>

/* A decimal integer ("42", "-1"). */
int dt_arg_int(const char *s, long lo, long hi, int *out);
/* A finite real number ("0.4", "1e-3"). */
int dt_arg_double(const char *s, double lo, double hi, double *out);
/* A real count with a decimal suffix k/K (1e3), M (1e6), B/G (1e9), T (1e12):
 * "7e9", "7B", "124M", "1.5T". */
int dt_arg_count(const char *s, double lo, double hi, double *out);
/* An unsigned integer with a decimal suffix K/k, M/m, G/g ("10M"; no sign, no
 * fraction). */
int dt_arg_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* Bytes: a non-negative number with a binary suffix K/k, M/m, G/g (1024^n) and an
 * optional B/b ("256M", "1.5KB"), truncated to whole bytes. */
int dt_arg_bytes(const char *s, size_t lo, size_t hi, size_t *out);
/* "1,2,4": up to max integers in [lo, hi] into out; returns how many, or -1. */
int dt_arg_int_list(const char *s, long lo, long hi, int *out, int max);

#endif /* DT_CLI_ARGS_H */
