/*
 * cmd_store.c - `dtrun store` (hidden dev server) and `dtrun bench store`.
 *
 *   dtrun store [--host H] [--port P] [--token-file F]
 *       serves until SIGINT/SIGTERM; the first line of stdout is
 *       "dtrun store listening on H:PORT" (PORT is the bound one, useful with 0).
 *       H is 127.0.0.1 unless given: a store reachable from the network is a
 *       choice. With a token file only clients holding the token are served.
 *   dtrun bench store [--conns 64,1024,4096] [--connect HOST:PORT]
 *       barrier and SET/GET round-trip table, against our server started
 *       in-process on 127.0.0.1, or against any TCPStore server with --connect.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h" /* defines: dt_arg_int, dt_arg_int_list, dt_arg_double */
#include "cli/commands.h"
#include "common/log.h"
#include "rendezvous/store.h"
#include "rendezvous/store_auth.h"
#include "rendezvous/store_bench.h"

/* "--name value" or "--name=value"; advances *i past what it used. */
static const char *opt_value(int argc, char **argv, int *i, const char *name) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) return "";
    return argv[++*i];
}

static const char store_usage[] =
    "usage: dtrun store [--host HOST] [--port PORT] [--token-file FILE]\n"
    "  A rendezvous store alone (the c10d TCPStore protocol) until Ctrl-C.\n"
    "  --host HOST        default 127.0.0.1 (this machine only); 0.0.0.0 serves every interface\n"
    "  --port PORT        default 29500; 0 picks a free one (printed)\n"
    "  --token-file FILE  require the token of FILE (README \"Security\")\n";

static const char bench_store_usage[] =
    "usage: dtrun bench store [--conns 64,1024,4096] [--connect HOST:PORT] [--reps N] [--seconds S] [--timeout S]\n"
    "  The store's barrier and SET/GET round trips at each connection count.\n"
    "  --conns LIST        connection counts (default 64,1024,4096)\n"
    "  --connect HOST:PORT benchmark that server (e.g. torch's TCPStore) instead of one in-process\n"
    "  --reps N            repetitions, the median printed (1..100, default 3)\n"
    "  --seconds S         each SET/GET measurement's length, (0, 60] (default 0.5)\n"
    "  --timeout S         give up on a barrier after S seconds (default 60)\n";

int dt_cmd_store(int argc, char **argv) {
    const char *host = "127.0.0.1";
    int port = DT_STORE_DEFAULT_PORT;
    dt_store_token_t token;
    int have_token = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(store_usage, stdout);
            return DT_EXIT_OK;
        }
        if ((v = opt_value(argc, argv, &i, "--host"))) {
            if (!*v) goto usage;
            host = v;
        } else if ((v = opt_value(argc, argv, &i, "--token-file"))) {
            if (dt_store_token_load(v, &token) != DT_STATUS_OK) {
                fprintf(stderr, "dtrun store: %s\n", dt_error_detail());
                return DT_EXIT_USAGE;
            }
            have_token = 1;
        } else if ((v = opt_value(argc, argv, &i, "--port"))) {
            if (dt_arg_int(v, 0, 65535, &port) < 0) {
                fprintf(stderr, "dtrun store: --port wants 0..65535, got '%s'\n", v);
                return DT_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "dtrun store: unknown argument '%s'\n", argv[i]);
            goto usage;
        }
    }
    /* The server thread inherits this mask, so only sigwait() sees the signals. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    dt_store_server_t *srv;
    if (dt_store_server_start_auth(host, port, have_token ? &token : NULL, 0, &srv) !=
        DT_STATUS_OK) {
        fprintf(stderr, "dtrun store: %s\n", dt_error_detail());
        return DT_EXIT_NETWORK;
    }
    printf("dtrun store listening on %s:%d\n", host, dt_store_server_port(srv));
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    DT_LOG_INFO("store: %s received, %zu keys, %zu clients; stopping", strsignal(sig),
                dt_store_server_num_keys(srv), dt_store_server_num_clients(srv));
    dt_store_server_stop(srv);
    return DT_EXIT_OK;

usage:
    fputs(store_usage, stderr);
    return DT_EXIT_USAGE;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int dt_cmd_bench_store(int argc, char **argv) {
    int conns[16] = {64, 1024, 4096}, nconns = 3, reps = 3;
    double seconds = 0.5, timeout_s = 60.0;
    char host[256] = "127.0.0.1";
    int port = 0, external = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(bench_store_usage, stdout);
            return DT_EXIT_OK;
        }
        if ((v = opt_value(argc, argv, &i, "--conns"))) {
            nconns = dt_arg_int_list(v, 1, 16384, conns, 16);
            if (nconns < 0) {
                fprintf(stderr, "dtrun bench store: --conns wants N[,N...] in 1..16384, got "
                                "'%s'\n", v);
                return DT_EXIT_USAGE;
            }
        } else if ((v = opt_value(argc, argv, &i, "--connect"))) {
            const char *colon = strrchr(v, ':');
            if (!colon || colon == v || (size_t)(colon - v) >= sizeof host ||
                dt_arg_int(colon + 1, 0, 65535, &port) < 0 || port == 0) {
                fprintf(stderr, "dtrun bench store: --connect wants HOST:PORT, got '%s'\n", v);
                return DT_EXIT_USAGE;
            }
            size_t hl = (size_t)(colon - v);
            if (v[0] == '[' && hl >= 2 && v[hl - 1] == ']') {
                memcpy(host, v + 1, hl - 2);
                host[hl - 2] = '\0';
            } else {
                memcpy(host, v, hl);
                host[hl] = '\0';
            }
            external = 1;
        } else if ((v = opt_value(argc, argv, &i, "--reps"))) {
            if (dt_arg_int(v, 1, 100, &reps)) {
                fprintf(stderr, "dtrun bench store: --reps wants 1..100\n");
                return DT_EXIT_USAGE;
            }
        } else if ((v = opt_value(argc, argv, &i, "--timeout"))) {
            if (dt_arg_double(v, 0, 3600, &timeout_s) || !(timeout_s > 0)) {
                fprintf(stderr, "dtrun bench store: --timeout wants (0, 3600] seconds\n");
                return DT_EXIT_USAGE;
            }
        } else if ((v = opt_value(argc, argv, &i, "--seconds"))) {
            if (dt_arg_double(v, 0, 60, &seconds) || !(seconds > 0)) {
                fprintf(stderr, "dtrun bench store: --seconds wants (0, 60]\n");
                return DT_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "dtrun bench store: unknown argument '%s'\n%s", argv[i], bench_store_usage);
            return DT_EXIT_USAGE;
        }
    }
    dt_store_server_t *srv = NULL;
    if (!external) {
        if (dt_store_server_start("127.0.0.1", 0, &srv) != DT_STATUS_OK) {
            fprintf(stderr, "dtrun bench store: %s\n", dt_error_detail());
            return DT_EXIT_NETWORK;
        }
        port = dt_store_server_port(srv);
    }
    int rc = DT_EXIT_OK;
    printf("store benchmark: %s server at %s:%d (driver: one process, epoll)\n",
           external ? "external" : "dtrun in-process", host, port);
    printf("barrier = each connection sends VALIDATE + ADD(count) + WAIT(go); the last "
           "arrival SETs go; time from first send to last release (median of %d)\n", reps);
    printf("setget  = SET(key, 32 B) + GET(key) round trips per second over %.1f s (median "
           "of %d)\n\n", seconds, reps);
    printf("%-8s %6s %12s  %s\n", "test", "conns", "value", "unit");
    static const int rt_conns[] = {1, 16};
    for (int k = 0; k < 2 && rc == DT_EXIT_OK; k++) {
        double per_s[100];
        for (int r = 0; r < reps && rc == DT_EXIT_OK; r++) {
            if (dt_store_bench_setget(host, port, rt_conns[k], seconds, &per_s[r]) !=
                DT_STATUS_OK) {
                fprintf(stderr, "dtrun bench store: set/get with %d connections: %s\n",
                        rt_conns[k], dt_error_detail());
                rc = DT_EXIT_NETWORK;
            }
        }
        if (rc != DT_EXIT_OK) break;
        qsort(per_s, (size_t)reps, sizeof per_s[0], cmp_double);
        printf("%-8s %6d %12.0f  round trips/s\n", "setget", rt_conns[k], per_s[reps / 2]);
        fflush(stdout);
    }
    for (int k = 0; k < nconns && rc == DT_EXIT_OK; k++) {
        double rel[100], con[100];
        int done = 0, timed_out = 0;
        for (int r = 0; r < reps; r++) {
            dt_store_bench_barrier_t b;
            dt_status_t st = dt_store_bench_barrier(host, port, conns[k], timeout_s, &b);
            if (st == DT_STATUS_TIMEOUT) {
                /* A slow server is a result, not an error: report it and go on. */
                printf("%-8s %6d %12s  s: %s\n", "barrier", conns[k], "timeout",
                       dt_error_detail());
                timed_out = 1;
                break;
            }
            if (st != DT_STATUS_OK) {
                fprintf(stderr, "dtrun bench store: barrier with %d connections: %s\n",
                        conns[k], dt_error_detail());
                rc = DT_EXIT_NETWORK;
                break;
            }
            rel[done] = b.release_s;
            con[done] = b.connect_s;
            done++;
        }
        if (rc != DT_EXIT_OK || timed_out) continue;
        qsort(rel, (size_t)done, sizeof rel[0], cmp_double);
        qsort(con, (size_t)done, sizeof con[0], cmp_double);
        printf("%-8s %6d %12.6f  s released (connect %.4f s)\n", "barrier", conns[k],
               rel[done / 2], con[done / 2]);
        fflush(stdout);
    }
    dt_store_server_stop(srv);
    return rc;
}
