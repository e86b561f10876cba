/*
 * mem.h - checked allocation with per-category accounting.
 *
 * Every large buffer of the runtime (parameters, gradients, optimizer state,
 * activations, communication buffers) is allocated here under a category, so
 * that the current and peak bytes of each category are known exactly and can be
 * reported in summary.json and checked against the ZeRO formulas. Memory that is
 * allocated elsewhere (cudaMalloc, mmap) is recorded with dt_mem_account().
 * Counters are atomic: any thread may allocate.
 */
#ifndef DT_COMMON_MEM_H
#define DT_COMMON_MEM_H

#include <stddef.h>
#include <stdint.h>

#define DT_MEM_CATEGORY_MAP(X)                                               \
    X(PARAMS, "params")                                                      \
    X(GRADS, "grads")                                                        \
    X(MASTER, "master")                                                      \
    X(OPTIM, "optim")                                                        \
    X(ACTIVATIONS, "activations")                                            \
    X(COMM, "comm")                                                          \
    X(DATA, "data")                                                          \
    X(OTHER, "other")                                                        \
    X(OFFLOAD, "offload") /* host memory holding a GPU's offloaded optimizer state */

typedef enum dt_mem_category {
#define DT_MEM_ENUM_(name, str) DT_MEM_##name,
    DT_MEM_CATEGORY_MAP(DT_MEM_ENUM_)
#undef DT_MEM_ENUM_
    DT_MEM_CATEGORY_COUNT_
} dt_mem_category_t;

/* 64-byte aligned, zero-filled; NULL (with dt_error detail) when out of memory. */
void *dt_mem_alloc(dt_mem_category_t cat, size_t bytes);
/* Frees memory from dt_mem_alloc (NULL is fine). */
void dt_mem_free(void *ptr);
/* Bytes requested for an allocation from dt_mem_alloc. */
size_t dt_mem_size(const void *ptr);
/* Records memory allocated outside dt_mem_alloc (delta may be negative). */
void dt_mem_account(dt_mem_category_t cat, int64_t delta);

int64_t dt_mem_current(dt_mem_category_t cat);
int64_t dt_mem_peak(dt_mem_category_t cat);
/* Sum over categories now, and the peak of that sum. */
int64_t dt_mem_current_total(void);
int64_t dt_mem_peak_total(void);
/* Resets peaks to the current values (e.g. after set-up). */
void dt_mem_reset_peaks(void);
const char *dt_mem_category_name(dt_mem_category_t cat);

/* Small bookkeeping allocations: abort with a message when memory runs out,
 * as redis' zmalloc does; failure there is not recoverable. */
void *dt_xmalloc(size_t bytes);
void *dt_xcalloc(size_t n, size_t size);
void *dt_xrealloc(void *ptr, size_t bytes);
char *dt_xstrdup(const char *s);

#endif /* DT_COMMON_MEM_H */
