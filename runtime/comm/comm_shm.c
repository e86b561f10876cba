/*
 * comm_shm.c - shared-memory backend: ranks of one node exchange data through
 * segments every rank maps.
 *
 * Segments: each rank creates /dtrun.<run_id>.<round>.<comm>.<rank> (a header of
 * flags, then two slots of chunk_bytes), publishes the name in the store, maps
 * every peer's, says "mapped" in the store and unlinks its own as soon as all
 * ranks have mapped all segments: a crash after that leaves nothing behind. A
 * crash before leaves a segment of that round, which the next round's creation
 * removes (every name of the same run id with another round number).
 *
 * Rounds: every op is a sequence of rounds; in each round every rank writes its
 * slot (the one of the round's parity), then publishes flag = (round << 16 |
 * op signature) with a release store, and reads peers' slots after seeing their
 * flags with acquire loads (a peer's flag counts when it equals ours or shows a
 * later round: a peer is at most one round ahead). No barrier between rounds: a rank writes slot parity
 * p again only in round t+2, after it saw every peer's flag of round t+1, which
 * each peer posts only after finishing round t. The signature makes ranks in
 * different ops (all_reduce vs all_gather) wait for each other until the timeout
 * names both, instead of mixing data.
 *
 * Waiting: spin with pause, then futex on the peer's wake word (the poster
 * wakes only when someone sleeps), checking the hang detector on the way and,
 * every ~100 ms, whether the peer's process still exists (a rank that died
 * fails the op at once with DT_STATUS_CLOSED instead of waiting for the timeout).
 *
 * Algorithms (n ranks, S bytes):
 *   small all_reduce (S <= 32 KiB): one round: everyone copies its input into its
 *     slot; everyone reduces all n slots in rank order into its output.
 *   large all_reduce: per round a window of every rank's slice: copy the peers'
 *     windows into the own slot (A), reduce the own window from all slots and the
 *     own input into the own slot (rank order 0..n-1), post B, copy the peers'
 *     reduced windows into the output. Slots stay in cache; each rank reads and
 *     writes its share of the big buffers once.
 *   reduce_scatter: the first half of that. all_gather, broadcast: copy through
 *     slots.
 *   send/recv (a 2-rank channel, comm_p2p.c): like broadcast from rank 0, but
 *     the first round of each message starts both slots with a header (count,
 *     dtype, seq) that each end checks against its own before any payload is
 *     used; the sender's first payload bytes follow its header.
 *   Slots are 1 MiB (config chunk_bytes): fewer rounds keep the cost of a
 *   descheduled peer low on a busy host. From 4 MiB the output is written with
 *   non-temporal stores. Two ranks in fp32 reduce and write slot and output in
 *   one pass.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/meminfo.h" /* defines: dt_meminfo_cpus */
#include "runtime/comm/comm_impl.h"

#define SHM_MAGIC 0x64747368u /* "dtsh" */
#define SHM_DATA_OFFSET 4096u
#define SHM_DEFAULT_CHUNK (1024u * 1024u)
#define SHM_SMALL_MAX (32u * 1024u)
#define SHM_SPIN 4000

typedef struct shm_hdr {
    _Alignas(64) _Atomic uint64_t flag_a;
    _Alignas(64) _Atomic uint64_t flag_b;
    _Alignas(64) _Atomic uint32_t wake; /* futex word, bumped when a sleeper may wait */
    _Atomic uint32_t sleepers;
    uint32_t magic;
    int32_t pid; /* so that waiting peers notice a rank that died */
    uint64_t slot_bytes;
    /* The collective this rank is in (a seqlock: op_seq is 0 while the rest is
     * rewritten), so that a peer waiting in another op under the same number finds
     * the desync at once instead of at the timeout, or worse, reading a later round
     * of another op as its own. */
    _Alignas(64) _Atomic uint64_t op_seq;
    _Atomic uint64_t op_count;
    _Atomic uint32_t op_kind, op_dtype;
    _Atomic uint32_t op_root, op_redop;
} shm_hdr_t;

typedef struct shm_be {
    int n, r;
    size_t slot_bytes, seg_bytes;
    uint8_t **base;  /* n mappings */
    uint64_t round;
    float *acc;      /* fp32 accumulator for bf16, slot_bytes/2 floats */
    const dt_comm_req_t *op; /* the collective in progress (NULL: send/recv, checked by their header) */
    int oversub;     /* more ranks than CPUs: yield while spinning */
    char name[NAME_MAX];
} shm_be_t;

static inline shm_hdr_t *hdr(shm_be_t *be, int k) { return (shm_hdr_t *)be->base[k]; }
static inline uint8_t *slot(shm_be_t *be, int k, uint64_t round) {
    return be->base[k] + SHM_DATA_OFFSET + (round & 1) * be->slot_bytes;
}

/* ---- segments ------------------------------------------------------------- */

/* Removes /dev/shm/dtrun.<run_id>.<other round>.* left by a crashed round. */
static void remove_stale(const char *run_id, int round) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    char pre[128];
    int plen = snprintf(pre, sizeof(pre), "dtrun.%s.", run_id);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, pre, (size_t)plen) != 0) continue;
        char *end;
        long r = strtol(e->d_name + plen, &end, 10);
        if (end == e->d_name + plen || *end != '.' || r == round) continue;
        char nm[NAME_MAX + 2];
        snprintf(nm, sizeof(nm), "/%s", e->d_name);
        if (shm_unlink(nm) == 0) DT_LOG_INFO("comm: removed stale shared memory %s (round %ld)", nm, r);
    }
    closedir(d);
}

static dt_status_t map_segment(const char *name, size_t bytes, int create, uint8_t **out) {
    int fd;
    if (create) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 && errno == EEXIST) { /* same round restarted without a new round number */
            shm_unlink(name);
            fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        }
        if (fd < 0) return dt_error(dt_status_from_errno(errno), "shm_open %s: %s", name, strerror(errno));
        if (ftruncate(fd, (off_t)bytes) != 0) {
            int e = errno;
            close(fd);
            shm_unlink(name);
            return dt_error(dt_status_from_errno(e), "ftruncate %s to %zu bytes: %s (is /dev/shm full?)", name,
                            bytes, strerror(e));
        }
    } else {
        fd = shm_open(name, O_RDWR, 0600);
        if (fd < 0) return dt_error(dt_status_from_errno(errno), "shm_open %s: %s", name, strerror(errno));
        struct stat sb;
        if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != bytes) {
            close(fd);
            return dt_error(DT_STATUS_MISMATCH, "shared memory %s has %lld bytes, expected %zu", name,
                            (long long)sb.st_size, bytes);
        }
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        if (create) shm_unlink(name);
        return dt_error(dt_status_from_errno(e), "mmap %s: %s", name, strerror(e));
    }
    *out = p;
    return DT_STATUS_OK;
}

static void shm_free(dt_comm_t *comm) {
    shm_be_t *be = comm->be;
    if (!be) return;
    for (int k = 0; k < be->n; k++)
        if (be->base && be->base[k]) munmap(be->base[k], be->seg_bytes);
    if (be->base && be->base[be->r]) dt_mem_account(DT_MEM_COMM, -(int64_t)be->seg_bytes);
    if (be->name[0]) shm_unlink(be->name); /* harmless when already unlinked */
    free(be->base);
    dt_mem_free(be->acc);
    free(be);
    comm->be = NULL;
}

static dt_status_t shm_init(dt_comm_t *comm) {
    dt_status_t st;
    shm_be_t *be = dt_xcalloc(1, sizeof(*be));
    comm->be = be;
    be->n = comm->size;
    be->r = comm->rank;
    size_t chunk = comm->chunk_bytes ? comm->chunk_bytes : SHM_DEFAULT_CHUNK;
    if (chunk < 4096) chunk = 4096;
    be->slot_bytes = (chunk + 4095) & ~(size_t)4095;
    be->seg_bytes = SHM_DATA_OFFSET + 2 * be->slot_bytes;
    be->base = dt_xcalloc((size_t)be->n, sizeof(uint8_t *));
    if (be->n > 64)
        return dt_error(DT_STATUS_UNSUPPORTED, "shm: %d ranks on one node; at most 64 are supported", be->n);
    int ncpu = dt_meminfo_cpus(); /* the job's cpuset, not every CPU online */
    be->oversub = be->n > ncpu;
    be->acc = dt_mem_alloc(DT_MEM_COMM, be->slot_bytes / 2 * sizeof(float));
    if (!be->acc) return DT_STATUS_NOMEM;

    remove_stale(comm->run_id, comm->restart_round);
    snprintf(be->name, sizeof(be->name), "/dtrun.%s.%d.%s.%d", comm->run_id, comm->restart_round, comm->id,
             comm->rank);
    DT_CHECK(map_segment(be->name, be->seg_bytes, 1, &be->base[be->r]));
    dt_mem_account(DT_MEM_COMM, (int64_t)be->seg_bytes);
    shm_hdr_t *h = hdr(be, be->r);
    h->pid = (int32_t)getpid();
    h->magic = SHM_MAGIC;
    h->slot_bytes = be->slot_bytes;

    DT_CHECK_GOTO(dt_comm_kv_set_(comm, be->name, strlen(be->name), "shm/%d", comm->rank), st, out_unlink);
    for (int k = 0; k < be->n; k++) {
        if (k == be->r) continue;
        char *peer = NULL;
        DT_CHECK_GOTO(dt_comm_kv_get_(comm, &peer, NULL, "shm/%d", k), st, out_unlink);
        st = map_segment(peer, be->seg_bytes, 0, &be->base[k]);
        if (st == DT_STATUS_NOT_FOUND || (st != DT_STATUS_OK && strstr(dt_error_detail(), "No such file")))
            st = dt_error(DT_STATUS_CONFIG,
                          "shm comm: rank %d cannot open rank %d's segment %s: is it on another node? "
                          "(DTRUN_COMM=tcp or hier for several nodes)",
                          be->r, k, peer);
        if (st == DT_STATUS_OK && hdr(be, k)->magic != SHM_MAGIC) /* creator may not have written yet */
            for (int i = 0; i < 2000 && atomic_load((_Atomic uint32_t *)&hdr(be, k)->magic) != SHM_MAGIC; i++)
                dt_sleep_ms(1);
        free(peer);
        if (st != DT_STATUS_OK) goto out_unlink;
    }
    DT_CHECK_GOTO(dt_comm_kv_set_(comm, "1", 1, "shm_mapped/%d", comm->rank), st, out_unlink);
    {
        char **keys = dt_xcalloc((size_t)be->n, sizeof(char *));
        for (int k = 0; k < be->n; k++) {
            keys[k] = dt_xmalloc(512);
            snprintf(keys[k], 512, "%s/shm_mapped/%d", comm->prefix, k);
        }
        st = dt_store_wait(comm->store, (const char *const *)keys, (size_t)be->n, 0);
        for (int k = 0; k < be->n; k++) free(keys[k]);
        free(keys);
        if (st != DT_STATUS_OK) goto out_unlink;
    }
out_unlink:
    /* Every rank has mapped it (or we failed): the name is no longer needed. */
    shm_unlink(be->name);
    be->name[0] = 0;
    return st;
}

/* ---- flags ------------------------------------------------------------------ */

static void post(shm_be_t *be, int which, uint64_t v) {
    shm_hdr_t *h = hdr(be, be->r);
    atomic_store(which ? &h->flag_b : &h->flag_a, v);
    if (atomic_load(&h->sleepers)) {
        atomic_fetch_add(&h->wake, 1);
        syscall(SYS_futex, &h->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

/* The peer reached flag value v: the same round and signature, or a later round
 * (a peer can be one round ahead and have overwritten the flag already). */
static inline int reached(_Atomic uint64_t *f, uint64_t v) {
    uint64_t x = atomic_load_explicit(f, memory_order_acquire);
    return x == v || (x >> 16) > (v >> 16);
}

/* This rank enters collective req: its description for the peers (op_seq last). */
static void publish_op(shm_be_t *be, const dt_comm_req_t *req) {
    shm_hdr_t *h = hdr(be, be->r);
    be->op = req;
    atomic_store(&h->op_seq, 0);
    atomic_store(&h->op_count, req->count_);
    atomic_store(&h->op_kind, (uint32_t)req->op_);
    atomic_store(&h->op_dtype, (uint32_t)req->dtype_);
    atomic_store(&h->op_root, (uint32_t)req->root_);
    atomic_store(&h->op_redop, (uint32_t)req->redop_);
    atomic_store(&h->op_seq, req->seq_ + 1); /* +1: 0 means "being rewritten" */
}

/* Rank k is in another collective under this op's number: a desync, named with both
 * ops (DT_STATUS_MISMATCH). */
static dt_status_t check_peer_op(shm_be_t *be, int k) {
    const dt_comm_req_t *req = be->op;
    if (!req) return DT_STATUS_OK;
    shm_hdr_t *h = hdr(be, k);
    uint64_t s1 = atomic_load(&h->op_seq);
    if (s1 != req->seq_ + 1) return DT_STATUS_OK; /* behind, ahead or being rewritten */
    dt_comm_req_t theirs = {0};
    theirs.count_ = (size_t)atomic_load(&h->op_count);
    theirs.op_ = (dt_comm_op_t)atomic_load(&h->op_kind);
    theirs.dtype_ = (dt_comm_dtype_t)atomic_load(&h->op_dtype);
    theirs.root_ = (int)atomic_load(&h->op_root);
    theirs.redop_ = (dt_comm_redop_t)atomic_load(&h->op_redop);
    theirs.seq_ = req->seq_;
    if (atomic_load(&h->op_seq) != s1) return DT_STATUS_OK; /* it moved on meanwhile */
    if (theirs.op_ == req->op_ && theirs.count_ == req->count_ && theirs.dtype_ == req->dtype_ &&
        (req->op_ != DT_COMM_OP_BROADCAST || theirs.root_ == req->root_) &&
        ((req->op_ != DT_COMM_OP_ALL_REDUCE && req->op_ != DT_COMM_OP_REDUCE_SCATTER) || theirs.redop_ == req->redop_))
        return DT_STATUS_OK;
    char mine[160], other[160];
    dt_comm_describe_(req, mine, sizeof mine);
    dt_comm_describe_(&theirs, other, sizeof other);
    return dt_error(DT_STATUS_MISMATCH, "desync at #%llu: this rank (%d of the communicator) is in %s, rank %d in %s "
                    "(the ranks called different collectives: one skipped or added an op)",
                    (unsigned long long)req->seq_, be->r, mine, k, other);
}

static dt_status_t wait_flag(dt_comm_t *comm, shm_be_t *be, int k, int which, uint64_t v) {
    shm_hdr_t *h = hdr(be, k);
    _Atomic uint64_t *f = which ? &h->flag_b : &h->flag_a;
    if (atomic_load_explicit(f, memory_order_acquire) == v) return DT_STATUS_OK;
    /* anything but this round's own value: the peer must be in this op, or past it */
    DT_CHECK(check_peer_op(be, k));
    if (reached(f, v)) return DT_STATUS_OK;
    dt_comm_tick_t tick = {0};
    unsigned naps = 0;
    for (int i = 0; i < SHM_SPIN; i++) {
        if (reached(f, v)) return DT_STATUS_OK;
        /* after a few microseconds of pure spinning, let other runnable threads
         * (perhaps the peer we wait for) have the CPU now and then */
        if ((i & 15) == 15 && (be->oversub || i >= 256)) sched_yield();
        dt_comm_cpu_relax();
    }
    for (;;) {
        uint32_t w = atomic_load(&h->wake);
        atomic_fetch_add(&h->sleepers, 1);
        if (!reached(f, v)) {
            struct timespec ts = {0, 2 * 1000 * 1000};
            syscall(SYS_futex, &h->wake, FUTEX_WAIT, w, &ts, NULL, 0);
        }
        atomic_fetch_sub(&h->sleepers, 1);
        if (reached(f, v)) return DT_STATUS_OK;
        DT_CHECK(check_peer_op(be, k));
        tick.n = 255; /* every pass here is at least a futex wait: check the clock */
        DT_CHECK(dt_comm_tick(comm, &tick));
        if (++naps % 50 == 0 && h->pid > 0 && kill(h->pid, 0) != 0 && errno == ESRCH) {
            char what[200];
            dt_comm_describe_(comm->cur, what, sizeof(what));
            return dt_error(DT_STATUS_CLOSED, "%s on rank %d: rank %d (pid %d) exited", what, be->r, k, (int)h->pid);
        }
    }
}

static dt_status_t wait_all(dt_comm_t *comm, shm_be_t *be, int which, uint64_t v) {
    for (int k = 0; k < be->n; k++)
        if (k != be->r) DT_CHECK(wait_flag(comm, be, k, which, v));
    return DT_STATUS_OK;
}

static uint64_t signature(const dt_comm_req_t *req) {
    uint64_t h = 1469598103934665603ull;
    uint64_t parts[5] = {(uint64_t)req->op_, (uint64_t)req->dtype_, (uint64_t)req->redop_, req->count_,
                         (uint64_t)req->root_};
    for (int i = 0; i < 5; i++) h = (h ^ parts[i]) * 1099511628211ull;
    return (h ^ (h >> 32)) & 0xffffu;
}

/* Starts a round: returns its flag value. */
static uint64_t next_round(shm_be_t *be, uint64_t sig) { return (++be->round << 16) | sig; }

/* ---- reductions of one window ---------------------------------------------------- */

/* dst (bytes in the own slot) = reduce over ranks k of src[k] (own: own_src). */
static void reduce_window(shm_be_t *be, const dt_comm_req_t *req, void *dst, const void *const *src,
                          size_t n) {
    int navg = req->redop_ == DT_COMM_AVG ? be->n : 0;
    if (req->dtype_ == DT_COMM_F32) {
        dt_comm_reduce_f32_(dst, (const float *const *)src, be->n, n, req->redop_, navg);
    } else {
        dt_comm_accum_bf16_(be->acc, (const uint16_t *const *)src, be->n, n, req->redop_, 1);
        dt_comm_f32_to_bf16_n_(dst, be->acc, n, req->redop_, navg);
    }
}

/* Output writes of large ops use non-temporal stores: the output does not fit in
 * cache anyway, and a streaming store saves the read-for-ownership of every
 * line (a third of the memory traffic of a copy). stream_fence() orders them
 * before the op is reported complete. */
#define SHM_STREAM_MIN (4u << 20) /* message bytes from which outputs stream */

static void stream_copy(void *dst, const void *src, size_t bytes) {
#if defined(__x86_64__)
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > bytes) head = bytes;
    memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    size_t body = bytes & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i)), x1 = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + 32)), x3 = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), x0);
        _mm_stream_si128((__m128i *)(d + i + 16), x1);
        _mm_stream_si128((__m128i *)(d + i + 32), x2);
        _mm_stream_si128((__m128i *)(d + i + 48), x3);
    }
    memcpy(d + body, s + body, bytes - body);
#else
    memcpy(dst, src, bytes);
#endif
}

static void plain_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

static void stream_fence(void) {
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

/* Two ranks, fp32 sum, streaming: d1 (slot) = d2 (output) = a + b. Same
 * arithmetic as dt_comm_reduce_f32_; d2 may alias a or b element by element. */
static void reduce2_sum_stream(float *d1, float *d2, const float *a, const float *b, size_t n) {
    size_t i = 0;
#if defined(__x86_64__)
    for (; i < n && ((uintptr_t)(d2 + i) & 15); i++) d1[i] = d2[i] = a[i] + b[i];
    for (; i + 4 <= n; i += 4) {
        __m128 v = _mm_add_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i));
        _mm_storeu_ps(d1 + i, v);
        _mm_stream_ps(d2 + i, v);
    }
#endif
    for (; i < n; i++) d1[i] = d2[i] = a[i] + b[i];
}

/* Two ranks, fp32: d1 = d2 = a (op) b, AVG halved; the same arithmetic as
 * dt_comm_reduce_f32_ (d2 may alias a or b element by element). */
static void reduce2_dual(float *restrict d1, float *d2, const float *a, const float *b, size_t n,
                         dt_comm_redop_t redop) {
    if (redop == DT_COMM_MAX) {
        for (size_t i = 0; i < n; i++) {
            float v = a[i] > b[i] ? a[i] : b[i];
            d1[i] = v;
            d2[i] = v;
        }
    } else if (redop == DT_COMM_AVG) {
        for (size_t i = 0; i < n; i++) {
            float v = (a[i] + b[i]) / 2.0f;
            d1[i] = v;
            d2[i] = v;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float v = a[i] + b[i];
            d1[i] = v;
            d2[i] = v;
        }
    }
}

/* ---- ops ------------------------------------------------------------------------- */

static dt_status_t small_all_reduce(dt_comm_t *comm, shm_be_t *be, dt_comm_req_t *req, uint64_t sig) {
    size_t bytes = req->count_ * dt_comm_dtype_size(req->dtype_);
    uint64_t v = next_round(be, sig);
    memcpy(slot(be, be->r, be->round), req->send_, bytes);
    post(be, 0, v);
    DT_CHECK(wait_all(comm, be, 0, v));
    const void *src[64];
    for (int k = 0; k < be->n; k++) src[k] = slot(be, k, be->round);
    reduce_window(be, req, req->recv_, src, req->count_);
    return DT_STATUS_OK;
}

/* All_reduce (gather = 1) or reduce_scatter (gather = 0) by windows of slices. */
static dt_status_t sliced_reduce(dt_comm_t *comm, shm_be_t *be, dt_comm_req_t *req, uint64_t sig, int gather) {
    size_t es = dt_comm_dtype_size(req->dtype_);
    size_t count = req->count_;
    int n = be->n, r = be->r;
    size_t cs = be->slot_bytes / es / (size_t)n; /* window elements per rank per round */
    cs &= ~(size_t)15;                           /* keep windows 64-byte aligned */
    if (cs == 0) cs = 1;
    size_t maxlen = dt_comm_slice_count(count, n, 0);
    size_t rounds = (maxlen + cs - 1) / cs;
    const uint8_t *in = req->send_;
    uint8_t *out = req->recv_;
    size_t out_base = gather ? 0 : dt_comm_slice_offset(count, n, r); /* reduce_scatter: out is the slice */
    int stream = count * es >= SHM_STREAM_MIN;
    void (*copy_out)(void *, const void *, size_t) = stream ? stream_copy : plain_copy;
    for (size_t c = 0; c < rounds; c++) {
        uint64_t v = next_round(be, sig);
        uint8_t *mine = slot(be, r, be->round);
        for (int j = 0; j < n; j++) {
            if (j == r) continue;
            size_t len = dt_comm_slice_count(count, n, j), lo = c * cs;
            if (lo >= len) continue;
            size_t m = len - lo < cs ? len - lo : cs;
            memcpy(mine + (size_t)j * cs * es, in + (dt_comm_slice_offset(count, n, j) + lo) * es, m * es);
        }
        post(be, 0, v);
        DT_CHECK(wait_all(comm, be, 0, v));
        size_t len = dt_comm_slice_count(count, n, r), lo = c * cs;
        size_t m = lo < len ? (len - lo < cs ? len - lo : cs) : 0;
        size_t off = dt_comm_slice_offset(count, n, r) + lo;
        if (m) {
            const void *src[64];
            for (int k = 0; k < n; k++)
                src[k] = k == r ? (const void *)(in + off * es) : (const void *)(slot(be, k, be->round) + (size_t)r * cs * es);
            uint8_t *dst = mine + (size_t)r * cs * es;
            if (n == 2 && req->dtype_ == DT_COMM_F32 && stream && req->redop_ == DT_COMM_SUM) {
                reduce2_sum_stream((float *)dst, (float *)(out + (off - out_base) * es), src[0], src[1], m);
            } else if (n == 2 && req->dtype_ == DT_COMM_F32) {
                /* one pass writing both the slot (for the peer) and the output */
                reduce2_dual((float *)dst, (float *)(out + (off - out_base) * es), src[0], src[1], m, req->redop_);
            } else {
                reduce_window(be, req, dst, src, m);
                copy_out(out + (off - out_base) * es, dst, m * es);
            }
        }
        if (!gather) continue;
        post(be, 1, v);
        DT_CHECK(wait_all(comm, be, 1, v));
        for (int j = 0; j < n; j++) {
            if (j == r) continue;
            size_t jl = dt_comm_slice_count(count, n, j);
            if (lo >= jl) continue;
            size_t jm = jl - lo < cs ? jl - lo : cs;
            copy_out(out + (dt_comm_slice_offset(count, n, j) + lo) * es,
                   slot(be, j, be->round) + (size_t)j * cs * es, jm * es);
        }
    }
    if (stream) stream_fence();
    return DT_STATUS_OK;
}

static dt_status_t all_gather(dt_comm_t *comm, shm_be_t *be, dt_comm_req_t *req, uint64_t sig) {
    size_t es = dt_comm_dtype_size(req->dtype_);
    size_t count = req->count_, cs = be->slot_bytes / es;
    const uint8_t *in = req->send_;
    uint8_t *out = req->recv_;
    int inplace = in == out + (size_t)be->r * count * es;
    for (size_t lo = 0; lo < count; lo += cs) {
        size_t m = count - lo < cs ? count - lo : cs;
        uint64_t v = next_round(be, sig);
        memcpy(slot(be, be->r, be->round), in + lo * es, m * es);
        post(be, 0, v);
        DT_CHECK(wait_all(comm, be, 0, v));
        for (int j = 0; j < be->n; j++) {
            if (j == be->r) {
                if (!inplace) memcpy(out + ((size_t)j * count + lo) * es, in + lo * es, m * es);
            } else {
                memcpy(out + ((size_t)j * count + lo) * es, slot(be, j, be->round), m * es);
            }
        }
    }
    return DT_STATUS_OK;
}

static dt_status_t broadcast(dt_comm_t *comm, shm_be_t *be, dt_comm_req_t *req, uint64_t sig) {
    size_t es = dt_comm_dtype_size(req->dtype_);
    size_t count = req->count_, cs = be->slot_bytes / es;
    uint8_t *buf = req->recv_;
    int root = req->root_;
    for (size_t lo = 0; lo < count; lo += cs) {
        size_t m = count - lo < cs ? count - lo : cs;
        uint64_t v = next_round(be, sig);
        if (be->r == root) memcpy(slot(be, root, be->round), buf + lo * es, m * es);
        post(be, 0, v);
        DT_CHECK(wait_all(comm, be, 0, v));
        if (be->r != root) memcpy(buf + lo * es, slot(be, root, be->round), m * es);
    }
    return DT_STATUS_OK;
}

typedef struct p2p_hdr {
    uint64_t count, seq;
    uint32_t dtype, op;
} p2p_hdr_t;
#define SHM_P2P_HDR 64u /* header room at the start of a message's first slot */
#define SHM_P2P_SIG 0x7032u /* one signature for both ends (their ops differ) */

static dt_status_t send_recv(dt_comm_t *comm, shm_be_t *be, dt_comm_req_t *req) {
    size_t bytes = req->count_ * dt_comm_dtype_size(req->dtype_), off = 0;
    uint8_t *buf = req->recv_;
    int sender = be->r == 0, first = 1;
    while (first || off < bytes) {
        size_t at = first ? SHM_P2P_HDR : 0, room = be->slot_bytes - at;
        size_t m = bytes - off < room ? bytes - off : room;
        uint64_t v = next_round(be, SHM_P2P_SIG);
        uint8_t *mine = slot(be, be->r, be->round);
        if (first) {
            p2p_hdr_t h = {req->count_, req->seq_, (uint32_t)req->dtype_, (uint32_t)req->op_};
            memcpy(mine, &h, sizeof(h));
        }
        if (sender && m) memcpy(mine + at, buf + off, m);
        post(be, 0, v);
        DT_CHECK(wait_flag(comm, be, 1 - be->r, 0, v));
        const uint8_t *theirs = slot(be, 1 - be->r, be->round);
        if (first) {
            p2p_hdr_t h;
            memcpy(&h, theirs, sizeof(h));
            if (h.count != req->count_ || h.dtype != (uint32_t)req->dtype_)
                return dt_comm_p2p_mismatch_(req, h.count, h.dtype, h.seq);
        }
        if (!sender && m) memcpy(buf + off, theirs + at, m);
        off += m;
        first = 0;
    }
    return DT_STATUS_OK;
}

static dt_status_t shm_run(dt_comm_t *comm, dt_comm_req_t *req) {
    shm_be_t *be = comm->be;
    uint64_t sig = signature(req);
    if (req->op_ == DT_COMM_OP_SEND || req->op_ == DT_COMM_OP_RECV) be->op = NULL; /* their header checks */
    else publish_op(be, req);
    switch (req->op_) {
    case DT_COMM_OP_ALL_REDUCE:
        if (req->count_ * dt_comm_dtype_size(req->dtype_) <= SHM_SMALL_MAX &&
            req->count_ * dt_comm_dtype_size(req->dtype_) <= be->slot_bytes)
            return small_all_reduce(comm, be, req, sig);
        return sliced_reduce(comm, be, req, sig, 1);
    case DT_COMM_OP_REDUCE_SCATTER: return sliced_reduce(comm, be, req, sig, 0);
    case DT_COMM_OP_ALL_GATHER: return all_gather(comm, be, req, sig);
    case DT_COMM_OP_BROADCAST: return broadcast(comm, be, req, sig);
    case DT_COMM_OP_SEND:
    case DT_COMM_OP_RECV: return send_recv(comm, be, req);
    case DT_COMM_OP_BARRIER: {
        uint64_t v = next_round(be, sig);
        post(be, 0, v);
        return wait_all(comm, be, 0, v);
    }
    }
    return dt_error(DT_STATUS_INVALID, "shm: unknown op %d", (int)req->op_);
}

const dt_comm_backend_ops_t dt_comm_shm_ops = {
    .name = "shm",
    .init = shm_init,
    .free = shm_free,
    .run = shm_run,
};
