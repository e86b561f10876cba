/*
 * comm_life.c - a communicator's life: configuration from torchrun's
 * environment, backend choice (the one place that knows which backends
 * exist), creation through the store, sub-communicators (dt_comm_split) and
 * freeing. The op engine (requests, the communication thread, hang
 * detection, the collectives' entry points) is comm.c.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cudalib.h" /* defines: dt_cudalib_sym, dt_cudalib_sym_checked */
#include "common/log.h"
#include "common/mem.h"
#include "common/torchenv.h" /* defines: dt_torchenv_read */
#include "runtime/comm/comm_impl.h"

/* ---- configuration ------------------------------------------------------------ */

dt_status_t dt_comm_config_from_env(dt_comm_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->device = -1;
    dt_torchenv_t env;
    DT_CHECK(dt_torchenv_read(&env));
    DT_CHECK(dt_torchenv_require_store(&env));
    cfg->store_host = env.master_addr;
    cfg->store_port = env.master_port;
    cfg->world_size = env.world_size;
    cfg->rank = env.rank;
    cfg->local_world_size = env.local_world_size;
    cfg->local_rank = env.local_rank;
    cfg->restart_round = env.restart_count;
    cfg->run_id = env.run_id;
    return DT_STATUS_OK;
}

static double env_timeout(void) {
    const char *v = getenv("DTRUN_COMM_TIMEOUT");
    if (v && *v) {
        char *end;
        double t = strtod(v, &end);
        if (*end == 0 && t > 0) return t;
        DT_LOG_WARN("DTRUN_COMM_TIMEOUT=\"%s\" is not a positive number; using 300 s", v);
    }
    return 300.0;
}

/* The NCCL communicator is in the CUDA library (common/cudalib.h), loaded here
 * the first time it is asked for. UNSUPPORTED with the loader's message when the
 * library cannot be loaded or has no NCCL. */
static dt_status_t nccl_backend(const dt_comm_backend_ops_t **out) {
    void *p;
    dt_status_t st = dt_cudalib_sym("dt_comm_nccl_ops", &p); /* "has no" names the ops, not the layout */
    if (st == DT_STATUS_OK)
        st = dt_cudalib_sym_checked("dt_comm_nccl_ops", "dt_comm_nccl_layout", DT_COMM_LAYOUT, "comm_impl.h", &p);
    if (st != DT_STATUS_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dt_error_detail());
        return dt_error(st, "communicator backend nccl: %s%s", why,
#ifdef DT_CUEMU
                        " (the CPU emulator has no NCCL)"
#else
                        ""
#endif
        );
    }
    *out = (const dt_comm_backend_ops_t *)p;
    return DT_STATUS_OK;
}

static dt_status_t choose_backend(const dt_comm_config_t *cfg, dt_comm_backend_t *out) {
    dt_comm_backend_t b = cfg->backend;
    const char *env = getenv("DTRUN_COMM");
    if (env && *env) {
        int e = dt_comm_backend_parse(env);
        if (e < 0)
            return dt_error(DT_STATUS_CONFIG,
                            "DTRUN_COMM=\"%s\": expected one of auto, shm, tcp, hier, nccl", env);
        b = (dt_comm_backend_t)e;
    }
    if ((unsigned)b > DT_COMM_BACKEND_NCCL)
        return dt_error(DT_STATUS_CONFIG, "communicator backend %d is unknown", (int)b);
    if (b == DT_COMM_BACKEND_AUTO) {
        int lws = cfg->local_world_size > 0 ? cfg->local_world_size : cfg->world_size;
        const dt_comm_backend_ops_t *nccl;
        /* a GPU buffer communicator: NCCL when the CUDA library has it (the device is
         * open, so the library is loaded already) */
        if (cfg->device >= 0 && nccl_backend(&nccl) == DT_STATUS_OK)
            b = DT_COMM_BACKEND_NCCL;
        else if (lws >= cfg->world_size)
            b = DT_COMM_BACKEND_SHM;
        else if (lws == 1)
            b = DT_COMM_BACKEND_TCP;
        else
            b = DT_COMM_BACKEND_HIER;
    }
    if (b == DT_COMM_BACKEND_NCCL) {
        const dt_comm_backend_ops_t *nccl;
        DT_CHECK(nccl_backend(&nccl));
    }
    *out = b;
    return DT_STATUS_OK;
}

static const dt_comm_backend_ops_t *backend_ops(dt_comm_backend_t b) {
    switch (b) {
    case DT_COMM_BACKEND_SHM: return &dt_comm_shm_ops;
    case DT_COMM_BACKEND_TCP: return &dt_comm_tcp_ops;
    case DT_COMM_BACKEND_HIER: return &dt_comm_hier_ops;
    case DT_COMM_BACKEND_NCCL: {
        const dt_comm_backend_ops_t *nccl = NULL;
        return nccl_backend(&nccl) == DT_STATUS_OK ? nccl : NULL;
    }
    default: return NULL;
    }
}

/* ---- creation ------------------------------------------------------------------- */

int dt_comm_rank(const dt_comm_t *comm) { return comm->rank; }
int dt_comm_size(const dt_comm_t *comm) { return comm->size; }
dt_comm_backend_t dt_comm_backend(const dt_comm_t *comm) { return comm->kind; }
uint64_t dt_comm_next_seq(const dt_comm_t *comm) { return comm->seq + 1; }

static char *sanitize(const char *s) {
    char *o = dt_xstrdup(s && *s ? s : "none");
    size_t n = strlen(o);
    if (n > 64) o[n = 64] = 0;
    for (size_t i = 0; i < n; i++) {
        char c = o[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
            o[i] = '_';
    }
    return o;
}

static void comm_release(dt_comm_t *comm) {
    if (!comm) return;
    if (comm->thread_started) {
        pthread_mutex_lock(&comm->mu);
        comm->stop = 1;
        pthread_cond_broadcast(&comm->cv_work);
        pthread_mutex_unlock(&comm->mu);
        pthread_join(comm->thread, NULL);
    }
    if (comm->be && comm->ops && comm->ops->free) comm->ops->free(comm);
    if (comm->store) dt_store_close(comm->store);
    pthread_mutex_destroy(&comm->mu);
    pthread_cond_destroy(&comm->cv_work);
    pthread_cond_destroy(&comm->cv_done);
    dt_mem_free(comm->stage_buf);
    free(comm->members);
    free(comm->store_host);
    free(comm->run_id);
    free(comm->tcp_addr);
    free(comm);
}

static dt_status_t create(const dt_comm_t *like, const char *id, const int *members, int nmembers, int my_index,
                         dt_comm_backend_t kind, int channel, dt_comm_t **out) {
    dt_status_t st;
    *out = NULL;
    dt_comm_t *comm = dt_xcalloc(1, sizeof(*comm));
    pthread_mutex_init(&comm->mu, NULL);
    pthread_cond_init(&comm->cv_work, NULL);
    pthread_cond_init(&comm->cv_done, NULL);
    comm->store_host = dt_xstrdup(like->store_host);
    comm->store_port = like->store_port;
    comm->run_id = dt_xstrdup(like->run_id);
    comm->restart_round = like->restart_round;
    comm->global_rank = like->global_rank;
    comm->global_size = like->global_size;
    comm->local_rank = like->local_rank;
    comm->local_world_size = like->local_world_size;
    comm->tcp_addr = like->tcp_addr ? dt_xstrdup(like->tcp_addr) : NULL;
    comm->tcp_conns = like->tcp_conns;
    comm->chunk_bytes = like->chunk_bytes;
    comm->device = like->device;
    comm->timeout_s = like->timeout_s;
    comm->publish_after_s = like->publish_after_s;
    snprintf(comm->id, sizeof(comm->id), "%s", id);
    snprintf(comm->prefix, sizeof(comm->prefix), "dtrun/comm/%s/%d/%.200s", comm->run_id, comm->restart_round, id);
    comm->rank = my_index;
    comm->size = nmembers;
    comm->members = dt_xmalloc(sizeof(int) * (size_t)nmembers);
    memcpy(comm->members, members, sizeof(int) * (size_t)nmembers);
    comm->kind = kind;
    comm->ops = backend_ops(kind);
    if (!comm->ops) {
        st = dt_error(DT_STATUS_UNSUPPORTED, "communicator backend %s is not built", dt_comm_backend_name(kind));
        goto out_release;
    }
    double connect_s = like->timeout_s < 60 ? 60 : like->timeout_s;
    /* A store with a token (the agent names its file in DTRUN_RDZV_TOKEN_FILE)
     * takes only clients that prove they hold it. */
    dt_store_token_t token;
    int have_token = 0;
    DT_CHECK_GOTO(dt_store_token_from_env(&token, &have_token), st, out_release);
    st = dt_store_connect_auth(comm->store_host, comm->store_port, connect_s,
                               have_token ? &token : NULL, &comm->store);
    memset(&token, 0, sizeof token);
    if (st != DT_STATUS_OK) goto out_release;
    comm->channel = channel;
    comm->running = channel; /* a channel's thread sets up its backend first (channel_setup, comm.c) */
    if (!channel && (nmembers > 1 || kind == DT_COMM_BACKEND_NCCL))
        DT_CHECK_GOTO(comm->ops->init(comm), st, out_release);
    if (pthread_create(&comm->thread, NULL, dt_comm_thread_, comm) != 0) {
        st = dt_error(DT_STATUS_SYS, "comm %s: cannot start the communication thread", id);
        goto out_release;
    }
    comm->thread_started = 1;
    DT_LOG_DEBUG("comm %s: rank %d of %d, backend %s", id, my_index, nmembers, comm->ops->name);
    *out = comm;
    return DT_STATUS_OK;

out_release:
    {
        char keep[768];
        snprintf(keep, sizeof(keep), "%s", dt_error_detail());
        comm_release(comm);
        dt_error(st, "%s", keep);
    }
    return st;
}

dt_status_t dt_comm_create_group_(const dt_comm_t *like, const char *id, const int *members, int nmembers,
                                  int my_index, dt_comm_backend_t kind, dt_comm_t **out) {
    return create(like, id, members, nmembers, my_index, kind, 0, out);
}

dt_status_t dt_comm_create_channel_(const dt_comm_t *like, const char *id, const int members[2], int my_index,
                                    dt_comm_backend_t kind, dt_comm_t **out) {
    DT_CHECK(create(like, id, members, 2, my_index, kind, 1, out));
    (*out)->stage_dev = like->stage_dev; /* set only for host backends given CUDA buffers */
    return DT_STATUS_OK;
}

/* Host staging for a communicator that runs on host memory, given CUDA
 * buffers (comm.h, stage_dev). Set before the first op is issued. Not
 * inherited by dt_comm_create_group_: hier's own sub-communicators get host
 * buffers; dt_comm_split passes it on. */
static void set_staging(dt_comm_t *comm, dt_device_t *dev) {
    if (dev && dev->kind == DT_DEVICE_CUDA && comm->kind != DT_COMM_BACKEND_NCCL) comm->stage_dev = dev;
}

dt_status_t dt_comm_init(const dt_comm_config_t *cfg, dt_comm_t **out) {
    if (!cfg || !out) return dt_error(DT_STATUS_INVALID, "dt_comm_init: NULL argument");
    *out = NULL;
    if (!cfg->store_host || !*cfg->store_host || cfg->store_port <= 0 || cfg->store_port > 65535)
        return dt_error(DT_STATUS_CONFIG, "communicator: store endpoint %s:%d is invalid",
                        cfg->store_host ? cfg->store_host : "(none)", cfg->store_port);
    if (cfg->world_size < 1 || cfg->rank < 0 || cfg->rank >= cfg->world_size)
        return dt_error(DT_STATUS_CONFIG, "communicator: rank %d / world size %d is invalid", cfg->rank,
                        cfg->world_size);
    int lws = cfg->local_world_size > 0 ? cfg->local_world_size : cfg->world_size;
    if (lws > cfg->world_size || cfg->world_size % lws != 0)
        return dt_error(DT_STATUS_CONFIG, "communicator: local world size %d does not divide world size %d", lws,
                        cfg->world_size);
    if (cfg->tcp_conns < 0 || cfg->tcp_conns > 8)
        return dt_error(DT_STATUS_CONFIG, "communicator: tcp_conns %d outside [1, 8]", cfg->tcp_conns);
    dt_comm_backend_t kind = DT_COMM_BACKEND_SHM;
    DT_CHECK(choose_backend(cfg, &kind));
    const dt_device_t *sd = cfg->stage_dev;
    if (sd && sd->kind == DT_DEVICE_CUDA && (!sd->ops || !sd->ops->copy))
        return dt_error(DT_STATUS_CONFIG, "communicator: stage_dev (a %s device) has no copy operation",
                        dt_device_kind_name(sd->kind));

    dt_comm_t like;
    memset(&like, 0, sizeof(like));
    like.store_host = (char *)cfg->store_host;
    like.store_port = cfg->store_port;
    char *run_id = sanitize(cfg->run_id);
    like.run_id = run_id;
    like.restart_round = cfg->restart_round;
    like.global_rank = cfg->rank;
    like.global_size = cfg->world_size;
    like.local_rank = cfg->local_rank;
    like.local_world_size = lws;
    const char *addr = cfg->tcp_addr ? cfg->tcp_addr : getenv("DTRUN_COMM_ADDR");
    like.tcp_addr = addr && *addr ? (char *)addr : NULL;
    like.tcp_conns = cfg->tcp_conns;
    if (!like.tcp_conns) {
        const char *c = getenv("DTRUN_COMM_TCP_CONNS");
        like.tcp_conns = c && atoi(c) >= 1 && atoi(c) <= 8 ? atoi(c) : 1;
    }
    like.chunk_bytes = cfg->chunk_bytes;
    like.device = cfg->device;
    like.timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : env_timeout();
    like.publish_after_s = like.timeout_s / 4 < 5.0 ? like.timeout_s / 4 : 5.0;

    /* The first communicator of a process is "0"; later dt_comm_init calls (the
     * same number on every rank) get their own names, segments and keys. */
    static _Atomic int inits = 0;
    int nth = atomic_fetch_add(&inits, 1);
    char id[32];
    if (nth == 0)
        snprintf(id, sizeof(id), "0");
    else
        snprintf(id, sizeof(id), "i%d", nth);
    int *members = dt_xmalloc(sizeof(int) * (size_t)cfg->world_size);
    for (int i = 0; i < cfg->world_size; i++) members[i] = i;
    dt_status_t st = dt_comm_create_group_(&like, id, members, cfg->world_size, cfg->rank, kind, out);
    if (st == DT_STATUS_OK) set_staging(*out, cfg->stage_dev);
    free(members);
    free(run_id);
    return st;
}

typedef struct split_entry {
    int color, key, rank;
} split_entry_t;

static int split_cmp(const void *a, const void *b) {
    const split_entry_t *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

dt_status_t dt_comm_split(dt_comm_t *parent, int color, int key, dt_comm_t **out) {
    if (!parent || !out) return dt_error(DT_STATUS_INVALID, "dt_comm_split: NULL argument");
    *out = NULL;
    int k = ++parent->splits;
    char val[64];
    snprintf(val, sizeof(val), "%d %d", color, key);
    DT_CHECK(dt_comm_kv_set_(parent, val, strlen(val), "split%d/%d", k, parent->rank));
    split_entry_t *e = dt_xcalloc((size_t)parent->size, sizeof(*e));
    dt_status_t st = DT_STATUS_OK;
    for (int r = 0; r < parent->size; r++) {
        char *v = NULL;
        DT_CHECK_GOTO(dt_comm_kv_get_(parent, &v, NULL, "split%d/%d", k, r), st, out_free_entries);
        int ok = sscanf(v, "%d %d", &e[r].color, &e[r].key) == 2;
        free(v);
        if (!ok) {
            st = dt_error(DT_STATUS_PROTOCOL, "dt_comm_split: malformed entry of rank %d", r);
            goto out_free_entries;
        }
        e[r].rank = r;
    }
    if (color < 0) goto out_free_entries;
    int n = 0;
    for (int r = 0; r < parent->size; r++)
        if (e[r].color == color) e[n++] = e[r];
    qsort(e, (size_t)n, sizeof(*e), split_cmp);
    int *members = dt_xmalloc(sizeof(int) * (size_t)n);
    int me = -1, one_node = 1;
    int lws = parent->local_world_size;
    for (int i = 0; i < n; i++) {
        members[i] = parent->members[e[i].rank];
        if (e[i].rank == parent->rank) me = i;
        if (members[i] / lws != members[0] / lws) one_node = 0;
    }
    dt_comm_backend_t kind = parent->kind;
    if (kind != DT_COMM_BACKEND_NCCL) {
        if (one_node)
            kind = DT_COMM_BACKEND_SHM;
        else if (kind == DT_COMM_BACKEND_HIER)
            kind = DT_COMM_BACKEND_TCP; /* a group across nodes: ring (hier needs whole nodes) */
    }
    char id[200];
    snprintf(id, sizeof(id), "%.160s.s%d.%d", parent->id, k, color);
    st = dt_comm_create_group_(parent, id, members, n, me, kind, out);
    if (st == DT_STATUS_OK) set_staging(*out, parent->stage_dev);
    free(members);
out_free_entries:
    free(e);
    return st;
}

void dt_comm_free(dt_comm_t *comm) {
    if (!comm) return;
    dt_comm_p2p_free_(comm);
    /* Let pending requests finish (each is bounded by the timeout). */
    pthread_mutex_lock(&comm->mu);
    while (comm->head || comm->running) pthread_cond_wait(&comm->cv_done, &comm->mu);
    pthread_mutex_unlock(&comm->mu);
    comm_release(comm);
}