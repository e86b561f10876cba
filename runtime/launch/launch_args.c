/*
 * launch_args.c - torchrun's launch flags, PET_<FLAG> variables and SLURM into a
 * dt_launch_spec_t.
 *
 * A table names every flag; the same table drives command-line parsing and the
 * PET_ lookup. Raw values are collected first (environment, then command line,
 * which wins), then interpreted and cross-checked in one place, so that a
 * contradiction can name both flags.
 */
#include "runtime/launch/launch_args.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/rng.h" /* defines: dt_random_bytes */
#include "common/gpuinfo.h" /* defines: dt_gpuinfo_count_visible */
#include "common/mem.h"
#include "common/meminfo.h" /* defines: dt_meminfo_cpus */

typedef enum flag_id {
    F_NNODES,
    F_NPROC,
    F_NODE_RANK,
    F_MASTER_ADDR,
    F_MASTER_PORT,
    F_RDZV_ENDPOINT,
    F_RDZV_ID,
    F_RDZV_CONF,
    F_RDZV_BACKEND,
    F_STANDALONE,
    F_MAX_RESTARTS,
    F_MONITOR_INTERVAL,
    F_LOG_DIR,
    F_REDIRECTS,
    F_TEE,
    F_RANKS_FILTER,
    F_LOCAL_ADDR,
    F_SHUTDOWN_TIMEOUT,
    F_PRINT_CONFIG,
    F_NO_PREFLIGHT,
    F_PREFLIGHT_MIN_BUSBW,
    F_COUNT_
} flag_id_t;

typedef struct flag_def {
    const char *name; /* underscore spelling, without "--" */
    int is_bool;      /* takes no value on the command line */
} flag_def_t;

static const flag_def_t flags[F_COUNT_] = {
    [F_NNODES] = {"nnodes", 0},
    [F_NPROC] = {"nproc_per_node", 0},
    [F_NODE_RANK] = {"node_rank", 0},
    [F_MASTER_ADDR] = {"master_addr", 0},
    [F_MASTER_PORT] = {"master_port", 0},
    [F_RDZV_ENDPOINT] = {"rdzv_endpoint", 0},
    [F_RDZV_ID] = {"rdzv_id", 0},
    [F_RDZV_CONF] = {"rdzv_conf", 0},
    [F_RDZV_BACKEND] = {"rdzv_backend", 0},
    [F_STANDALONE] = {"standalone", 1},
    [F_MAX_RESTARTS] = {"max_restarts", 0},
    [F_MONITOR_INTERVAL] = {"monitor_interval", 0},
    [F_LOG_DIR] = {"log_dir", 0},
    [F_REDIRECTS] = {"redirects", 0},
    [F_TEE] = {"tee", 0},
    [F_RANKS_FILTER] = {"local_ranks_filter", 0},
    [F_LOCAL_ADDR] = {"local_addr", 0},
    [F_SHUTDOWN_TIMEOUT] = {"shutdown_timeout", 0},
    [F_PRINT_CONFIG] = {"print_config", 1},
    [F_NO_PREFLIGHT] = {"no_preflight", 1},
    [F_PREFLIGHT_MIN_BUSBW] = {"preflight_min_busbw", 0},
};

typedef struct raw_args {
    const char *val[F_COUNT_];
    int from_cli[F_COUNT_];
} raw_args_t;

/* ---- small helpers ------------------------------------------------------ */

static const char *env_get(char **envp, const char *name) {
    size_t n = strlen(name);
    for (char **e = envp; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}

/* "--nproc-per-node" and "--nproc_per_node" both match "nproc_per_node". */
static int flag_name_eq(const char *arg, size_t len, const char *name) {
    if (strlen(name) != len) return 0;
    for (size_t i = 0; i < len; i++) {
        char c = arg[i] == '-' ? '_' : arg[i];
        if (c != name[i]) return 0;
    }
    return 1;
}

static dt_status_t parse_int(const char *flag, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return dt_error(DT_STATUS_USAGE, "--%s: expected an integer in [%ld, %ld], got '%s'",
                        flag, lo, hi, s);
    *out = (int)v;
    return DT_STATUS_OK;
}

static dt_status_t parse_seconds(const char *flag, const char *s, double lo, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !(v >= lo) || v > 1e7)
        return dt_error(DT_STATUS_USAGE, "--%s: expected a number of seconds >= %g, got '%s'",
                        flag, lo, s);
    *out = v;
    return DT_STATUS_OK;
}

static int truthy(const char *s) {
    return s && (!strcmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") ||
                 !strcasecmp(s, "on"));
}

static void add_note(dt_launch_spec_t *spec, const char *fmt, const char *a, const char *b) {
    if (spec->n_notes >= DT_LAUNCH_MAX_NOTES) return;
    snprintf(spec->notes[spec->n_notes++], sizeof spec->notes[0], fmt, a, b);
}

dt_status_t dt_launch_split_endpoint(const char *s, int default_port, char **host, int *port) {
    const char *colon = NULL;
    size_t hlen;
    const char *hstart = s;
    if (s[0] == '[') { /* [v6]:port */
        const char *close = strchr(s, ']');
        if (!close) return dt_error(DT_STATUS_USAGE, "bad endpoint '%s': missing ']'", s);
        hstart = s + 1;
        hlen = (size_t)(close - hstart);
        if (close[1] == ':') colon = close + 1;
        else if (close[1]) return dt_error(DT_STATUS_USAGE, "bad endpoint '%s'", s);
    } else {
        colon = strrchr(s, ':');
        if (colon && strchr(s, ':') != colon) { /* more than one ':': a bare IPv6 address */
            struct in6_addr a6;
            if (inet_pton(AF_INET6, s, &a6) != 1)
                return dt_error(DT_STATUS_USAGE,
                                "bad endpoint '%s': expected HOST:PORT, HOST or [IPv6]:PORT", s);
            colon = NULL;
        }
        hlen = colon ? (size_t)(colon - s) : strlen(s);
    }
    if (hlen == 0) return dt_error(DT_STATUS_USAGE, "bad endpoint '%s': no host", s);
    int p = default_port;
    if (colon) {
        dt_status_t st = parse_int("rdzv_endpoint port", colon + 1, 0, 65535, &p);
        if (st != DT_STATUS_OK)
            return dt_error(DT_STATUS_USAGE, "bad endpoint '%s': port must be 0-65535", s);
    }
    *host = dt_xmalloc(hlen + 1);
    memcpy(*host, hstart, hlen);
    (*host)[hlen] = '\0';
    *port = p;
    return DT_STATUS_OK;
}

/* "3" (all ranks) or "0:1,1:2" (per local rank); values 0..3. */
static dt_status_t parse_std_spec(const char *flag, const char *s, int *all, signed char *per) {
    if (strchr(s, ':') == NULL) {
        int v = 0;
        if (parse_int(flag, s, 0, 3, &v) != DT_STATUS_OK)
            return dt_error(DT_STATUS_USAGE,
                            "--%s: expected 0-3 (1 stdout, 2 stderr, 3 both) or "
                            "LOCAL_RANK:N,..., got '%s'", flag, s);
        *all = v;
        return DT_STATUS_OK;
    }
    char buf[512];
    if (strlen(s) >= sizeof buf) /* never cut: a cut list would start a different run */
        return dt_error(DT_STATUS_USAGE, "--%s is %zu characters long: at most %zu", flag, strlen(s),
                        sizeof buf - 1);
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *c = strchr(tok, ':');
        int r = 0, v = 0;
        if (!c) return dt_error(DT_STATUS_USAGE, "--%s: '%s' is not LOCAL_RANK:N", flag, tok);
        *c = '\0';
        if (parse_int(flag, tok, 0, DT_LAUNCH_MAX_LOCAL_RANKS - 1, &r) != DT_STATUS_OK ||
            parse_int(flag, c + 1, 0, 3, &v) != DT_STATUS_OK)
            return dt_error(DT_STATUS_USAGE, "--%s: bad entry '%s:%s' (LOCAL_RANK:0-3)", flag,
                            tok, c + 1);
        per[r] = (signed char)v;
    }
    return DT_STATUS_OK;
}

static dt_status_t parse_rdzv_conf(dt_launch_spec_t *spec, const char *s) {
    char buf[1024];
    if (strlen(s) >= sizeof buf) return dt_error(DT_STATUS_USAGE, "--rdzv_conf is too long");
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            return dt_error(DT_STATUS_USAGE, "--rdzv_conf: '%s' is not key=value", tok);
        *eq = '\0';
        const char *v = eq + 1;
        if (!strcmp(tok, "join_timeout")) {
            DT_CHECK(parse_seconds("rdzv_conf join_timeout", v, 0.001, &spec->join_timeout_s));
        } else if (!strcmp(tok, "last_call_timeout")) {
            DT_CHECK(parse_seconds("rdzv_conf last_call_timeout", v, 0, &spec->last_call_s));
        } else if (!strcmp(tok, "heartbeat_interval")) {
            DT_CHECK(parse_seconds("rdzv_conf heartbeat_interval", v, 0.01, &spec->heartbeat_s));
        } else if (!strcmp(tok, "token_file")) {
            free(spec->token_file);
            spec->token_file = dt_xstrdup(v);
        } else if (!strcmp(tok, "bind")) {
            if (!*v) return dt_error(DT_STATUS_USAGE, "--rdzv_conf bind: empty address");
            free(spec->bind_host);
            spec->bind_host = dt_xstrdup(v);
        } else if (!strcmp(tok, "read_timeout") || !strcmp(tok, "timeout") ||
                   !strcmp(tok, "is_host")) {
            /* torchrun keys with no meaning here: accepted and ignored. */
        } else {
            return dt_error(DT_STATUS_USAGE,
                            "--rdzv_conf: unknown key '%s' (known: join_timeout, "
                            "last_call_timeout, heartbeat_interval, token_file, bind)", tok);
        }
    }
    return DT_STATUS_OK;
}

/* The token file (--rdzv_conf token_file, else DTRUN_RDZV_TOKEN_FILE) is read and
 * checked now: a missing or group-readable one is bad usage before anything starts.
 * Its absolute path is what the workers are told (they may start elsewhere). */
static dt_status_t load_token(dt_launch_spec_t *spec, char **envp) {
    const char *v = env_get(envp, DT_STORE_TOKEN_ENV);
    if (!spec->token_file && v && *v) spec->token_file = dt_xstrdup(v);
    if (!spec->token_file) return DT_STATUS_OK;
    DT_CHECK(dt_store_token_load(spec->token_file, &spec->token));
    char *abs = realpath(spec->token_file, NULL);
    if (!abs) return dt_error(DT_STATUS_USAGE, "token_file %s: %s", spec->token_file, strerror(errno));
    free(spec->token_file);
    spec->token_file = abs;
    spec->have_token = 1;
    return DT_STATUS_OK;
}

dt_status_t dt_launch_slurm_first_host(const char *nodelist, char *buf, size_t len) {
    /* The first top-level item: commas inside brackets do not split. */
    size_t o = 0;
    int depth = 0;
    for (const char *p = nodelist; *p; p++) {
        if (*p == ',' && depth == 0) break;
        if (*p == '[') {
            depth++;
            /* Take the first number of the first range, keeping its padding. */
            p++;
            while (*p && *p != '-' && *p != ',' && *p != ']') {
                if (o + 1 >= len) goto out_too_long;
                buf[o++] = *p++;
            }
            while (*p && *p != ']') p++;
            if (!*p) return dt_error(DT_STATUS_USAGE, "bad SLURM node list '%s'", nodelist);
            depth--;
            continue;
        }
        if (o + 1 >= len) goto out_too_long;
        buf[o++] = *p;
    }
    if (o == 0) return dt_error(DT_STATUS_USAGE, "empty SLURM node list '%s'", nodelist);
    buf[o] = '\0';
    return DT_STATUS_OK;
out_too_long:
    return dt_error(DT_STATUS_USAGE, "SLURM node list '%s' has a host name too long", nodelist);
}

int dt_launch_count_gpus(char **envp) {
    int n = dt_gpuinfo_count_visible(env_get(envp, "CUDA_VISIBLE_DEVICES"));
    /* a SLURM allocation's GPUs on this node, when SLURM did not narrow
     * CUDA_VISIBLE_DEVICES itself (no GRES device constraint) */
    const char *g = env_get(envp, "SLURM_GPUS_ON_NODE");
    char *end;
    long sg = g && *g ? strtol(g, &end, 10) : -1;
    if (g && *g && !*end && sg >= 0 && sg < n) n = (int)sg;
    return n;
}

static void random_id(char *buf, size_t len) {
    unsigned char b[8];
    if (dt_random_bytes(b, sizeof b) != DT_STATUS_OK) {
        unsigned long x = (unsigned long)getpid() ^ (unsigned long)time(NULL);
        memcpy(b, &x, sizeof b < sizeof x ? sizeof b : sizeof x);
    }
    snprintf(buf, len, "%02x%02x%02x%02x-%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5],
             b[6], b[7]);
}

/* ---- the two passes ----------------------------------------------------- */

static dt_status_t collect_env(char **envp, raw_args_t *raw) {
    for (int f = 0; f < F_COUNT_; f++) {
        char name[64] = "PET_";
        size_t o = 4;
        for (const char *c = flags[f].name; *c && o + 1 < sizeof name; c++)
            name[o++] = (char)toupper((unsigned char)*c);
        name[o] = '\0';
        const char *v = env_get(envp, name);
        if (v && *v) raw->val[f] = v;
    }
    if (raw->val[F_STANDALONE] && !truthy(raw->val[F_STANDALONE])) raw->val[F_STANDALONE] = NULL;
    return DT_STATUS_OK;
}

/* s ends with suffix. */
static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Appends a as one shell word to buf (single-quoted unless plain). */
static void append_word(char *buf, size_t size, const char *a) {
    size_t o = strlen(buf);
    int plain = *a != '\0';
    for (const char *c = a; *c; c++)
        if (!isalnum((unsigned char)*c) && !strchr("_./:=,+@%-", *c)) plain = 0;
    if (o && o + 1 < size) buf[o++] = ' ';
    if (!plain && o + 1 < size) buf[o++] = '\'';
    for (const char *c = a; *c && o + 5 < size; c++) {
        if (*c == '\'' && !plain) {
            memcpy(buf + o, "'\\''", 4);
            o += 4;
        } else {
            buf[o++] = *c;
        }
    }
    if (!plain && o + 1 < size) buf[o++] = '\'';
    buf[o < size ? o : size - 1] = '\0';
}

/* torchrun's habit `torchrun train.py ...`: a Python program where dtrun takes a
 * config. The error gives the exact command that runs it once per rank (--exec). */
static dt_status_t program_not_config(int argc, char **argv, int at) {
    char cmd[768] = "";
    append_word(cmd, sizeof cmd, "dtrun");
    for (int k = 1; k < at; k++)
        if (strcmp(argv[k], "--no-python") && strcmp(argv[k], "--no_python")) append_word(cmd, sizeof cmd, argv[k]);
    append_word(cmd, sizeof cmd, "--exec");
    const char *py = getenv("PYTHON");
    append_word(cmd, sizeof cmd, py && *py ? py : "python3");
    for (int k = at; k < argc; k++) append_word(cmd, sizeof cmd, argv[k]);
    return dt_error(DT_STATUS_USAGE,
                    "%s is a program, not a config: dtrun runs a program once per rank with --exec, as in\n  %s",
                    argv[at], cmd);
}

/* Launch flags up to the config path, --exec or "bench". */
static dt_status_t collect_cli(int argc, char **argv, raw_args_t *raw, dt_launch_spec_t *spec) {
    int i = 1;
    int no_python = 0; /* torchrun's --no-python: the program follows, run as given */
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--exec")) {
            if (i + 1 >= argc)
                return dt_error(DT_STATUS_USAGE, "--exec needs a PROGRAM to run");
            spec->mode = DT_LAUNCH_MODE_EXEC;
            spec->prog_argv = argv + i + 1;
            spec->prog_argc = argc - i - 1;
            return DT_STATUS_OK;
        }
        if (!strcmp(a, "check") && !spec->check_only && spec->mode != DT_LAUNCH_MODE_CHECK) {
            /* `dtrun [flags] check [flags] [CONFIG.json]`: launch flags go on after it */
            spec->check_only = 1;
            if (i + 1 < argc && (!strcmp(argv[i + 1], "--help") || !strcmp(argv[i + 1], "-h"))) {
                spec->check_help = 1;
                spec->mode = DT_LAUNCH_MODE_CHECK;
                return DT_STATUS_OK;
            }
            continue;
        }
        if (strncmp(a, "--", 2) != 0) break;
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        int f = 0;
        while (f < F_COUNT_ && !flag_name_eq(name, nlen, flags[f].name)) f++;
        if (f == F_COUNT_) {
            if (flag_name_eq(name, nlen, "no_python") && !eq) { /* torchrun's: what --exec does */
                no_python = 1;
                continue;
            }
            return dt_error(DT_STATUS_USAGE, "unknown flag '%.*s' (see dtrun --help)",
                            (int)nlen + 2, a);
        }
        if (flags[f].is_bool) {
            if (eq && !truthy(eq + 1) && strcmp(eq + 1, "0") && strcasecmp(eq + 1, "false"))
                return dt_error(DT_STATUS_USAGE, "--%s takes no value (got '%s')",
                                flags[f].name, eq + 1);
            raw->val[f] = (eq && !truthy(eq + 1)) ? NULL : "1";
        } else if (eq) {
            raw->val[f] = eq + 1;
        } else {
            if (i + 1 >= argc) return dt_error(DT_STATUS_USAGE, "--%s needs a value", flags[f].name);
            raw->val[f] = argv[++i];
        }
        raw->from_cli[f] = 1;
    }
    if (i >= argc && spec->check_only) { /* check without a config: the launch only */
        spec->mode = DT_LAUNCH_MODE_CHECK;
        return DT_STATUS_OK;
    }
    if (i >= argc)
        return dt_error(DT_STATUS_USAGE,
                        "nothing to launch: give CONFIG.json, --exec PROGRAM or bench comm");
    if (spec->check_only && !strcmp(argv[i], "bench"))
        return dt_error(DT_STATUS_USAGE, "check takes a CONFIG.json (or nothing), not bench comm");
    if (!strcmp(argv[i], "bench")) {
        if (i + 1 >= argc || strcmp(argv[i + 1], "comm") != 0)
            return dt_error(DT_STATUS_USAGE, "after launch flags, 'bench' must be 'bench comm'");
        spec->mode = DT_LAUNCH_MODE_BENCH_COMM;
        spec->extra_argv = argv + i + 2;
        spec->extra_argc = argc - i - 2;
        return DT_STATUS_OK;
    }
    if (ends_with(argv[i], ".py")) return program_not_config(argc, argv, i);
    if (no_python && !spec->check_only && !ends_with(argv[i], ".json")) { /* torchrun --no-python PROG ARGS */
        spec->mode = DT_LAUNCH_MODE_EXEC;
        spec->prog_argv = argv + i;
        spec->prog_argc = argc - i;
        return DT_STATUS_OK;
    }
    spec->mode = DT_LAUNCH_MODE_CONFIG;
    spec->config_path = argv[i];
    spec->extra_argv = argv + i + 1;
    spec->extra_argc = argc - i - 1;
    for (int k = 0; k < spec->extra_argc; k++) {
        const char *kv = spec->extra_argv[k];
        if (!strncmp(kv, "--", 2))
            return dt_error(DT_STATUS_USAGE,
                            "launch flag '%s' after the config file: put launch flags before %s",
                            kv, spec->config_path);
        if (!strchr(kv, '=') || kv[0] == '=')
            return dt_error(DT_STATUS_USAGE, "'%s' after the config file is not KEY=VALUE", kv);
    }
    return DT_STATUS_OK;
}

static dt_status_t interpret(const raw_args_t *raw, char **envp, dt_launch_spec_t *spec) {
    const char *v;
    int slurm = env_get(envp, "SLURM_JOB_ID") != NULL;
    const char *step_nodes = slurm ? env_get(envp, "SLURM_STEP_NUM_NODES") : NULL;

    if ((v = raw->val[F_NNODES])) {
        const char *c = strchr(v, ':');
        if (c) {
            char lo[32];
            snprintf(lo, sizeof lo, "%.*s", (int)(c - v), v);
            DT_CHECK(parse_int("nnodes", lo, 1, 1 << 20, &spec->nnodes_min));
            DT_CHECK(parse_int("nnodes", c + 1, 1, 1 << 20, &spec->nnodes_max));
            if (spec->nnodes_min > spec->nnodes_max)
                return dt_error(DT_STATUS_USAGE, "--nnodes %s: MIN is larger than MAX", v);
        } else {
            DT_CHECK(parse_int("nnodes", v, 1, 1 << 20, &spec->nnodes_min));
            spec->nnodes_max = spec->nnodes_min;
        }
    } else if (slurm && !raw->val[F_STANDALONE]) {
        /* A job step (srun) has its own node count, node list and task count; the
         * batch script and salloc's shell have only the job's. */
        const char *n = step_nodes, *from = "SLURM_STEP_NUM_NODES";
        if (!n) n = env_get(envp, (from = "SLURM_NNODES"));
        if (!n) n = env_get(envp, (from = "SLURM_JOB_NUM_NODES"));
        if (n) {
            if (parse_int("nnodes", n, 1, 1 << 20, &spec->nnodes_min) != DT_STATUS_OK)
                return dt_error(DT_STATUS_USAGE, "%s='%s' is not a node count", from, n);
            spec->nnodes_max = spec->nnodes_min;
            if (!step_nodes && spec->nnodes_min > 1)
                return dt_error(DT_STATUS_USAGE,
                                "SLURM job %s has %d nodes but this is not a job step (no SLURM_STEP_NUM_NODES: "
                                "salloc's shell or a batch script): the other nodes would never join. Start one "
                                "dtrun per node with `srun --ntasks-per-node=1 dtrun ...` (scripts/slurm/train.sbatch "
                                "does), or give --nnodes 1 to train on this node alone",
                                env_get(envp, "SLURM_JOB_ID"), spec->nnodes_min);
            add_note(spec, "nnodes %s taken from %s", n, from);
        }
    }
    /* srun --ntasks-per-node=N dtrun: N agents per node, each a separate training
     * sharing the config's folders. dtrun is one agent per node; it starts the workers. */
    if (step_nodes && !raw->val[F_NNODES]) {
        const char *t = env_get(envp, "SLURM_STEP_NUM_TASKS");
        int tasks = 0, nodes = 0;
        if (t && parse_int("tasks", t, 1, 1 << 30, &tasks) == DT_STATUS_OK &&
            parse_int("nodes", step_nodes, 1, 1 << 20, &nodes) == DT_STATUS_OK && tasks > nodes)
            return dt_error(DT_STATUS_USAGE,
                            "srun started %d tasks on %d node(s) (SLURM_STEP_NUM_TASKS): each would be a separate "
                            "training. dtrun is one agent per node that starts the workers itself: use "
                            "`srun --ntasks-per-node=1 dtrun --nproc_per_node N ...`",
                            tasks, nodes);
    }

    v = raw->val[F_NPROC] ? raw->val[F_NPROC] : "1";
    if (!strcmp(v, "gpu") || !strcmp(v, "cpu") || !strcmp(v, "auto")) {
        int gpus = strcmp(v, "cpu") ? dt_launch_count_gpus(envp) : 0;
        long cpus = dt_meminfo_cpus(); /* the allocation's cpuset (SLURM, containers) */
        if (!strcmp(v, "gpu") && gpus == 0)
            return dt_error(DT_STATUS_USAGE,
                            "--nproc_per_node gpu: no GPU found (CUDA_VISIBLE_DEVICES, NVML)");
        if (gpus > 0 && strcmp(v, "cpu")) {
            spec->nproc_per_node = gpus;
            snprintf(spec->nproc_source, sizeof spec->nproc_source, "%s", strcmp(v, "auto") ? "gpu" : "auto(gpu)");
        } else {
            spec->nproc_per_node = cpus > 0 ? (int)cpus : 1;
            snprintf(spec->nproc_source, sizeof spec->nproc_source, "%s", strcmp(v, "auto") ? "cpu" : "auto(cpu)");
        }
        if (spec->nproc_per_node > DT_LAUNCH_MAX_LOCAL_RANKS)
            spec->nproc_per_node = DT_LAUNCH_MAX_LOCAL_RANKS;
    } else {
        if (parse_int("nproc_per_node", v, 1, DT_LAUNCH_MAX_LOCAL_RANKS, &spec->nproc_per_node) !=
            DT_STATUS_OK)
            return dt_error(DT_STATUS_USAGE,
                            "--nproc_per_node: expected N (1-%d), auto, gpu or cpu, got '%s'",
                            DT_LAUNCH_MAX_LOCAL_RANKS, v);
        snprintf(spec->nproc_source, sizeof spec->nproc_source, "N");
    }

    if ((v = raw->val[F_NODE_RANK])) {
        DT_CHECK(parse_int("node_rank", v, 0, (1 << 20) - 1, &spec->node_rank));
    } else if (slurm && !raw->val[F_STANDALONE] && (v = env_get(envp, "SLURM_NODEID"))) {
        if (parse_int("node_rank", v, 0, (1 << 20) - 1, &spec->node_rank) != DT_STATUS_OK)
            return dt_error(DT_STATUS_USAGE, "SLURM_NODEID='%s' is not a node rank", v);
        add_note(spec, "node rank %s taken from SLURM_NODEID%s", v, "");
    }
    if (spec->nnodes_max == 1 && spec->node_rank > 0)
        return dt_error(DT_STATUS_USAGE, "--node_rank %d is out of range for --nnodes 1",
                        spec->node_rank);

    spec->standalone = raw->val[F_STANDALONE] != NULL;
    spec->print_config = raw->val[F_PRINT_CONFIG] != NULL;
    spec->no_preflight = raw->val[F_NO_PREFLIGHT] != NULL;
    if ((v = raw->val[F_PREFLIGHT_MIN_BUSBW])) {
        char *end;
        errno = 0;
        double g = strtod(v, &end);
        if (!*v || *end || errno || !(g >= 0) || g > 1e5)
            return dt_error(DT_STATUS_USAGE, "--preflight_min_busbw: expected GB/s in [0, 100000], got '%s'", v);
        spec->preflight_min_busbw = g;
    }
    if (spec->check_only && spec->no_preflight)
        return dt_error(DT_STATUS_USAGE, "check contradicts --no-preflight: check is the preflight");
    int have_master = raw->val[F_MASTER_ADDR] || raw->val[F_MASTER_PORT];
    if (spec->standalone) {
        const int conflicts[] = {F_RDZV_ENDPOINT, F_MASTER_ADDR, F_MASTER_PORT};
        for (size_t k = 0; k < sizeof conflicts / sizeof conflicts[0]; k++)
            if (raw->val[conflicts[k]])
                return dt_error(DT_STATUS_USAGE,
                                "--standalone contradicts --%s: standalone picks its own "
                                "address and a free port", flags[conflicts[k]].name);
        if (spec->nnodes_max != 1)
            return dt_error(DT_STATUS_USAGE, "--standalone contradicts --nnodes %s: standalone is "
                            "one node", raw->val[F_NNODES] ? raw->val[F_NNODES] : "(SLURM)");
    }
    if (raw->val[F_MASTER_ADDR] && !*raw->val[F_MASTER_ADDR])
        return dt_error(DT_STATUS_USAGE,
                        "--master_addr is empty: give the store's host name or address");
    if (raw->val[F_RDZV_ENDPOINT] && have_master)
        return dt_error(DT_STATUS_USAGE,
                        "--rdzv_endpoint contradicts --%s: give the store's address once",
                        raw->val[F_MASTER_ADDR] ? "master_addr" : "master_port");

    if (raw->val[F_RDZV_ENDPOINT]) {
        DT_CHECK(dt_launch_split_endpoint(raw->val[F_RDZV_ENDPOINT], DT_LAUNCH_DEFAULT_RDZV_PORT,
                                          &spec->endpoint_host, &spec->endpoint_port));
        spec->endpoint_given = 1;
    } else if (have_master) {
        spec->endpoint_host = dt_xstrdup(raw->val[F_MASTER_ADDR] ? raw->val[F_MASTER_ADDR]
                                                                 : "127.0.0.1");
        spec->endpoint_port = DT_LAUNCH_DEFAULT_MASTER_PORT;
        if (raw->val[F_MASTER_PORT])
            DT_CHECK(parse_int("master_port", raw->val[F_MASTER_PORT], 0, 65535,
                               &spec->endpoint_port));
        spec->endpoint_given = 1;
    } else if (slurm && !spec->standalone && env_get(envp, "SLURM_JOB_NODELIST") &&
               spec->nnodes_max > 1) {
        /* the step's first host: its node rank 0 (srun -N2 -r1 skips the job's first) */
        char host[256];
        const char *list = env_get(envp, "SLURM_STEP_NODELIST"), *lname = "SLURM_STEP_NODELIST";
        if (!list) list = env_get(envp, (lname = "SLURM_JOB_NODELIST"));
        DT_CHECK(dt_launch_slurm_first_host(list, host, sizeof host));
        spec->endpoint_host = dt_xstrdup(host);
        /* A port from the job id: jobs sharing a node do not collide. */
        spec->endpoint_port = 15000 + (int)(strtoul(env_get(envp, "SLURM_JOB_ID"), NULL, 10) % 20000);
        spec->endpoint_given = 1;
        char port[16];
        snprintf(port, sizeof port, "%d", spec->endpoint_port);
        char note[384];
        snprintf(note, sizeof note, "store at %s:%s (first host of %s, port from SLURM_JOB_ID)", host, port, lname);
        add_note(spec, "%s%s", note, "");
    } else if (spec->standalone || spec->nnodes_max == 1) {
        /* One node and no address given: loopback and a free port, never a fixed one. */
        spec->endpoint_host = dt_xstrdup("127.0.0.1");
        spec->endpoint_port = 0;
    } else {
        spec->endpoint_host = dt_xstrdup("127.0.0.1");
        spec->endpoint_port = DT_LAUNCH_DEFAULT_MASTER_PORT;
    }
    if (spec->nnodes_max > 1 && spec->endpoint_port == 0)
        return dt_error(DT_STATUS_USAGE,
                        "port 0 in the endpoint needs --nnodes 1: other nodes could not find it");

    if ((v = raw->val[F_RDZV_ID])) {
        if (!*v || strlen(v) > 128 || strpbrk(v, "/ \t\n"))
            return dt_error(DT_STATUS_USAGE, "--rdzv_id '%s': 1-128 characters, no '/' or spaces", v);
        spec->rdzv_id = dt_xstrdup(v);
    } else if (spec->standalone || (spec->nnodes_max == 1 && !spec->endpoint_given)) {
        char id[32];
        random_id(id, sizeof id);
        spec->rdzv_id = dt_xstrdup(id);
    } else if (slurm && env_get(envp, "SLURM_JOB_ID")) {
        spec->rdzv_id = dt_xstrdup(env_get(envp, "SLURM_JOB_ID"));
    } else {
        spec->rdzv_id = dt_xstrdup("none");
    }
    if ((v = raw->val[F_RDZV_CONF])) DT_CHECK(parse_rdzv_conf(spec, v));
    DT_CHECK(load_token(spec, envp));
    if ((v = raw->val[F_RDZV_BACKEND]) && strcmp(v, "c10d") && strcmp(v, "static"))
        return dt_error(DT_STATUS_USAGE,
                        "--rdzv_backend '%s': dtrun has its own rendezvous (c10d or static "
                        "accepted, both mean it)", v);

    if ((v = raw->val[F_MAX_RESTARTS])) DT_CHECK(parse_int("max_restarts", v, 0, 1000000, &spec->max_restarts));
    if ((v = raw->val[F_MONITOR_INTERVAL]))
        DT_CHECK(parse_seconds("monitor_interval", v, 0.001, &spec->monitor_interval_s));
    if ((v = env_get(envp, "DTRUN_SHUTDOWN_TIMEOUT")) &&
        parse_seconds("shutdown_timeout", v, 0, &spec->shutdown_timeout_s) != DT_STATUS_OK)
        return dt_error(DT_STATUS_USAGE, "DTRUN_SHUTDOWN_TIMEOUT='%s' is not a number of seconds", v);
    if ((v = raw->val[F_SHUTDOWN_TIMEOUT]))
        DT_CHECK(parse_seconds("shutdown_timeout", v, 0, &spec->shutdown_timeout_s));

    if ((v = raw->val[F_LOG_DIR])) {
        if (!*v) return dt_error(DT_STATUS_USAGE, "--log_dir is empty");
        spec->log_dir = dt_xstrdup(v);
    }
    if ((v = raw->val[F_REDIRECTS])) DT_CHECK(parse_std_spec("redirects", v, &spec->redirects_all, spec->redirects));
    if ((v = raw->val[F_TEE])) DT_CHECK(parse_std_spec("tee", v, &spec->tee_all, spec->tee));
    /* --log_dir alone: keep the console and write the files too. */
    if (spec->log_dir && !raw->val[F_REDIRECTS] && !raw->val[F_TEE]) spec->tee_all = DT_STD_ALL;

    if ((v = raw->val[F_RANKS_FILTER])) {
        char buf[4096];
        if (strlen(v) >= sizeof buf)
            return dt_error(DT_STATUS_USAGE, "--local_ranks_filter is %zu characters long: at most %zu",
                            strlen(v), sizeof buf - 1);
        snprintf(buf, sizeof buf, "%s", v);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            int r = 0;
            if (parse_int("local_ranks_filter", tok, 0, DT_LAUNCH_MAX_LOCAL_RANKS - 1, &r) != DT_STATUS_OK)
                return dt_error(DT_STATUS_USAGE,
                                "--local_ranks_filter must be a comma-separated list of local "
                                "ranks, e.g. 0,1,2 (got '%s')", v);
            if (spec->ranks_filter_n < DT_LAUNCH_MAX_LOCAL_RANKS)
                spec->ranks_filter[spec->ranks_filter_n++] = r;
        }
        if (spec->ranks_filter_n == 0)
            return dt_error(DT_STATUS_USAGE, "--local_ranks_filter is empty");
    }
    if ((v = raw->val[F_LOCAL_ADDR])) {
        if (!*v) return dt_error(DT_STATUS_USAGE, "--local_addr is empty");
        spec->local_addr = dt_xstrdup(v);
    }
    return DT_STATUS_OK;
}

/* What a launch is when no flag, PET_ or SLURM_ variable says otherwise. */
static void spec_defaults(dt_launch_spec_t *spec) {
    memset(spec, 0, sizeof *spec);
    spec->nnodes_min = spec->nnodes_max = 1;
    spec->node_rank = -1;
    spec->join_timeout_s = 600;
    spec->last_call_s = 1;
    spec->heartbeat_s = 1;
    spec->monitor_interval_s = 0.1;
    spec->shutdown_timeout_s = 30;
    memset(spec->redirects, -1, sizeof spec->redirects);
    memset(spec->tee, -1, sizeof spec->tee);
}

dt_status_t dt_launch_spec_standalone(int nproc, dt_launch_mode_t mode, char **envp, dt_launch_spec_t *spec) {
    spec_defaults(spec);
    if (nproc < 1 || nproc > DT_LAUNCH_MAX_LOCAL_RANKS)
        return dt_error(DT_STATUS_USAGE, "%d local workers: expected 1 to %d", nproc, DT_LAUNCH_MAX_LOCAL_RANKS);
    const char *v = env_get(envp, "DTRUN_SHUTDOWN_TIMEOUT");
    if (v && parse_seconds("shutdown_timeout", v, 0, &spec->shutdown_timeout_s) != DT_STATUS_OK)
        return dt_error(DT_STATUS_USAGE, "DTRUN_SHUTDOWN_TIMEOUT='%s' is not a number of seconds", v);
    spec->nproc_per_node = nproc;
    snprintf(spec->nproc_source, sizeof spec->nproc_source, "N");
    spec->standalone = 1;
    spec->mode = mode;
    spec->endpoint_host = dt_xstrdup("127.0.0.1");
    char id[32];
    random_id(id, sizeof id);
    spec->rdzv_id = dt_xstrdup(id);
    return DT_STATUS_OK;
}

dt_status_t dt_launch_args_parse(int argc, char **argv, char **envp, dt_launch_spec_t *spec) {
    spec_defaults(spec);

    raw_args_t raw;
    memset(&raw, 0, sizeof raw);
    dt_status_t st;
    DT_CHECK_GOTO(collect_env(envp, &raw), st, out_free_spec);
    DT_CHECK_GOTO(collect_cli(argc, argv, &raw, spec), st, out_free_spec);
    DT_CHECK_GOTO(interpret(&raw, envp, spec), st, out_free_spec);
    return DT_STATUS_OK;
out_free_spec:
    dt_launch_spec_free(spec);
    return st;
}

void dt_launch_spec_free(dt_launch_spec_t *spec) {
    if (!spec) return;
    free(spec->endpoint_host);
    free(spec->rdzv_id);
    free(spec->log_dir);
    free(spec->local_addr);
    free(spec->token_file);
    free(spec->bind_host);
    free(spec->preflight_desc);
    spec->preflight_desc = NULL;
    if (spec->extra_owned) {
        free(spec->extra_owned[spec->extra_argc - 1]);
        free(spec->extra_owned);
        spec->extra_owned = NULL;
    }
    memset(&spec->token, 0, sizeof spec->token);
    spec->have_token = 0;
    spec->token_file = spec->bind_host = NULL;
    spec->endpoint_host = spec->rdzv_id = spec->log_dir = spec->local_addr = NULL;
}

int dt_launch_spec_redirects(const dt_launch_spec_t *spec, int lr) {
    if (lr >= 0 && lr < DT_LAUNCH_MAX_LOCAL_RANKS && spec->redirects[lr] >= 0)
        return spec->redirects[lr];
    return spec->redirects_all;
}

int dt_launch_spec_tee(const dt_launch_spec_t *spec, int lr) {
    if (lr >= 0 && lr < DT_LAUNCH_MAX_LOCAL_RANKS && spec->tee[lr] >= 0) return spec->tee[lr];
    return spec->tee_all;
}

int dt_launch_spec_console(const dt_launch_spec_t *spec, int lr) {
    if (spec->ranks_filter_n == 0) return 1;
    for (int i = 0; i < spec->ranks_filter_n; i++)
        if (spec->ranks_filter[i] == lr) return 1;
    return 0;
}
