/*
 * mem.c - accounted allocation: a 64-byte header before each block records its
 * size and category, so dt_mem_free needs only the pointer.
 */
#include "common/mem.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

#define DT_MEM_ALIGN 64
#define DT_MEM_MAGIC 0x64746d656d5f6f6bull /* "dtmem_ok" */

typedef struct mem_header {
    uint64_t magic;
    uint64_t size;
    uint32_t category;
} mem_header;

_Static_assert(sizeof(mem_header) <= DT_MEM_ALIGN, "header fits the alignment pad");

static _Atomic int64_t mem_current[DT_MEM_CATEGORY_COUNT_];
static _Atomic int64_t mem_peak[DT_MEM_CATEGORY_COUNT_];
static _Atomic int64_t mem_total_current;
static _Atomic int64_t mem_total_peak;

static const char *const category_names[] = {
#define DT_MEM_NAME_(name, str) str,
    DT_MEM_CATEGORY_MAP(DT_MEM_NAME_)
#undef DT_MEM_NAME_
};

static void raise_peak(_Atomic int64_t *peak, int64_t value) {
    int64_t old = atomic_load(peak);
    while (value > old && !atomic_compare_exchange_weak(peak, &old, value)) {
    }
}

void dt_mem_account(dt_mem_category_t cat, int64_t delta) {
    if ((unsigned)cat >= DT_MEM_CATEGORY_COUNT_) cat = DT_MEM_OTHER;
    int64_t now = atomic_fetch_add(&mem_current[cat], delta) + delta;
    int64_t total = atomic_fetch_add(&mem_total_current, delta) + delta;
    if (delta > 0) {
        raise_peak(&mem_peak[cat], now);
        raise_peak(&mem_total_peak, total);
    }
}

void *dt_mem_alloc(dt_mem_category_t cat, size_t bytes) {
    if ((unsigned)cat >= DT_MEM_CATEGORY_COUNT_) cat = DT_MEM_OTHER;
    if (bytes > SIZE_MAX - 2 * DT_MEM_ALIGN) {
        dt_error(DT_STATUS_NOMEM, "allocation of %zu bytes (%s) is too large", bytes,
                 category_names[cat]);
        return NULL;
    }
    /* Round up so aligned_alloc gets a multiple of the alignment. */
    size_t total = DT_MEM_ALIGN + ((bytes + DT_MEM_ALIGN - 1) & ~(size_t)(DT_MEM_ALIGN - 1));
    unsigned char *base = aligned_alloc(DT_MEM_ALIGN, total);
    if (!base) {
        dt_error(DT_STATUS_NOMEM, "could not allocate %zu bytes for %s", bytes,
                 category_names[cat]);
        return NULL;
    }
    memset(base + DT_MEM_ALIGN, 0, total - DT_MEM_ALIGN);
    mem_header *h = (mem_header *)base;
    h->magic = DT_MEM_MAGIC;
    h->size = bytes;
    h->category = (uint32_t)cat;
    dt_mem_account(cat, (int64_t)bytes);
    return base + DT_MEM_ALIGN;
}

static mem_header *header_of(const void *ptr) {
    mem_header *h = (mem_header *)((unsigned char *)ptr - DT_MEM_ALIGN);
    if (h->magic != DT_MEM_MAGIC) {
        fprintf(stderr, "dtrun: dt_mem_free/dt_mem_size on a pointer not from dt_mem_alloc\n");
        abort();
    }
    return h;
}

void dt_mem_free(void *ptr) {
    if (!ptr) return;
    mem_header *h = header_of(ptr);
    dt_mem_account((dt_mem_category_t)h->category, -(int64_t)h->size);
    h->magic = 0;
    free(h);
}

size_t dt_mem_size(const void *ptr) { return ptr ? header_of(ptr)->size : 0; }

int64_t dt_mem_current(dt_mem_category_t cat) {
    return (unsigned)cat < DT_MEM_CATEGORY_COUNT_ ? atomic_load(&mem_current[cat]) : 0;
}

int64_t dt_mem_peak(dt_mem_category_t cat) {
    return (unsigned)cat < DT_MEM_CATEGORY_COUNT_ ? atomic_load(&mem_peak[cat]) : 0;
}

int64_t dt_mem_current_total(void) { return atomic_load(&mem_total_current); }

int64_t dt_mem_peak_total(void) { return atomic_load(&mem_total_peak); }

void dt_mem_reset_peaks(void) {
    for (int i = 0; i < DT_MEM_CATEGORY_COUNT_; i++)
        atomic_store(&mem_peak[i], atomic_load(&mem_current[i]));
    atomic_store(&mem_total_peak, atomic_load(&mem_total_current));
}

const char *dt_mem_category_name(dt_mem_category_t cat) {
    return (unsigned)cat < DT_MEM_CATEGORY_COUNT_ ? category_names[cat] : "unknown";
}

static void out_of_memory(size_t bytes) {
    fprintf(stderr, "dtrun: out of memory allocating %zu bytes\n", bytes);
    abort();
}

void *dt_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) out_of_memory(bytes);
    return p;
}

void *dt_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_memory(n * size);
    return p;
}

void *dt_xrealloc(void *ptr, size_t bytes) {
    void *p = realloc(ptr, bytes ? bytes : 1);
    if (!p) out_of_memory(bytes);
    return p;
}

char *dt_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = dt_xmalloc(n);
    memcpy(p, s, n);
    return p;
}
