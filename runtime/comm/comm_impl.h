/*
 * comm_impl.h - what the communicator's backends share with comm.c: the
 * communicator struct, the backend table, hang-detection ticks, store helpers
 * and the reduction loops; and what comm_life.c (creation) shares with comm.c
 * (the op engine). Private to runtime/comm*.c.
 */
#ifndef DT_RUNTIME_COMM_IMPL_H
#define DT_RUNTIME_COMM_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "rendezvous/store.h" /* defines: dt_store_t, dt_store_* */
#include "rendezvous/store_auth.h" /* defines: dt_store_token_from_env */
#include "runtime/comm/comm.h"

/* A backend: a table of functions plus the context in comm->be. run executes one
 * op to completion on the calling thread (host backends). start/finish are for
 * backends whose ops are asynchronous by nature (NCCL: queued on a stream);
 * when start is set, run is not used. */
typedef struct dt_comm_backend_ops {
    const char *name;
    dt_status_t (*init)(dt_comm_t *comm);
    void (*free)(dt_comm_t *comm);
    dt_status_t (*run)(dt_comm_t *comm, dt_comm_req_t *req);
    dt_status_t (*start)(dt_comm_t *comm, dt_comm_req_t *req);
    /* block = 1: wait for completion; else *done says whether it completed */
    dt_status_t (*finish)(dt_comm_t *comm, dt_comm_req_t *req, int block, int *done);
} dt_comm_backend_ops_t;

extern const dt_comm_backend_ops_t dt_comm_shm_ops;
extern const dt_comm_backend_ops_t dt_comm_tcp_ops;
extern const dt_comm_backend_ops_t dt_comm_hier_ops;
/* In the CUDA library (comm_nccl.c; the CPU emulator's library has none): comm.c
 * finds it by name through common/cudalib.h, never by linking. */
extern const dt_comm_backend_ops_t dt_comm_nccl_ops;
/* The layout comm_nccl.c (in the CUDA library) was compiled against: sizes of the
 * communicator, a request and the backend table. comm.c refuses NCCL ops from a
 * library whose value (dt_comm_nccl_layout) differs from the binary's. */
#define DT_COMM_LAYOUT                                                                          \
    ((unsigned long)sizeof(struct dt_comm) * 1000003ul + (unsigned long)sizeof(dt_comm_req_t) * 1009ul + \
     (unsigned long)sizeof(dt_comm_backend_ops_t))
extern const unsigned long dt_comm_nccl_layout;

struct dt_comm {
    /* who */
    char *store_host;
    int store_port;
    char *run_id;        /* sanitised: [A-Za-z0-9_-] */
    int restart_round;
    int global_rank, global_size;
    int local_rank, local_world_size;
    char *tcp_addr;      /* NULL: derived from the store's address */
    int tcp_conns;
    size_t chunk_bytes;  /* 0: backend default */
    int device;
    double timeout_s;
    double publish_after_s;

    char id[200];        /* "0", "0.s1.2", "0.node1" ... */
    char prefix[400];    /* store key prefix of this communicator */
    int rank, size;      /* within this communicator */
    int *members;        /* global rank of each member */
    dt_comm_backend_t kind;
    const dt_comm_backend_ops_t *ops;
    void *be;
    dt_store_t *store;   /* own client: bootstrap, status reports */
    int splits;          /* number of dt_comm_split calls on this comm */

    /* point to point (comm_p2p.c). A channel (channel = 1) is the 2-rank
     * communicator of one ordered pair: rank 0 the sender, rank 1 the
     * receiver. Its backend is set up on its own thread (so issuing never
     * waits for the peer) and every op runs there or, once set up, on the
     * caller's thread when nothing is pending; NCCL's too (start then finish). */
    int channel;
    dt_status_t setup_status; /* a channel whose setup failed: what every op returns */
    dt_comm_t **p2p;     /* parent: 2 * size channels, [2*peer] to peer, [2*peer+1] from peer */

    /* ops and requests */
    uint64_t seq;        /* of the last issued op */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    dt_comm_req_t *head, *tail;
    int running, stop, thread_started;
    pthread_t thread;
    _Atomic int broken;
    char broken_detail[768];

    /* host staging of device buffers (comm.h, stage_dev): NULL when the op's
     * buffers are host memory (or go to NCCL as they are) */
    dt_device_t *stage_dev;
    uint8_t *stage_buf;  /* host, DT_MEM_COMM, grown as needed */
    size_t stage_cap;

    /* the op running now (hang detection) */
    dt_comm_req_t *cur;
    uint64_t op_start_ns;
    int published;
};

/* Hang detection, called by backends while they wait (cheap: reads the clock
 * once in a while). Publishes this rank's op in the store after
 * publish_after_s; after timeout_s returns DT_STATUS_TIMEOUT with the full
 * detail (op, seq, count, dtype, what each rank published). */
typedef struct dt_comm_tick {
    uint32_t n;
} dt_comm_tick_t;
dt_status_t dt_comm_tick_slow_(dt_comm_t *comm);
static inline dt_status_t dt_comm_tick(dt_comm_t *comm, dt_comm_tick_t *t) {
    if ((++t->n & 255u) != 0) return DT_STATUS_OK;
    return dt_comm_tick_slow_(comm);
}
/* Describes the running op: "all_reduce #3 (count 10, f32)". */
void dt_comm_describe_(const dt_comm_req_t *req, char *buf, size_t len);

/* Store keys under the communicator's prefix (printf-style suffix). */
dt_status_t dt_comm_kv_set_(dt_comm_t *comm, const void *val, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Waits for the key; *val is NUL-terminated (caller frees). */
dt_status_t dt_comm_kv_get_(dt_comm_t *comm, char **val, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Creates a communicator of the given global ranks (my_index: this rank's
 * position) with a given id and backend; the fields of `like` give the job. */
dt_status_t dt_comm_create_group_(const dt_comm_t *like, const char *id, const int *members,
                                  int nmembers, int my_index, dt_comm_backend_t kind,
                                  dt_comm_t **out);
/* The same for a point-to-point channel: the backend's init runs first on the
 * communicator's thread (ops issued meanwhile queue behind it). */
dt_status_t dt_comm_create_channel_(const dt_comm_t *like, const char *id, const int members[2], int my_index,
                                    dt_comm_backend_t kind, dt_comm_t **out);
/* The communication thread of comm (arg), started by creation (comm_life.c):
 * a channel's sets up its backend first, then each runs queued requests until
 * stop is set and nothing is pending. */
void *dt_comm_thread_(void *arg);
/* Queues or runs req (filled: op, buffers, count, dtype, root) on comm, as
 * every *_async call does; blocking = 1 may run it on the caller's thread. */
dt_status_t dt_comm_issue_(dt_comm_t *comm, dt_comm_req_t *req, int blocking);
/* The timeout detail of a channel's op (comm_p2p.c; what: the op described):
 * this rank and its peer by global rank, and the op the peer published. */
dt_status_t dt_comm_p2p_timeout_(dt_comm_t *comm, const char *what, double waited);
/* Frees the channels of a communicator (comm_p2p.c). */
void dt_comm_p2p_free_(dt_comm_t *comm);
/* Point to point on a channel: both ends exchange (count, dtype) before the
 * payload; a difference fails with DT_STATUS_MISMATCH naming both (this
 * formats it; peer_* are what the other end announced). */
dt_status_t dt_comm_p2p_mismatch_(const dt_comm_req_t *req, uint64_t peer_count, uint32_t peer_dtype,
                                  uint64_t peer_seq);

/* Runs one op synchronously on a (sub-)communicator from inside a backend. */
dt_status_t dt_comm_run_sub_(dt_comm_t *sub, dt_comm_op_t op, const void *send, void *recv,
                             size_t count, dt_comm_dtype_t dtype, dt_comm_redop_t redop, int root);

/* Host staging (comm_stage.c): runs req on host copies of its device buffers, and
 * one copy through comm->stage_dev with an error that names the op and rank. */
dt_status_t dt_comm_run_staged_(dt_comm_t *comm, dt_comm_req_t *req);
dt_status_t dt_comm_stage_copy_(dt_comm_t *comm, const dt_comm_req_t *req, void *dst, const void *src,
                                size_t bytes, dt_copy_kind_t kind);

/* ---- reduction loops (fixed order: src[0], src[1], ...) ----------------------- */

/* dst[i] = src[0][i] (op) src[1][i] (op) ... ; AVG divides the sum by navg at the end
 * (navg 0: no division). dst may be one of the sources. */
void dt_comm_reduce_f32_(float *dst, const float *const *src, int nsrc, size_t n,
                         dt_comm_redop_t redop, int navg);
/* The same with bf16 sources into an fp32 accumulator acc (no division). */
void dt_comm_accum_bf16_(float *acc, const uint16_t *const *src, int nsrc, size_t n,
                         dt_comm_redop_t redop, int first);
/* acc (fp32, after AVG division when navg > 0) -> dst bf16. */
void dt_comm_f32_to_bf16_n_(uint16_t *dst, const float *acc, size_t n, dt_comm_redop_t redop,
                            int navg);
void dt_comm_bf16_to_f32_n_(float *dst, const uint16_t *src, size_t n);

/* Pause instruction for spin loops. */
static inline void dt_comm_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif /* DT_RUNTIME_COMM_IMPL_H */
