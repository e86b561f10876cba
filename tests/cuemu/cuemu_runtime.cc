/*
 * cuemu_runtime.cc - the emulator's CUDA runtime API: devices and their properties,
 * device and pinned memory (poisoned with 0xFF, placed so the end of each buffer is
 * within 256 bytes of a PROT_NONE page, the bytes between checked after every
 * launch), copies validated against where the pointers live, streams and events
 * (everything runs synchronously, in issue order), and the error state (the last
 * error is per host thread, as in CUDA).
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <set>

#include "tests/cuemu/cuemu_internal.h"

namespace cuemu {

namespace {

struct alloc_t {
    char *map;       /* guard page | data pages | guard page */
    size_t map_len;
    char *ptr;       /* what the caller got; 256-byte aligned */
    size_t size;     /* what the caller asked for */
    size_t padded;   /* size rounded up to 256: [ptr+size, ptr+padded) is the canary */
    bool device;
};

std::map<uintptr_t, alloc_t> g_allocs; /* by ptr */
size_t g_device_used = 0;
std::set<CUstream_st *> g_streams;
std::set<CUevent_st *> g_events;
thread_local int t_device = 0;

size_t page(void) {
    static size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

/* The emulated machine has DTRUN_CUEMU_GPUS GPUs (1 by default, 0 for none); as with
 * the real runtime, CUDA_VISIBLE_DEVICES lists the ones the process sees, up to the
 * first entry that is not a valid, unrepeated index ("" hides them all). */
int device_count(void) {
    const char *e = getenv("DTRUN_CUEMU_GPUS");
    int phys = 1;
    if (e && *e) {
        phys = atoi(e);
        phys = phys < 0 ? 0 : phys > 16 ? 16 : phys;
    }
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (!vis) return phys;
    int n = 0;
    bool seen[16] = {false};
    const char *p = vis;
    while (*p && n < phys) {
        while (*p == ' ') p++;
        const char *end;
        if (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0) { /* a UUID: taken as one of ours */
            end = p + strcspn(p, ",");
        } else {
            char *e2;
            long d = strtol(p, &e2, 10);
            if (e2 == p || d < 0 || d >= phys || seen[d]) break;
            seen[d] = true;
            end = e2;
            while (*end == ' ') end++;
            if (*end && *end != ',') break;
        }
        n++;
        p = *end ? end + 1 : end;
    }
    return n;
}

size_t device_total(void) {
    const char *e = getenv("DTRUN_CUEMU_MEM_GB");
    double gb = e && atof(e) > 0 ? atof(e) : 16.0;
    return (size_t)(gb * 1024.0 * 1024.0 * 1024.0);
}

const alloc_t *find_alloc(uintptr_t a) {
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    const alloc_t &al = it->second;
    if (a >= (uintptr_t)al.map && a < (uintptr_t)al.map + al.map_len) return &al;
    return nullptr;
}

cudaError_t do_alloc(void **out, size_t size, bool device) {
    if (!out) return cudaErrorInvalidValue;
    *out = nullptr;
    if (size == 0) return cudaSuccess;
    size_t padded = (size + 255) & ~(size_t)255;
    if (padded < size) return cudaErrorMemoryAllocation;
    if (device && padded > device_total() - g_device_used) return cudaErrorMemoryAllocation;
    size_t data_pages = (padded + page() - 1) / page() * page();
    size_t len = data_pages + 2 * page();
    void *m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
    alloc_t a;
    a.map = (char *)m;
    a.map_len = len;
    a.ptr = a.map + len - page() - padded;
    a.size = size;
    a.padded = padded;
    a.device = device;
    if (mprotect(a.map, page(), PROT_NONE) != 0 || mprotect(a.map + len - page(), page(), PROT_NONE) != 0) {
        munmap(m, len);
        return cudaErrorMemoryAllocation;
    }
    memset(a.ptr, 0xff, padded); /* poison: NaN in fp32 and bf16 */
    g_allocs[(uintptr_t)a.ptr] = a;
    if (device) g_device_used += padded;
    *out = a.ptr;
    return cudaSuccess;
}

bool canary_ok(const alloc_t &a, size_t *bad) {
    for (size_t i = a.size; i < a.padded; i++)
        if ((unsigned char)a.ptr[i] != 0xff) {
            *bad = i - a.size;
            return false;
        }
    return true;
}

/* Freed memory stays mapped but inaccessible for a while (the last 256 MiB of
 * frees), so a kernel or copy that uses a buffer after cudaFree faults instead
 * of landing in the next allocation that mmap happens to place at the same
 * address. */
void quarantine(char *map, size_t len) {
    static std::deque<std::pair<char *, size_t>> q;
    static size_t held = 0;
    const size_t cap = (size_t)256 << 20;
    if (len > cap || mprotect(map, len, PROT_NONE) != 0) {
        munmap(map, len);
        return;
    }
    q.emplace_back(map, len);
    held += len;
    while (held > cap) {
        munmap(q.front().first, q.front().second);
        held -= q.front().second;
        q.pop_front();
    }
}

cudaError_t do_free(void *p, bool device) {
    if (!p) return cudaSuccess;
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second.device != device) {
        const alloc_t *a = find_alloc((uintptr_t)p);
        fprintf(stderr, "cuemu: %s(%p): %s\n", device ? "cudaFree" : "cudaFreeHost", p,
                a ? (a->device == device ? "not the start of an allocation"
                                         : (device ? "pinned host memory (use cudaFreeHost)"
                                                   : "device memory (use cudaFree)"))
                  : "not a pointer the emulator allocated (or already freed)");
        return cudaErrorInvalidValue;
    }
    alloc_t a = it->second;
    size_t bad;
    if (!canary_ok(a, &bad))
        die("%s(%p): something wrote %zu bytes past the end of this %zu-byte buffer (found at free)",
            device ? "cudaFree" : "cudaFreeHost", p, bad + 1, a.size);
    g_allocs.erase(it);
    if (device) g_device_used -= a.padded;
    quarantine(a.map, a.map_len);
    return cudaSuccess;
}

int g_open_depth = 0;

bool host_guard_on(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DTRUN_CUEMU_HOST_GUARD");
        on = e && *e && strcmp(e, "0") != 0;
    }
    return on != 0;
}

void protect_all(int prot) {
    for (auto &kv : g_allocs) {
        const alloc_t &a = kv.second;
        if (a.device && mprotect(a.map + page(), a.map_len - 2 * page(), prot) != 0)
            die("mprotect of a device buffer failed: %s", strerror(errno));
    }
}

bool check_device(cudaError_t *e) {
    if (!device_present()) {
        *e = cudaErrorNoDevice;
        return false;
    }
    return true;
}

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

} /* namespace */

bool device_present(void) { return device_count() > 0; }

void device_mem_open(void) {
    if (host_guard_on() && g_open_depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
}

void device_mem_close(void) {
    if (host_guard_on() && --g_open_depth == 0) {
        install_fault_handler();
        protect_all(PROT_NONE);
    }
}

bool device_mem_guarded(uintptr_t a) {
    if (!host_guard_on() || g_open_depth > 0) return false;
    const alloc_t *al = find_alloc(a);
    return al && al->device && a >= (uintptr_t)al->map + page() && a < (uintptr_t)al->map + al->map_len - page();
}

bool stream_valid(cudaStream_t s) {
    return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread || g_streams.count(s) != 0;
}

mem_kind mem_classify(const void *p, size_t n, bool *inside, char *why, size_t whylen) {
    *inside = true;
    const alloc_t *a = find_alloc((uintptr_t)p);
    if (!a) return MEM_HOST;
    uintptr_t u = (uintptr_t)p, lo = (uintptr_t)a->ptr, hi = lo + a->size;
    if (u < lo || u + n > hi || u + n < u) {
        *inside = false;
        if (u < lo)
            snprintf(why, whylen, "%p is %zu bytes before the start of a %zu-byte %s buffer", p, (size_t)(lo - u),
                     a->size, a->device ? "device" : "pinned host");
        else
            snprintf(why, whylen, "[%p, +%zu) runs %zu bytes past the end of a %zu-byte %s buffer at %p", p, n,
                     (size_t)(u + n - hi), a->size, a->device ? "device" : "pinned host", (void *)a->ptr);
    }
    return a->device ? MEM_DEVICE : MEM_PINNED;
}

void describe_alloc_address(uintptr_t a, char *out, size_t len) {
    const alloc_t *al = find_alloc(a);
    if (!al) {
        snprintf(out, len, "not in any cudaMalloc'd buffer, shared memory or fiber stack (a wild pointer, or a "
                           "host pointer used in a kernel)");
        return;
    }
    uintptr_t lo = (uintptr_t)al->ptr, hi = lo + al->size;
    if (a >= lo && a < hi)
        snprintf(out, len, "byte %zu of a %zu-byte %s buffer at %p", (size_t)(a - lo), al->size,
                 al->device ? "cudaMalloc'd" : "cudaMallocHost'd", (void *)al->ptr);
    else if (a >= hi)
        snprintf(out, len, "%zu bytes past the end of a %zu-byte %s buffer at %p", (size_t)(a - hi), al->size,
                 al->device ? "cudaMalloc'd" : "cudaMallocHost'd", (void *)al->ptr);
    else
        snprintf(out, len, "%zu bytes before the start of a %zu-byte %s buffer at %p", (size_t)(lo - a), al->size,
                 al->device ? "cudaMalloc'd" : "cudaMallocHost'd", (void *)al->ptr);
}

void check_canaries(const char *kernel) {
    for (auto &kv : g_allocs) {
        size_t bad;
        if (!canary_ok(kv.second, &bad))
            die("kernel '%s' wrote past the end of a %zu-byte %s buffer at %p (byte %zu after its end was changed)",
                kernel, kv.second.size, kv.second.device ? "cudaMalloc'd" : "cudaMallocHost'd",
                (void *)kv.second.ptr, bad);
    }
}

} /* namespace cuemu */

using namespace cuemu;

struct CUstream_st {
    unsigned flags;
};
struct CUevent_st {
    unsigned flags;
    bool recorded;
    double t_ms;
};

/* ---- errors --------------------------------------------------------------------------------- */
static const struct {
    cudaError_t e;
    const char *name, *msg;
} g_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorString(cudaError_t error) {
    for (const auto &x : g_errors)
        if (x.e == error) return x.msg;
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error) {
    for (const auto &x : g_errors)
        if (x.e == error) return x.name;
    return "unrecognized error code";
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

/* ---- devices ---------------------------------------------------------------------------------- */
cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return fail(cudaErrorInvalidValue);
    *count = device_count();
    return *count ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    if (!device_present()) return fail(cudaErrorNoDevice);
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    t_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (!device) return fail(cudaErrorInvalidValue);
    if (!device_present()) return fail(cudaErrorNoDevice);
    *device = t_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (!prop) return fail(cudaErrorInvalidValue);
    if (!device_present()) return fail(cudaErrorNoDevice);
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "dtrun CPU emulator");
    prop->totalGlobalMem = device_total();
    prop->sharedMemPerBlock = DEV_SMEM_PER_BLOCK;
    prop->regsPerBlock = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = 1024;
    prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647;
    prop->maxGridSize[1] = 65535;
    prop->maxGridSize[2] = 65535;
    prop->totalConstMem = 65536;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = DEV_SM_COUNT;
    prop->memoryBusWidth = 5120;
    prop->l2CacheSize = 50 * 1024 * 1024;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->sharedMemPerMultiprocessor = 233472;
    prop->regsPerMultiprocessor = 65536;
    prop->sharedMemPerBlockOptin = DEV_SMEM_PER_BLOCK_OPTIN;
    prop->maxBlocksPerMultiProcessor = 32;
    prop->unifiedAddressing = 1;
    prop->pciDeviceID = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (!value) return fail(cudaErrorInvalidValue);
    if (!device_present()) return fail(cudaErrorNoDevice);
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: *value = 65535; break;
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = DEV_SMEM_PER_BLOCK; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = 65536; break;
    case cudaDevAttrClockRate: *value = 1980000; break;
    case cudaDevAttrMultiProcessorCount: *value = DEV_SM_COUNT; break;
    case cudaDevAttrMemoryClockRate: *value = 2619000; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = 5120; break;
    case cudaDevAttrL2CacheSize: *value = 50 * 1024 * 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 233472; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = DEV_SMEM_PER_BLOCK_OPTIN; break;
    default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    if (!free_bytes || !total) return fail(cudaErrorInvalidValue);
    if (!device_present()) return fail(cudaErrorNoDevice);
    *total = device_total();
    *free_bytes = *total - g_device_used;
    return cudaSuccess;
}

/* ---- memory ------------------------------------------------------------------------------------ */
cudaError_t cudaMalloc(void **devPtr, size_t size) {
    device_access access;
    cudaError_t e;
    if (!check_device(&e)) return fail(e);
    return fail(do_alloc(devPtr, size, true));
}

cudaError_t cudaFree(void *devPtr) {
    device_access access;
    cudaError_t e;
    if (!check_device(&e)) return fail(e);
    return fail(do_free(devPtr, true));
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
    device_access access;
    cudaError_t e;
    if (!check_device(&e)) return fail(e);
    return fail(do_alloc(ptr, size, false));
}

/* Pinned host memory as cudaMallocHost's; the flags (portable, mapped, write-combined)
 * change nothing here: every pinned buffer is visible to the one emulated device. */
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    device_access access;
    cudaError_t e;
    if (!check_device(&e)) return fail(e);
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        return fail(cudaErrorInvalidValue);
    return fail(do_alloc(pHost, size, false));
}

cudaError_t cudaFreeHost(void *ptr) {
    device_access access;
    cudaError_t e;
    if (!check_device(&e)) return fail(e);
    return fail(do_free(ptr, false));
}

static const char *kind_name(int k) {
    static const char *const n[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost",
                                    "cudaMemcpyDeviceToDevice", "cudaMemcpyDefault"};
    return k >= 0 && k <= 4 ? n[k] : "?";
}

static cudaError_t copy(const char *fn, void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                        cudaStream_t stream) {
    device_access access;
    cudaError_t e;
    if (!check_device(&e)) return fail(e);
    if ((int)kind < 0 || (int)kind > 4) return fail(cudaErrorInvalidMemcpyDirection);
    if (!stream_valid(stream)) return fail(cudaErrorInvalidResourceHandle);
    if (count == 0) return cudaSuccess;
    if (!dst || !src) {
        fprintf(stderr, "cuemu: %s: null %s pointer\n", fn, dst ? "source" : "destination");
        return fail(cudaErrorInvalidValue);
    }
    bool din, sin;
    char dwhy[256] = "", swhy[256] = "";
    mem_kind dk = mem_classify(dst, count, &din, dwhy, sizeof dwhy);
    mem_kind sk = mem_classify(src, count, &sin, swhy, sizeof swhy);
    if (!din || !sin) {
        fprintf(stderr, "cuemu: %s(%zu bytes): %s %s\n", fn, count, din ? "source" : "destination", din ? swhy : dwhy);
        return fail(cudaErrorInvalidValue);
    }
    bool want_dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault && ((dk == MEM_DEVICE) != want_dst_dev || (sk == MEM_DEVICE) != want_src_dev)) {
        fprintf(stderr, "cuemu: %s(%zu bytes, %s): the destination is %s memory and the source is %s memory\n", fn,
                count, kind_name(kind), dk == MEM_DEVICE ? "device" : "host", sk == MEM_DEVICE ? "device" : "host");
        return fail(cudaErrorInvalidValue);
    }
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    return copy("cudaMemcpy", dst, src, count, kind, nullptr);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
    return copy("cudaMemcpyAsync", dst, src, count, kind, stream);
}

/* Rows of width bytes, pitches apart: both whole spans must be memory of the kind
 * asked for (as copy checks them), and a pitch below the width is an error, as on
 * a GPU. */
static cudaError_t copy_2d(const char *fn, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height, enum cudaMemcpyKind kind, cudaStream_t stream) {
    device_access access;
    cudaError_t e;
    if (!check_device(&e)) return fail(e);
    if ((int)kind < 0 || (int)kind > 4) return fail(cudaErrorInvalidMemcpyDirection);
    if (!stream_valid(stream)) return fail(cudaErrorInvalidResourceHandle);
    if (width == 0 || height == 0) return cudaSuccess;
    if (dpitch < width || spitch < width) {
        fprintf(stderr, "cuemu: %s: %s pitch %zu below the width %zu\n", fn, dpitch < width ? "destination" : "source",
                dpitch < width ? dpitch : spitch, width);
        return fail(cudaErrorInvalidPitchValue);
    }
    if (!dst || !src) {
        fprintf(stderr, "cuemu: %s: null %s pointer\n", fn, dst ? "source" : "destination");
        return fail(cudaErrorInvalidValue);
    }
    size_t dspan = (height - 1) * dpitch + width, sspan = (height - 1) * spitch + width;
    bool din, sin;
    char dwhy[256] = "", swhy[256] = "";
    mem_kind dk = mem_classify(dst, dspan, &din, dwhy, sizeof dwhy);
    mem_kind sk = mem_classify(src, sspan, &sin, swhy, sizeof swhy);
    if (!din || !sin) {
        fprintf(stderr, "cuemu: %s(%zu rows of %zu bytes): %s %s\n", fn, height, width, din ? "source" : "destination",
                din ? swhy : dwhy);
        return fail(cudaErrorInvalidValue);
    }
    bool want_dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault && ((dk == MEM_DEVICE) != want_dst_dev || (sk == MEM_DEVICE) != want_src_dev)) {
        fprintf(stderr, "cuemu: %s(%s): the destination is %s memory and the source is %s memory\n", fn,
                kind_name(kind), dk == MEM_DEVICE ? "device" : "host", sk == MEM_DEVICE ? "device" : "host");
        return fail(cudaErrorInvalidValue);
    }
    for (size_t i = 0; i < height; i++) memmove((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
    return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream) {
    return copy_2d("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, stream);
}

static cudaError_t set(const char *fn, void *p, int value, size_t count, cudaStream_t stream) {
    device_access access;
    cudaError_t e;
    if (!check_device(&e)) return fail(e);
    if (!stream_valid(stream)) return fail(cudaErrorInvalidResourceHandle);
    if (count == 0) return cudaSuccess;
    bool in;
    char why[256] = "";
    mem_kind k = p ? mem_classify(p, count, &in, why, sizeof why) : MEM_HOST;
    if (k == MEM_HOST || !in) { /* pinned host memory is mapped for the device (UVA) */
        fprintf(stderr, "cuemu: %s(%p, %zu bytes): %s\n", fn, p, count,
                k == MEM_HOST ? "not device memory" : why);
        return fail(cudaErrorInvalidValue);
    }
    memset(p, value, count);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) { return set("cudaMemset", devPtr, value, count, nullptr); }

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    return set("cudaMemsetAsync", devPtr, value, count, stream);
}

/* ---- streams and events (synchronous: every call has finished when it returns) -------------- */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    if (!pStream || flags > cudaStreamNonBlocking) return fail(cudaErrorInvalidValue);
    if (!device_present()) return fail(cudaErrorNoDevice);
    CUstream_st *s = new CUstream_st{flags};
    g_streams.insert(s);
    *pStream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) { return cudaStreamCreateWithFlags(pStream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    if (!device_present()) return fail(cudaErrorNoDevice);
    if (!stream || !g_streams.count(stream)) return fail(cudaErrorInvalidResourceHandle);
    g_streams.erase(stream);
    delete stream;
    return cudaSuccess;
}

/* ---- counters (cuemu_counter) ---- */

static std::atomic<unsigned long long> g_counts[COUNT_N_];

void cuemu::count(counter c) { g_counts[c].fetch_add(1, std::memory_order_relaxed); }

extern "C" unsigned long long cuemu_counter(const char *name) {
    static const char *const names[COUNT_N_] = {"stream_sync", "event_sync", "blas_call"};
    for (int i = 0; i < COUNT_N_; i++)
        if (name && strcmp(name, names[i]) == 0) return g_counts[i].load(std::memory_order_relaxed);
    return ~0ULL;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    count(COUNT_STREAM_SYNC);
    if (!device_present()) return fail(cudaErrorNoDevice);
    return stream_valid(stream) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    if (!device_present()) return fail(cudaErrorNoDevice);
    if (!stream_valid(stream) || !event || !g_events.count(event)) return fail(cudaErrorInvalidResourceHandle);
    if (flags > 1) return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    count(COUNT_STREAM_SYNC);
    if (!device_present()) return fail(cudaErrorNoDevice);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    if (!event || (flags & ~7u)) return fail(cudaErrorInvalidValue);
    if (!device_present()) return fail(cudaErrorNoDevice);
    CUevent_st *ev = new CUevent_st{flags, false, 0.0};
    g_events.insert(ev);
    *event = ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    if (!device_present()) return fail(cudaErrorNoDevice);
    if (!event || !g_events.count(event) || !stream_valid(stream)) return fail(cudaErrorInvalidResourceHandle);
    event->recorded = true;
    event->t_ms = now_ms();
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    count(COUNT_EVENT_SYNC);
    if (!device_present()) return fail(cudaErrorNoDevice);
    if (!event || !g_events.count(event)) return fail(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    if (!ms) return fail(cudaErrorInvalidValue);
    if (!device_present()) return fail(cudaErrorNoDevice);
    if (!start || !end || !g_events.count(start) || !g_events.count(end)) return fail(cudaErrorInvalidResourceHandle);
    if ((start->flags | end->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
    if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
    *ms = (float)(end->t_ms - start->t_ms);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    if (!device_present()) return fail(cudaErrorNoDevice);
    if (!event || !g_events.count(event)) return fail(cudaErrorInvalidResourceHandle);
    g_events.erase(event);
    delete event;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    if (!device_present()) return fail(cudaErrorNoDevice);
    if (!func) return fail(cudaErrorInvalidDeviceFunction);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return fail(cudaErrorInvalidValue);
    if (value < 0 || value > DEV_SMEM_PER_BLOCK_OPTIN) return fail(cudaErrorInvalidValue);
    set_func_smem_max(func, value);
    return cudaSuccess;
}
