/*
 * comm.h - the communicator: collectives between the ranks of a job.
 *
 * One interface, four backends (one file each): shared memory within a node
 * (comm_shm.c), a TCP ring across nodes (comm_tcp.c), hierarchical for several
 * nodes with several ranks each (comm_hier.c: shared memory inside the node, TCP
 * between nodes), and NCCL for CUDA buffers (comm_nccl.c, CUDA builds only).
 * comm_life.c is the one file that knows which backends exist; it and comm.c
 * own what is common: creation through the store and sub-communicators
 * (comm_life.c), sequence numbers, requests and the communication thread, hang
 * detection (comm.c).
 *
 * Element types: fp32 and bf16 (uint16_t storage). bf16 is accumulated in fp32
 * and rounded once to nearest-even at the end, so the result of a bf16 sum is
 * round_bf16(sum in fp32) whatever the world size.
 *
 * Counts that the world size n does not divide: a count of elements is cut into
 * n slices, rank r's slice starting at dt_comm_slice_offset(count, n, r) with
 * dt_comm_slice_count(count, n, r) elements; the first count % n ranks get one
 * element more (count 10, n 4: 3 3 2 2).
 *   - all_reduce: any count; every rank gets all count elements.
 *   - reduce_scatter: count is the total; rank r receives its slice only
 *     (dt_comm_slice_count(count, n, r) elements of the reduced vector, from
 *     offset dt_comm_slice_offset(count, n, r)).
 *   - all_gather: count is per rank and equal on all ranks (the padded shard of
 *     ZeRO/FSDP); recv holds n * count elements, rank j's at j * count.
 *   - broadcast: any count, in place.
 * In place: all_reduce with send == recv; reduce_scatter with recv == send +
 * slice offset; all_gather with send == recv + rank * count. Other overlaps
 * between send and recv are invalid.
 *
 * Determinism: for a fixed world size and backend every result is bitwise
 * identical from run to run, and identical on every rank. Shared memory sums in
 * rank order 0, 1, ..., n-1 (as a serial loop would); the TCP ring sums in ring
 * order; hierarchical sums within each node, then across nodes.
 *
 * Threading: every op is numbered per communicator (its sequence number) and
 * ops run one at a time, in issue order, either on the caller's thread (a
 * blocking op when nothing is pending) or on the communicator's own
 * communication thread (async ops; a blocking op issued while async ones are
 * pending queues behind them). Issue ops of one communicator from one thread
 * at a time (the issue order must match across ranks). dt_comm_wait and
 * dt_comm_test may be called from any thread. Different communicators are
 * independent. A request's buffers must stay valid until it completed.
 *
 * Hangs: a rank that has waited in an op for a while publishes its sequence
 * number and op in the store; an op still not complete after timeout_s fails
 * with DT_STATUS_TIMEOUT and a detail naming the op, its sequence number,
 * count and dtype, and what every rank last published (so a mismatch such as
 * "rank 3 in all_gather #812, others in all_reduce #812" is named). After a
 * failed op the communicator is broken: later ops fail at once.
 *
 * Point to point (comm_p2p.c): dt_comm_send / dt_comm_recv and their async
 * forms move count elements between this rank and `peer`, a rank of this
 * communicator other than its own (else DT_STATUS_INVALID naming the peer).
 *   - Channels: each ordered pair (a -> b) is its own channel: the k-th send
 *     from a to b matches the k-th recv on b from a (k is the channel's
 *     sequence number, from 1). Channels never wait on each other or on the
 *     collectives: a rank may send_async to b, recv_async from b and
 *     recv_async from c in any issue order without deadlock (no group call).
 *   - Each channel is a 2-rank sub-communicator with its own communication
 *     thread, set up lazily by the first send a->b on a and the first recv
 *     from a on b, which meet through the store (on that thread, so issuing
 *     never blocks on the peer). A peer that never comes fails the op with
 *     DT_STATUS_TIMEOUT after timeout_s, naming the op and the peer. Channels
 *     are freed with the communicator.
 *   - Backends: shm (one node), tcp (across nodes; hier picks one of the two
 *     per pair), NCCL (ncclSend/ncclRecv on a 2-rank NCCL communicator per
 *     channel), and device buffers staged through host memory (stage_dev).
 *   - Every message starts with both ends exchanging (count, dtype): when they
 *     differ both ops fail with DT_STATUS_MISMATCH naming both; no byte of the
 *     payload moves. The received bytes equal the sent bytes (no conversion).
 *   - count 0 is a message like any other (matched, checked, numbered); it
 *     moves no payload.
 *   - Hangs: "send #k to rank G (count N, f32)" / "recv #k from rank G (...)",
 *     G the peer's global rank, in the timeout's detail.
 * Issue the ops of one communicator (collectives and point to point) from one
 * thread at a time, as for collectives; dt_comm_wait may run on any thread.
 */
#ifndef DT_RUNTIME_COMM_H
#define DT_RUNTIME_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/kernels.h" /* defines: dt_device_t (host staging of device buffers) */

typedef enum dt_comm_dtype {
    DT_COMM_F32 = 0,
    DT_COMM_BF16 = 1,
} dt_comm_dtype_t;

typedef enum dt_comm_redop {
    DT_COMM_SUM = 0,
    DT_COMM_AVG = 1, /* sum, then divided by the number of ranks */
    DT_COMM_MAX = 2,
} dt_comm_redop_t;

/* The backends, in the order of their names (the config key comm.backend and
 * DTRUN_COMM take these names): AUTO (NCCL for CUDA devices, shm within a node,
 * else hier), SHM, TCP, HIER, NCCL. */
#define DT_COMM_BACKEND_MAP(X)                                               \
    X(AUTO, "auto") X(SHM, "shm") X(TCP, "tcp") X(HIER, "hier") X(NCCL, "nccl")
typedef enum dt_comm_backend {
#define X(n, s) DT_COMM_BACKEND_##n,
    DT_COMM_BACKEND_MAP(X)
#undef X
} dt_comm_backend_t;

typedef enum dt_comm_op {
    DT_COMM_OP_ALL_REDUCE = 0,
    DT_COMM_OP_REDUCE_SCATTER = 1,
    DT_COMM_OP_ALL_GATHER = 2,
    DT_COMM_OP_BROADCAST = 3,
    DT_COMM_OP_BARRIER = 4,
    DT_COMM_OP_SEND = 5, /* point to point (below) */
    DT_COMM_OP_RECV = 6,
} dt_comm_op_t;

/* How to create a communicator. dt_comm_config_from_env fills it the way a
 * worker started by dtrun/torchrun needs; fields left 0/NULL take defaults. */
typedef struct dt_comm_config {
    const char *store_host;   /* MASTER_ADDR */
    int store_port;           /* MASTER_PORT */
    const char *run_id;       /* TORCHELASTIC_RUN_ID: store keys and shm names */
    int restart_round;        /* TORCHELASTIC_RESTART_COUNT */
    int rank, world_size;     /* RANK, WORLD_SIZE */
    int local_rank;           /* LOCAL_RANK */
    int local_world_size;     /* LOCAL_WORLD_SIZE; node of rank r = r / local_world_size */
    dt_comm_backend_t backend;/* AUTO: DTRUN_COMM (auto|shm|tcp|hier|nccl) may override */
    double timeout_s;         /* 0: DTRUN_COMM_TIMEOUT, else 300 */
    const char *tcp_addr;     /* address peers reach this rank on (TCP): 0 -> DTRUN_COMM_ADDR,
                                 else the local address of the connection to the store */
    int tcp_conns;            /* connections per ring neighbour, 1..8 (0: DTRUN_COMM_TCP_CONNS or 1) */
    size_t chunk_bytes;       /* pipelining chunk (0: backend default) */
    int device;               /* -1: host buffers; >= 0: CUDA device (NCCL) */
    /* CUDA buffers through a host backend (shm, tcp, hier): when stage_dev is a
     * CUDA device, every op's buffers are device memory of stage_dev; the op
     * copies its input device->host into a staging buffer the communicator owns
     * (grown as needed, accounted under DT_MEM_COMM), runs on host memory and
     * copies the result host->device, all through stage_dev->ops->copy (ordered
     * after the work queued on the device). This is how several ranks share one
     * GPU. The copies run on the thread that runs the op (the caller's, or
     * the communication thread for async ops), so stage_dev's copy must work
     * from any thread (select its device itself). Ignored for NCCL (device
     * buffers go to NCCL directly) and for CPU devices (host memory). */
    dt_device_t *stage_dev;
} dt_comm_config_t;

typedef struct dt_comm dt_comm_t;
typedef struct dt_comm_req dt_comm_req_t;

/* A request: owned by the caller (stack or heap), filled by an *_async call,
 * finished by dt_comm_wait (or dt_comm_test reporting done). The fields are
 * private to comm.c. */
struct dt_comm_req {
    dt_comm_req_t *next_;
    dt_comm_t *comm_;
    dt_comm_op_t op_;
    dt_comm_redop_t redop_;
    dt_comm_dtype_t dtype_;
    int root_;
    const void *send_;
    void *recv_;
    size_t count_;
    uint64_t seq_;
    _Atomic int done_;
    dt_status_t status_;
    void *backend_; /* backend's per-request state (NCCL event) */
    uint64_t flight_; /* its entry in the flight recorder (flight.h), 0: none */
    uint64_t trace_issue_ns_, trace_start_ns_; /* the timeline's (common/trace.h), when log.trace is on */
    char detail_[768];
};

/* ---- creation ------------------------------------------------------------- */

/* Defaults and torchrun's environment (see the fields above). Errors name the
 * variable that is missing or malformed. */
dt_status_t dt_comm_config_from_env(dt_comm_config_t *cfg);
/* "auto", "shm", "tcp", "hier", "nccl" -> backend; -1 when unknown. */
int dt_comm_backend_parse(const char *s);
const char *dt_comm_backend_name(dt_comm_backend_t b);

/* Creates the communicator of all world_size ranks (collective: every rank
 * calls it with the same run id and round). Exchanges addresses, shared-memory
 * names or the NCCL unique id through the store. A process may call it more
 * than once (every rank the same number of times, in the same order); for
 * groups of ranks prefer dt_comm_split. Errors name what is wrong (bad rank,
 * unknown DTRUN_COMM, unreachable store, a peer that never came). */
dt_status_t dt_comm_init(const dt_comm_config_t *cfg, dt_comm_t **out);
/* Collective over parent: ranks passing the same color form a new
 * communicator, ordered by (key, parent rank). color < 0: this rank joins none
 * and *out is NULL. The backend follows the parent's (shm when the group is on
 * one node). */
dt_status_t dt_comm_split(dt_comm_t *parent, int color, int key, dt_comm_t **out);
/* Waits for pending requests, stops the thread, releases everything. NULL ok. */
void dt_comm_free(dt_comm_t *comm);

int dt_comm_rank(const dt_comm_t *comm);
int dt_comm_size(const dt_comm_t *comm);
dt_comm_backend_t dt_comm_backend(const dt_comm_t *comm);
/* Sequence number the next op will get (the first op is #1). */
uint64_t dt_comm_next_seq(const dt_comm_t *comm);

/* ---- ops: async ------------------------------------------------------------ */

dt_status_t dt_comm_all_reduce_async(dt_comm_t *comm, const void *send, void *recv, size_t count,
                                     dt_comm_dtype_t dtype, dt_comm_redop_t redop,
                                     dt_comm_req_t *req);
/* count = total elements of send; recv gets this rank's slice (see above). */
dt_status_t dt_comm_reduce_scatter_async(dt_comm_t *comm, const void *send, void *recv,
                                         size_t count, dt_comm_dtype_t dtype,
                                         dt_comm_redop_t redop, dt_comm_req_t *req);
/* count = elements per rank; recv holds size * count. */
dt_status_t dt_comm_all_gather_async(dt_comm_t *comm, const void *send, void *recv, size_t count,
                                     dt_comm_dtype_t dtype, dt_comm_req_t *req);
dt_status_t dt_comm_broadcast_async(dt_comm_t *comm, void *buf, size_t count,
                                    dt_comm_dtype_t dtype, int root, dt_comm_req_t *req);
dt_status_t dt_comm_barrier_async(dt_comm_t *comm, dt_comm_req_t *req);
/* Point to point (see the block at the top): buf holds count elements of
 * dtype; peer is a rank of comm. The request completes when the bytes left
 * buf (send: buf may be reused) or arrived in it (recv). */
dt_status_t dt_comm_send_async(dt_comm_t *comm, const void *buf, size_t count, dt_comm_dtype_t dtype,
                               int peer, dt_comm_req_t *req);
dt_status_t dt_comm_recv_async(dt_comm_t *comm, void *buf, size_t count, dt_comm_dtype_t dtype, int peer,
                               dt_comm_req_t *req);

/* Waits until req completed; returns its status (the detail is set on the
 * calling thread's dt_error_detail). */
dt_status_t dt_comm_wait(dt_comm_req_t *req);
/* *done = 1 when complete (then dt_comm_wait returns at once). */
dt_status_t dt_comm_test(dt_comm_req_t *req, int *done);

/* ---- ops: blocking (async + wait) ------------------------------------------ */

dt_status_t dt_comm_all_reduce(dt_comm_t *comm, const void *send, void *recv, size_t count,
                               dt_comm_dtype_t dtype, dt_comm_redop_t redop);
dt_status_t dt_comm_reduce_scatter(dt_comm_t *comm, const void *send, void *recv, size_t count,
                                   dt_comm_dtype_t dtype, dt_comm_redop_t redop);
dt_status_t dt_comm_all_gather(dt_comm_t *comm, const void *send, void *recv, size_t count,
                               dt_comm_dtype_t dtype);
dt_status_t dt_comm_broadcast(dt_comm_t *comm, void *buf, size_t count, dt_comm_dtype_t dtype,
                              int root);
dt_status_t dt_comm_barrier(dt_comm_t *comm);
dt_status_t dt_comm_send(dt_comm_t *comm, const void *buf, size_t count, dt_comm_dtype_t dtype, int peer);
dt_status_t dt_comm_recv(dt_comm_t *comm, void *buf, size_t count, dt_comm_dtype_t dtype, int peer);

/* ---- helpers ---------------------------------------------------------------- */

size_t dt_comm_slice_count(size_t count, int n, int r);
size_t dt_comm_slice_offset(size_t count, int n, int r);
size_t dt_comm_dtype_size(dt_comm_dtype_t dtype);
const char *dt_comm_dtype_name(dt_comm_dtype_t dtype);
const char *dt_comm_op_name(dt_comm_op_t op);
const char *dt_comm_redop_name(dt_comm_redop_t redop);
/* bf16 <-> fp32 (round to nearest even; NaN stays NaN). */
uint16_t dt_comm_f32_to_bf16(float f);
float dt_comm_bf16_to_f32(uint16_t h);

/* ---- bench ------------------------------------------------------------------- */

/* Worker-side entry of `dtrun [launch flags] bench comm [flags]`: reads
 * torchrun's environment, creates the communicator and prints the table on
 * rank 0. Returns a process exit code (0 ok, 1 wrong results or failure,
 * 2 usage, 3 store/network). With --nproc N and no RANK in the environment it
 * is a standalone launch of N local ranks through the agent instead. */
int dt_bench_comm_main(int argc, char **argv);

#endif /* DT_RUNTIME_COMM_H */
