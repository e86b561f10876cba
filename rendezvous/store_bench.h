/*
 * store_bench.h - load drivers for the store benchmark (`dtrun bench store`):
 * one process, non-blocking sockets on epoll, speaking the wire protocol
 * directly so that the same driver measures our server and torch's TCPStore.
 */
#ifndef DT_RENDEZVOUS_STORE_BENCH_H
#define DT_RENDEZVOUS_STORE_BENCH_H

#include "common/status.h"

typedef struct dt_store_bench_barrier {
    double connect_s; /* all n connections established */
    double release_s; /* first request sent -> last STOP_WAITING received */
} dt_store_bench_barrier_t;

/* n connections each send VALIDATE, ADD(counter, 1) and WAIT(go); the one whose
 * ADD returns n SETs go. Raises RLIMIT_NOFILE as needed. Against IPv4 loopback,
 * more than DT_STORE_MAX_CONNS_PER_PEER / 2 connections come from several source
 * addresses (127.0.0.1, .2, ...), as clients on several hosts would. */
dt_status_t dt_store_bench_barrier(const char *host, int port, int n, double timeout_s,
                                   dt_store_bench_barrier_t *out);

/* nconns connections each loop SET(key, 32 bytes) + GET(key) for duration_s;
 * *per_s gets completed SET+GET round trips per second (all connections). */
dt_status_t dt_store_bench_setget(const char *host, int port, int nconns, double duration_s,
                                  double *per_s);

/* Raises the soft RLIMIT_NOFILE to at least want (up to the hard limit). */
dt_status_t dt_store_bench_raise_nofile(long want);

#endif /* DT_RENDEZVOUS_STORE_BENCH_H */
