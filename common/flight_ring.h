/*
 * flight_ring.h - the flight recorder's ring: the last N communicator ops of one
 * process, in memory a second process can read (a file both map).
 *
 * The worker writes (runtime/comm/flight.c); the agent reads, also when the
 * worker is stopped (SIGSTOP), stuck in a kernel or dead, since the ring is a
 * shared file mapping and not something the worker must dump itself.
 *
 * Writes cost no system call: an entry id from one atomic add, the clock from
 * the vDSO, plain stores. Each entry is a sequence lock: gen is odd while its
 * writer is inside it, even when stable; a reader copies the entry between two
 * loads of gen and drops it when they differ or are odd (torn: the writer was
 * in it, or was stopped in it). Entry ids count from 1; id k lives in slot
 * (k - 1) % nslots, so a ring read at any time yields the newest <= nslots
 * entries, each whole or dropped.
 *
 * An entry goes QUEUED (issued) -> STARTED (the backend runs it) -> DONE or
 * FAILED. A state update finds its entry by id and does nothing when the slot
 * was reused meanwhile (the ring wrapped around a long-running op).
 */
#ifndef DT_COMMON_FLIGHT_RING_H
#define DT_COMMON_FLIGHT_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define DT_FLIGHT_MAGIC 0x3147524c46544400ull /* "\0DTFLRG1" */
#define DT_FLIGHT_VERSION 1u
#define DT_FLIGHT_DEFAULT_SLOTS 256u
#define DT_FLIGHT_MAX_SLOTS 65536u

typedef enum dt_flight_state {
    DT_FLIGHT_QUEUED = 1,
    DT_FLIGHT_STARTED = 2,
    DT_FLIGHT_DONE = 3,
    DT_FLIGHT_FAILED = 4,
} dt_flight_state_t;

/* One op (128 bytes). Strings are NUL-terminated. Times: wall clock, ns since
 * the epoch (comparable across nodes as far as their clocks agree), 0 = not yet. */
typedef struct dt_flight_entry {
    _Atomic uint64_t gen;
    uint64_t id;
    uint64_t seq;        /* the op's sequence number in its communicator */
    uint64_t count;
    uint64_t t_enqueue_ns, t_start_ns, t_end_ns;
    int32_t peer;        /* point to point: the peer's global rank; else -1 */
    int32_t state;       /* dt_flight_state_t */
    char comm[40];       /* communicator id: "0", "0.s1.2", "0.p2p.3-5" ... */
    char op[16];         /* "all_reduce", "send" ... */
    char dtype[8];       /* "f32", "bf16" */
} dt_flight_entry_t;

typedef struct dt_flight_ring {
    uint64_t magic;
    uint32_t version, nslots;
    int32_t rank, pid;
    _Atomic uint64_t next; /* the last entry id handed out */
    uint64_t reserved[4];
    dt_flight_entry_t e[];
} dt_flight_ring_t;

/* Bytes of a ring of nslots entries. */
size_t dt_flight_ring_bytes(uint32_t nslots);
/* Formats mem (dt_flight_ring_bytes(nslots), zeroed) as an empty ring. */
void dt_flight_ring_init(dt_flight_ring_t *ring, uint32_t nslots, int rank, int pid);

/* Writer: a new entry (QUEUED, t_enqueue now); returns its id. */
uint64_t dt_flight_ring_add(dt_flight_ring_t *ring, const char *comm, const char *op, const char *dtype,
                            uint64_t seq, uint64_t count, int peer);
/* Writer: entry id moves to state (STARTED sets t_start, DONE/FAILED t_end). */
void dt_flight_ring_set_state(dt_flight_ring_t *ring, uint64_t id, dt_flight_state_t state);

/* Reader: copies the stable entries of ring (len bytes mapped) into out
 * (room for ring->nslots entries), oldest first; *n gets their number and *torn
 * the number of entries dropped because a writer was in them. FORMAT when the
 * header does not describe a ring that fits in len. */
dt_status_t dt_flight_ring_snapshot(const dt_flight_ring_t *ring, size_t len, dt_flight_entry_t *out, int *n,
                                    int *torn);
const char *dt_flight_state_name(int state);

/* Maps the ring file at path read-only (*ring, *len; unmap with
 * dt_flight_ring_unmap). NOT_FOUND when there is none. */
dt_status_t dt_flight_ring_map(const char *path, const dt_flight_ring_t **ring, size_t *len);
void dt_flight_ring_unmap(const dt_flight_ring_t *ring, size_t len);

#endif /* DT_COMMON_FLIGHT_RING_H */
