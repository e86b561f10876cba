/*
 * flight_ring.c - the flight recorder's ring (flight_ring.h): entries written
 * under a per-entry sequence lock, snapshots that drop torn entries, and the
 * read-only mapping of a ring file by another process.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/flight_ring.h"

_Static_assert(sizeof(dt_flight_entry_t) == 128, "a flight entry is 128 bytes");

static uint64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* vDSO: no system call */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

size_t dt_flight_ring_bytes(uint32_t nslots) {
    return sizeof(dt_flight_ring_t) + (size_t)nslots * sizeof(dt_flight_entry_t);
}

void dt_flight_ring_init(dt_flight_ring_t *ring, uint32_t nslots, int rank, int pid) {
    ring->version = DT_FLIGHT_VERSION;
    ring->nslots = nslots;
    ring->rank = rank;
    ring->pid = pid;
    atomic_store(&ring->next, 0);
    atomic_thread_fence(memory_order_release);
    ring->magic = DT_FLIGHT_MAGIC;
}

static void copy_str(char *dst, size_t cap, const char *src) {
    size_t n = src ? strnlen(src, cap - 1) : 0;
    if (n) memcpy(dst, src, n);
    memset(dst + n, 0, cap - n);
}

/* Opens entry e for writing (gen odd) / closes it (gen even, one step on). */
static uint64_t lock_entry(dt_flight_entry_t *e) {
    uint64_t g = atomic_load_explicit(&e->gen, memory_order_relaxed);
    if (g & 1) g++; /* a writer stopped inside it (never: one writer per entry at a time) */
    atomic_store_explicit(&e->gen, g + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    return g;
}

static void unlock_entry(dt_flight_entry_t *e, uint64_t g) {
    atomic_store_explicit(&e->gen, g + 2, memory_order_release);
}

uint64_t dt_flight_ring_add(dt_flight_ring_t *ring, const char *comm, const char *op, const char *dtype,
                            uint64_t seq, uint64_t count, int peer) {
    uint64_t id = atomic_fetch_add_explicit(&ring->next, 1, memory_order_relaxed) + 1;
    dt_flight_entry_t *e = &ring->e[(id - 1) % ring->nslots];
    uint64_t g = lock_entry(e);
    e->id = id;
    e->seq = seq;
    e->count = count;
    e->t_enqueue_ns = wall_ns();
    e->t_start_ns = e->t_end_ns = 0;
    e->peer = peer;
    e->state = DT_FLIGHT_QUEUED;
    copy_str(e->comm, sizeof e->comm, comm);
    copy_str(e->op, sizeof e->op, op);
    copy_str(e->dtype, sizeof e->dtype, dtype);
    unlock_entry(e, g);
    return id;
}

void dt_flight_ring_set_state(dt_flight_ring_t *ring, uint64_t id, dt_flight_state_t state) {
    if (!id) return;
    dt_flight_entry_t *e = &ring->e[(id - 1) % ring->nslots];
    if (e->id != id) return; /* reused by a newer op */
    uint64_t g = lock_entry(e);
    e->state = (int32_t)state;
    if (state == DT_FLIGHT_STARTED) e->t_start_ns = wall_ns();
    else if (state == DT_FLIGHT_DONE || state == DT_FLIGHT_FAILED) e->t_end_ns = wall_ns();
    unlock_entry(e, g);
}

dt_status_t dt_flight_ring_snapshot(const dt_flight_ring_t *ring, size_t len, dt_flight_entry_t *out, int *n,
                                    int *torn) {
    *n = 0;
    *torn = 0;
    if (len < sizeof(dt_flight_ring_t) || ring->magic != DT_FLIGHT_MAGIC || ring->version != DT_FLIGHT_VERSION)
        return dt_error(DT_STATUS_FORMAT, "flight ring: bad header (magic or version)");
    uint32_t ns = ring->nslots;
    if (ns == 0 || ns > DT_FLIGHT_MAX_SLOTS || dt_flight_ring_bytes(ns) > len)
        return dt_error(DT_STATUS_FORMAT, "flight ring: %u slots do not fit in %zu bytes", ns, len);
    uint64_t last = atomic_load_explicit(&((dt_flight_ring_t *)ring)->next, memory_order_acquire);
    uint64_t first = last > ns ? last - ns + 1 : 1;
    /* counted, not `id <= last`: a corrupted next of 2^64 - 1 would wrap id to 0 and never end */
    for (uint64_t k = 0, id = first; last && k <= last - first; k++, id++) {
        const dt_flight_entry_t *e = &ring->e[(id - 1) % ns];
        _Atomic uint64_t *gp = (_Atomic uint64_t *)&e->gen;
        uint64_t g1 = atomic_load_explicit(gp, memory_order_acquire);
        dt_flight_entry_t copy;
        memcpy((char *)&copy + sizeof copy.gen, (const char *)e + sizeof e->gen, sizeof copy - sizeof copy.gen);
        atomic_thread_fence(memory_order_acquire);
        uint64_t g2 = atomic_load_explicit(gp, memory_order_relaxed);
        if ((g1 & 1) || g1 != g2 || copy.id != id) {
            /* a writer in it, or already a newer op there (the newer one is read when its turn comes) */
            if ((g1 & 1) || g1 != g2) (*torn)++;
            continue;
        }
        atomic_store_explicit(&copy.gen, g1, memory_order_relaxed);
        copy.comm[sizeof copy.comm - 1] = 0;
        copy.op[sizeof copy.op - 1] = 0;
        copy.dtype[sizeof copy.dtype - 1] = 0;
        out[(*n)++] = copy;
    }
    return DT_STATUS_OK;
}

const char *dt_flight_state_name(int state) {
    switch (state) {
    case DT_FLIGHT_QUEUED: return "queued";
    case DT_FLIGHT_STARTED: return "started";
    case DT_FLIGHT_DONE: return "completed";
    case DT_FLIGHT_FAILED: return "failed";
    default: return "unknown";
    }
}

dt_status_t dt_flight_ring_map(const char *path, const dt_flight_ring_t **ring, size_t *len) {
    *ring = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return dt_error(errno == ENOENT ? DT_STATUS_NOT_FOUND : DT_STATUS_IO, "flight ring %s: %s", path,
                        strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size < sizeof(dt_flight_ring_t)) {
        close(fd);
        return dt_error(DT_STATUS_FORMAT, "flight ring %s: not a ring file", path);
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return dt_error(DT_STATUS_IO, "flight ring %s: mmap: %s", path, strerror(errno));
    *ring = p;
    *len = (size_t)sb.st_size;
    return DT_STATUS_OK;
}

void dt_flight_ring_unmap(const dt_flight_ring_t *ring, size_t len) {
    if (ring) munmap((void *)ring, len);
}
