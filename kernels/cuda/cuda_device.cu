/*
 * cuda_device.cu - the CUDA device: open/close, memory (cudaMalloc accounted in
 * common/mem.h; pinned host memory by cudaHostAlloc), asynchronous copies on a
 * second stream (optimizer offload), copies (from the host through a pinned ring, without waiting for
 * the stream), fp32 upload/download through a device staging buffer,
 * the GPU's name for the peak FLOP/s table in common/gpuinfo.c, CUDA/cuBLAS error translation, and the
 * two op tables (bf16 and fp32 compute). Built into the CUDA library
 * (libdtrun_cuda.so), whose entry points kernels/backend.c finds through
 * common/cudalib.h; dt_cudalib_abi marks the library and says which layout of
 * dt_device_t / dt_ops_t it was built for.
 *
 * Ordering: every op and copy of the device runs on one stream, created with plain
 * cudaStreamCreate, i.e. a BLOCKING stream: work on the legacy default stream (what
 * runtime/comm/comm_nccl.c orders against, and synchronous cudaMemcpy) waits for it and
 * it waits for that work.
 */
#include "kernels/cuda/cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cudalib.h" /* defines: DT_CUDALIB_ABI */
#include "kernels/cuda/cuda.h"

extern "C" {
extern const int dt_cudalib_abi;
const int dt_cudalib_abi = DT_CUDALIB_ABI;
extern const unsigned long dt_cuda_kernels_layout;
const unsigned long dt_cuda_kernels_layout = DT_KERNELS_LAYOUT; /* kernels.h */
}

#define WORKSPACE_BYTES ((size_t)32 << 20)
#define SCRATCH_BYTES ((size_t)64 << 10)
/* upload_f32/download_f32 convert at most this many elements per round trip. */
#define STAGING_ELEMS ((size_t)4 << 20)
/* Host-to-device copies pass through H2D_SLOTS pinned slots of H2D_SLOT_BYTES. */
#define H2D_SLOTS 4
#define H2D_SLOT_BYTES ((size_t)4 << 20)

struct dt_cuda_alloc_rec {
    void *ptr;
    size_t bytes;
    dt_mem_category_t cat;
    int host; /* pinned host memory (host_alloc), released with cudaFreeHost */
};

/* ---- error translation ---------------------------------------------------- */

dt_status_t dt_cuda_status(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return DT_STATUS_OK;
    /* A failing runtime call also sets the thread's last error; clear it so that the
     * next kernel launch check does not report it a second time under a wrong name. */
    (void)cudaGetLastError();
    return dt_error(e == cudaErrorMemoryAllocation ? DT_STATUS_NOMEM : DT_STATUS_CUDA, "%s: %s (%s)",
                    what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static const char *blas_status_text(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "cuBLAS not initialized (CUBLAS_STATUS_NOT_INITIALIZED)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "cuBLAS could not allocate memory (CUBLAS_STATUS_ALLOC_FAILED)";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value given to cuBLAS (CUBLAS_STATUS_INVALID_VALUE)";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "not supported by this GPU architecture (CUBLAS_STATUS_ARCH_MISMATCH)";
    case CUBLAS_STATUS_MAPPING_ERROR: return "GPU memory access failed (CUBLAS_STATUS_MAPPING_ERROR)";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "GPU program failed to execute (CUBLAS_STATUS_EXECUTION_FAILED)";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "cuBLAS internal error (CUBLAS_STATUS_INTERNAL_ERROR)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "operation not supported (CUBLAS_STATUS_NOT_SUPPORTED)";
    case CUBLAS_STATUS_LICENSE_ERROR: return "cuBLAS license error (CUBLAS_STATUS_LICENSE_ERROR)";
    default: return "unknown cuBLAS status";
    }
}

dt_status_t dt_cublas_status(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return DT_STATUS_OK;
    return dt_error(s == CUBLAS_STATUS_ALLOC_FAILED ? DT_STATUS_NOMEM : DT_STATUS_CUDA, "%s: %s (status %d)",
                    what, blas_status_text(s), (int)s);
}

static int sticky_free(const dt_cuda_impl *c) {
    return c->sticky == cudaSuccess && c->sticky_blas == CUBLAS_STATUS_SUCCESS;
}

static void note_op(dt_cuda_impl *c, const char *op) {
    snprintf(c->sticky_op, sizeof c->sticky_op, "%s", op ? op : "?");
}

void dt_cuda_note_launch(dt_device_t *dev, const char *op) {
    cudaError_t e = cudaGetLastError();
    dt_cuda_impl *c = dt_cuda(dev);
    if (e == cudaSuccess && c->sync_each_op) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess && sticky_free(c)) {
        c->sticky = e;
        note_op(c, op);
    }
}

void dt_cuda_note_error(dt_device_t *dev, const char *op, cudaError_t e) {
    dt_cuda_impl *c = dt_cuda(dev);
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();
    if (sticky_free(c)) {
        c->sticky = e;
        note_op(c, op);
    }
}

void dt_cuda_note_blas(dt_device_t *dev, const char *op, cublasStatus_t s) {
    dt_cuda_impl *c = dt_cuda(dev);
    if (s == CUBLAS_STATUS_SUCCESS && c->sync_each_op) {
        dt_cuda_note_error(dev, op, cudaStreamSynchronize(c->stream));
        return;
    }
    if (s != CUBLAS_STATUS_SUCCESS && sticky_free(c)) {
        c->sticky_blas = s;
        note_op(c, op);
    }
}

/* ---- device count, peak FLOP/s ---------------------------------------------- */

extern "C" int dt_cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver / no GPU: not an error here */
        return 0;
    }
    return n > 0 ? n : 0;
}

/* The GPU's peak is looked up by its name (dev->name) in the one GPU table,
 * runtime/tools/plan.c, which kernels/ cannot include: the slot answers "unknown". */
static double cuda_peak_flops(dt_device_t *dev) { return 0.0; }

/* ---- memory ----------------------------------------------------------------- */

/* The CUDA runtime's current device is per thread. Memory calls may come from any
 * thread (checkpoint, data, communication), so they select the device first; the
 * compute ops run on the thread that opened the device. */
static dt_status_t bind(dt_device_t *dev) {
    return dt_cuda_status(cudaSetDevice(dev->ordinal), "cudaSetDevice");
}

static dt_status_t cuda_mem_info(dt_device_t *dev, size_t *free_bytes, size_t *total_bytes) {
    DT_CHECK(bind(dev));
    return dt_cuda_status(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

static dt_status_t cuda_alloc(dt_device_t *dev, dt_mem_category_t cat, size_t bytes, void **out) {
    dt_cuda_impl *c = dt_cuda(dev);
    *out = NULL;
    if ((unsigned)cat >= DT_MEM_CATEGORY_COUNT_)
        return dt_error(DT_STATUS_INVALID, "alloc: unknown memory category %d", (int)cat);
    size_t want = bytes ? bytes : 1;
    void *p = NULL;
    char what[96];
    snprintf(what, sizeof what, "alloc of %zu bytes (%s) on GPU %d", bytes, dt_mem_category_name(cat),
             dev->ordinal);
    DT_CHECK(bind(dev));
    cudaError_t e = cudaMalloc(&p, want);
    if (e == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total_b = 0;
        (void)cudaGetLastError();
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
        return dt_error(DT_STATUS_NOMEM, "%s: out of GPU memory (%.1f MiB free of %.1f MiB)", what,
                        free_b / 1048576.0, total_b / 1048576.0);
    }
    DT_CHECK(dt_cuda_status(e, what));
    /* Zero-filled (kernels.h), in stream order before any op that uses it. */
    dt_status_t st = dt_cuda_status(cudaMemsetAsync(p, 0, want, c->stream), what);
    if (st != DT_STATUS_OK) {
        cudaFree(p);
        return st;
    }
    pthread_mutex_lock(&c->alloc_lock);
    if (c->nallocs == c->cap_allocs) {
        c->cap_allocs = c->cap_allocs ? 2 * c->cap_allocs : 64;
        c->allocs = (struct dt_cuda_alloc_rec *)dt_xrealloc(c->allocs, c->cap_allocs * sizeof *c->allocs);
    }
    c->allocs[c->nallocs++] = dt_cuda_alloc_rec{p, want, cat, 0};
    pthread_mutex_unlock(&c->alloc_lock);
    dt_mem_account(cat, (int64_t)want);
    *out = p;
    return DT_STATUS_OK;
}

/* Removes ptr's record (host: a host_alloc one) and returns it; .ptr NULL when none. */
static struct dt_cuda_alloc_rec take_rec(dt_cuda_impl *c, void *ptr, int host) {
    struct dt_cuda_alloc_rec rec = {NULL, 0, DT_MEM_OTHER, 0};
    pthread_mutex_lock(&c->alloc_lock);
    for (size_t i = 0; i < c->nallocs; i++) {
        if (c->allocs[i].ptr == ptr && c->allocs[i].host == host) {
            rec = c->allocs[i];
            c->allocs[i] = c->allocs[--c->nallocs];
            break;
        }
    }
    pthread_mutex_unlock(&c->alloc_lock);
    return rec;
}

static void record_alloc(dt_cuda_impl *c, void *p, size_t bytes, dt_mem_category_t cat, int host) {
    pthread_mutex_lock(&c->alloc_lock);
    if (c->nallocs == c->cap_allocs) {
        c->cap_allocs = c->cap_allocs ? 2 * c->cap_allocs : 64;
        c->allocs = (struct dt_cuda_alloc_rec *)dt_xrealloc(c->allocs, c->cap_allocs * sizeof *c->allocs);
    }
    c->allocs[c->nallocs++] = dt_cuda_alloc_rec{p, bytes, cat, host};
    pthread_mutex_unlock(&c->alloc_lock);
    dt_mem_account(cat, (int64_t)bytes);
}

/* Pinned host memory (cudaHostAlloc, portable to every context), zero-filled on the host. */
static dt_status_t cuda_host_alloc(dt_device_t *dev, dt_mem_category_t cat, size_t bytes, void **out) {
    *out = NULL;
    if ((unsigned)cat >= DT_MEM_CATEGORY_COUNT_)
        return dt_error(DT_STATUS_INVALID, "host_alloc: unknown memory category %d", (int)cat);
    size_t want = bytes ? bytes : 1;
    char what[96];
    snprintf(what, sizeof what, "pinned host alloc of %zu bytes (%s) for GPU %d", bytes, dt_mem_category_name(cat),
             dev->ordinal);
    DT_CHECK(bind(dev));
    void *p = NULL;
    DT_CHECK(dt_cuda_status(cudaHostAlloc(&p, want, cudaHostAllocPortable), what));
    memset(p, 0, want);
    record_alloc(dt_cuda(dev), p, want, cat, 1);
    *out = p;
    return DT_STATUS_OK;
}

static void cuda_host_free(dt_device_t *dev, void *ptr) {
    if (!ptr) return;
    struct dt_cuda_alloc_rec rec = take_rec(dt_cuda(dev), ptr, 1);
    if (!rec.ptr) {
        DT_LOG_WARN("cuda host free: %p was not allocated by this device's host_alloc; ignored", ptr);
        return;
    }
    (void)bind(dev);
    cudaError_t e = cudaFreeHost(ptr);
    if (e != cudaSuccess) {
        DT_LOG_WARN("cuda host free of %zu bytes: %s", rec.bytes, cudaGetErrorString(e));
        (void)cudaGetLastError();
    }
    dt_mem_account(rec.cat, -(int64_t)rec.bytes);
}

static void cuda_free(dt_device_t *dev, void *ptr) {
    if (!ptr) return;
    dt_cuda_impl *c = dt_cuda(dev);
    struct dt_cuda_alloc_rec rec = {NULL, 0, DT_MEM_OTHER, 0};
    pthread_mutex_lock(&c->alloc_lock);
    for (size_t i = 0; i < c->nallocs; i++) {
        if (c->allocs[i].ptr == ptr && !c->allocs[i].host) {
            rec = c->allocs[i];
            c->allocs[i] = c->allocs[--c->nallocs];
            break;
        }
    }
    pthread_mutex_unlock(&c->alloc_lock);
    if (!rec.ptr) {
        DT_LOG_WARN("cuda free: %p was not allocated by this device; ignored", ptr);
        return;
    }
    (void)bind(dev);
    cudaError_t e = cudaFree(ptr); /* waits for work that may still use it */
    if (e != cudaSuccess) {
        DT_LOG_WARN("cuda free of %zu bytes: %s", rec.bytes, cudaGetErrorString(e));
        (void)cudaGetLastError();
    }
    dt_mem_account(rec.cat, -(int64_t)rec.bytes);
}

static const char *copy_kind_name(dt_copy_kind_t kind) {
    switch (kind) {
    case DT_COPY_HOST_TO_DEVICE: return "host to device";
    case DT_COPY_DEVICE_TO_HOST: return "device to host";
    case DT_COPY_DEVICE_TO_DEVICE: return "device to device";
    case DT_COPY_HOST_TO_HOST: return "host to host";
    }
    return "unknown";
}

/* ---- host-to-device copies through a pinned ring -----------------------------
 * kernels.h lets the caller reuse the source of a copy from the host once the copy
 * returns. Waiting for the stream after each one would keep the host from running
 * ahead of the GPU; instead the bytes are copied on the host into a pinned slot, the
 * slot is copied to the device in stream order, and an event marks when it is free
 * again: only reusing a slot waits, and only for that slot's copy. Slots are filled
 * in turn, so a large copy is a pipeline of 4 MiB pieces. Without pinned memory
 * (cudaMallocHost failed) the copy falls back to waiting for the stream. */
struct dt_cuda_h2d_ring {
    pthread_mutex_t lock; /* copies may come from any thread */
    char *slot[H2D_SLOTS];
    cudaEvent_t done[H2D_SLOTS];
    int pending[H2D_SLOTS]; /* done[i] was recorded after slot i was last filled */
    int next;
    int broken; /* could not be set up: wait for the stream instead */
};

static void h2d_ring_free(struct dt_cuda_h2d_ring *r) {
    if (!r) return;
    for (int i = 0; i < H2D_SLOTS; i++) {
        if (r->done[i]) (void)cudaEventSynchronize(r->done[i]);
        if (r->done[i]) cudaEventDestroy(r->done[i]);
        if (r->slot[i]) cudaFreeHost(r->slot[i]);
    }
    (void)cudaGetLastError();
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/* The device's ring, made on first use (one thread at a time: the device's users
 * serialize on the ring's lock once it exists; its creation is under alloc_lock). */
static struct dt_cuda_h2d_ring *h2d_ring(dt_cuda_impl *c) {
    pthread_mutex_lock(&c->alloc_lock);
    if (!c->h2d) {
        struct dt_cuda_h2d_ring *r = (struct dt_cuda_h2d_ring *)dt_xcalloc(1, sizeof *r);
        pthread_mutex_init(&r->lock, NULL);
        for (int i = 0; i < H2D_SLOTS && !r->broken; i++)
            if (cudaMallocHost(&r->slot[i], H2D_SLOT_BYTES) != cudaSuccess ||
                cudaEventCreateWithFlags(&r->done[i], cudaEventDisableTiming) != cudaSuccess)
                r->broken = 1;
        if (r->broken) {
            (void)cudaGetLastError();
            DT_LOG_WARN("cuda: no pinned staging for host-to-device copies; each copy waits for the GPU");
        }
        c->h2d = r;
    }
    pthread_mutex_unlock(&c->alloc_lock);
    return c->h2d;
}

/* dst (device) = src (host, bytes), in stream order; src may be reused on return. */
static dt_status_t h2d_copy(dt_device_t *dev, void *dst, const void *src, size_t bytes, const char *what) {
    dt_cuda_impl *c = dt_cuda(dev);
    struct dt_cuda_h2d_ring *r = h2d_ring(c);
    if (r->broken) {
        DT_CHECK(dt_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), what));
        return dt_cuda_status(cudaStreamSynchronize(c->stream), what);
    }
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&r->lock);
    for (size_t off = 0; off < bytes && e == cudaSuccess; off += H2D_SLOT_BYTES) {
        size_t k = bytes - off < H2D_SLOT_BYTES ? bytes - off : H2D_SLOT_BYTES;
        int i = r->next;
        r->next = (i + 1) % H2D_SLOTS;
        if (r->pending[i]) e = cudaEventSynchronize(r->done[i]);
        r->pending[i] = 0;
        if (e != cudaSuccess) break;
        memcpy(r->slot[i], (const char *)src + off, k);
        e = cudaMemcpyAsync((char *)dst + off, r->slot[i], k, cudaMemcpyHostToDevice, c->stream);
        if (e == cudaSuccess) e = cudaEventRecord(r->done[i], c->stream);
        if (e == cudaSuccess) r->pending[i] = 1;
    }
    pthread_mutex_unlock(&r->lock);
    return dt_cuda_status(e, what);
}

static dt_status_t cuda_copy(dt_device_t *dev, void *dst, const void *src, size_t bytes, dt_copy_kind_t kind) {
    dt_cuda_impl *c = dt_cuda(dev);
    if ((unsigned)kind > DT_COPY_HOST_TO_HOST)
        return dt_error(DT_STATUS_INVALID, "copy: unknown copy kind %d", (int)kind);
    if (bytes && (!dst || !src))
        return dt_error(DT_STATUS_INVALID, "copy (%s): NULL %s for %zu bytes", copy_kind_name(kind),
                        dst ? "source" : "destination", bytes);
    if (!bytes) return DT_STATUS_OK;
    char what[96];
    snprintf(what, sizeof what, "copy (%s) of %zu bytes", copy_kind_name(kind), bytes);
    if (kind == DT_COPY_HOST_TO_HOST) {
        /* Host memory may be the target of an earlier device-to-host copy, which has
         * landed (copy waits for those); nothing else on the stream touches it. */
        memmove(dst, src, bytes);
        return DT_STATUS_OK;
    }
    DT_CHECK(bind(dev));
    /* From the host: the source may be reused at once (kernels.h), which the pinned
     * ring gives without waiting for the stream. */
    if (kind == DT_COPY_HOST_TO_DEVICE) return h2d_copy(dev, dst, src, bytes, what);
    cudaMemcpyKind k = kind == DT_COPY_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    DT_CHECK(dt_cuda_status(cudaMemcpyAsync(dst, src, bytes, k, c->stream), what));
    /* To the host: the data has landed when copy returns. */
    if (kind == DT_COPY_DEVICE_TO_HOST) DT_CHECK(dt_cuda_status(cudaStreamSynchronize(c->stream), what));
    return DT_STATUS_OK;
}

static dt_status_t cuda_copy_2d(dt_device_t *dev, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                size_t width, size_t height) {
    dt_cuda_impl *c = dt_cuda(dev);
    if (!width || !height) return DT_STATUS_OK;
    if (dst_pitch < width || src_pitch < width)
        return dt_error(DT_STATUS_INVALID, "copy_2d: %s pitch %zu below the width %zu bytes",
                        dst_pitch < width ? "destination" : "source", dst_pitch < width ? dst_pitch : src_pitch,
                        width);
    if (!dst || !src)
        return dt_error(DT_STATUS_INVALID, "copy_2d: NULL %s for %zu rows of %zu bytes",
                        dst ? "source" : "destination", height, width);
    char what[96];
    snprintf(what, sizeof what, "copy_2d of %zu rows of %zu bytes", height, width);
    DT_CHECK(bind(dev));
    return dt_cuda_status(
        cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice, c->stream), what);
}

/* ---- asynchronous copies on a second stream --------------------------------------
 * The copy stream waits for an event recorded on the compute stream, so a copy
 * starts after the ops issued before it and the compute stream runs on meanwhile
 * (the overlap of optimizer offload: gradient shards go down while backward
 * computes the next buckets). One event serves every call: cudaStreamWaitEvent
 * takes the event's state when called. */
static dt_status_t copy_stream(dt_cuda_impl *c) {
    if (c->copy_stream) return DT_STATUS_OK;
    DT_CHECK(dt_cuda_status(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking), "copy stream"));
    return dt_cuda_status(cudaEventCreateWithFlags(&c->copy_after, cudaEventDisableTiming), "copy stream event");
}

static dt_status_t cuda_copy_async(dt_device_t *dev, void *dst, const void *src, size_t bytes, dt_copy_kind_t kind) {
    dt_cuda_impl *c = dt_cuda(dev);
    if (kind != DT_COPY_HOST_TO_DEVICE && kind != DT_COPY_DEVICE_TO_HOST)
        return dt_error(DT_STATUS_INVALID, "copy_async: %s copies are not asynchronous (host to device or device "
                        "to host only)", copy_kind_name(kind));
    if (bytes && (!dst || !src))
        return dt_error(DT_STATUS_INVALID, "copy_async (%s): NULL %s for %zu bytes", copy_kind_name(kind),
                        dst ? "source" : "destination", bytes);
    if (!bytes) return DT_STATUS_OK;
    char what[96];
    snprintf(what, sizeof what, "copy_async (%s) of %zu bytes", copy_kind_name(kind), bytes);
    DT_CHECK(bind(dev));
    DT_CHECK(copy_stream(c));
    DT_CHECK(dt_cuda_status(cudaEventRecord(c->copy_after, c->stream), what));
    DT_CHECK(dt_cuda_status(cudaStreamWaitEvent(c->copy_stream, c->copy_after, 0), what));
    cudaMemcpyKind k = kind == DT_COPY_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    return dt_cuda_status(cudaMemcpyAsync(dst, src, bytes, k, c->copy_stream), what);
}

static dt_status_t cuda_copy_async_wait(dt_device_t *dev) {
    dt_cuda_impl *c = dt_cuda(dev);
    if (!c->copy_stream) return DT_STATUS_OK;
    DT_CHECK(bind(dev));
    return dt_cuda_status(cudaStreamSynchronize(c->copy_stream), "copy_async_wait");
}

static dt_status_t cuda_set(dt_device_t *dev, void *ptr, int byte, size_t bytes) {
    if (bytes && !ptr) return dt_error(DT_STATUS_INVALID, "set: NULL pointer for %zu bytes", bytes);
    if (!bytes) return DT_STATUS_OK;
    char what[64];
    snprintf(what, sizeof what, "set of %zu bytes", bytes);
    DT_CHECK(bind(dev));
    return dt_cuda_status(cudaMemsetAsync(ptr, byte, bytes, dt_cuda(dev)->stream), what);
}

static dt_status_t cuda_synchronize(dt_device_t *dev) {
    dt_cuda_impl *c = dt_cuda(dev);
    DT_CHECK(bind(dev));
    cudaError_t e = cudaStreamSynchronize(c->stream);
    /* Also catches a launch error whose op forgot DT_CUDA_LAUNCHED. */
    cudaError_t late = cudaGetLastError();
    if (c->sticky != cudaSuccess) {
        cudaError_t s = c->sticky;
        c->sticky = cudaSuccess; /* reported once */
        return dt_error(s == cudaErrorMemoryAllocation ? DT_STATUS_NOMEM : DT_STATUS_CUDA,
                        "GPU %d op %s failed: %s (%s)", dev->ordinal, c->sticky_op, cudaGetErrorString(s),
                        cudaGetErrorName(s));
    }
    if (c->sticky_blas != CUBLAS_STATUS_SUCCESS) {
        cublasStatus_t s = c->sticky_blas;
        c->sticky_blas = CUBLAS_STATUS_SUCCESS;
        char what[96];
        snprintf(what, sizeof what, "GPU %d op %s failed in cuBLAS", dev->ordinal, c->sticky_op);
        return dt_cublas_status(s, what);
    }
    char what[64];
    snprintf(what, sizeof what, "synchronize GPU %d", dev->ordinal);
    if (e != cudaSuccess) return dt_cuda_status(e, what);
    return dt_cuda_status(late, what);
}

/* ---- fp32 upload / download -------------------------------------------------- */

template <typename T> __global__ void cast_from_f32_kernel(T *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = dt_st<T>(src[i]);
}

template <typename T> __global__ void cast_to_f32_kernel(float *dst, const T *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = dt_ld(src[i]);
}

/* The staging buffer holds min(n, STAGING_ELEMS) floats; grown on demand. */
static dt_status_t staging_reserve(dt_device_t *dev, size_t n) {
    dt_cuda_impl *c = dt_cuda(dev);
    size_t want = (n < STAGING_ELEMS ? n : STAGING_ELEMS) * sizeof(float);
    if (c->staging_bytes >= want) return DT_STATUS_OK;
    h2d_ring_free(c->h2d);
    c->h2d = NULL;
    if (c->staging) {
        cudaFree(c->staging);
        dt_mem_account(DT_MEM_OTHER, -(int64_t)c->staging_bytes);
        c->staging = NULL;
        c->staging_bytes = 0;
    }
    DT_CHECK(dt_cuda_status(cudaMalloc(&c->staging, want), "staging buffer for fp32 upload/download"));
    c->staging_bytes = want;
    dt_mem_account(DT_MEM_OTHER, (int64_t)want);
    return DT_STATUS_OK;
}

static dt_status_t cuda_upload_f32(dt_device_t *dev, void *dst, const float *src, size_t n) {
    dt_cuda_impl *c = dt_cuda(dev);
    if (!n) return DT_STATUS_OK;
    if (!dst || !src) return dt_error(DT_STATUS_INVALID, "upload_f32: NULL %s for %zu elements", dst ? "source" : "destination", n);
    if (dev->ops->dtype == DT_DTYPE_F32) return cuda_copy(dev, dst, src, n * sizeof(float), DT_COPY_HOST_TO_DEVICE);
    DT_CHECK(bind(dev));
    DT_CHECK(staging_reserve(dev, n));
    dt_bf16 *d = (dt_bf16 *)dst;
    for (size_t off = 0; off < n; off += STAGING_ELEMS) {
        size_t k = n - off < STAGING_ELEMS ? n - off : STAGING_ELEMS;
        /* Stream order keeps the next chunk's copy into staging behind this chunk's
         * cast; h2d_copy lets the caller reuse src at once (see cuda_copy). */
        DT_CHECK(h2d_copy(dev, c->staging, src + off, k * sizeof(float), "upload_f32: copy to the staging buffer"));
        DT_LAUNCH(cast_from_f32_kernel<dt_bf16>, dt_cuda_grid(dev, k, 256), 256, 0, c->stream)(d + off, (const float *)c->staging, k);
        DT_CHECK(dt_cuda_status(cudaGetLastError(), "upload_f32: cast kernel launch"));
    }
    return DT_STATUS_OK;
}

static dt_status_t cuda_download_f32(dt_device_t *dev, float *dst, const void *src, size_t n) {
    dt_cuda_impl *c = dt_cuda(dev);
    if (!n) return DT_STATUS_OK;
    if (!dst || !src) return dt_error(DT_STATUS_INVALID, "download_f32: NULL %s for %zu elements", dst ? "source" : "destination", n);
    if (dev->ops->dtype == DT_DTYPE_F32) return cuda_copy(dev, dst, src, n * sizeof(float), DT_COPY_DEVICE_TO_HOST);
    DT_CHECK(bind(dev));
    DT_CHECK(staging_reserve(dev, n));
    const dt_bf16 *s = (const dt_bf16 *)src;
    for (size_t off = 0; off < n; off += STAGING_ELEMS) {
        size_t k = n - off < STAGING_ELEMS ? n - off : STAGING_ELEMS;
        DT_LAUNCH(cast_to_f32_kernel<dt_bf16>, dt_cuda_grid(dev, k, 256), 256, 0, c->stream)((float *)c->staging, s + off, k);
        DT_CHECK(dt_cuda_status(cudaGetLastError(), "download_f32: cast kernel launch"));
        DT_CHECK(dt_cuda_status(cudaMemcpyAsync(dst + off, c->staging, k * sizeof(float), cudaMemcpyDeviceToHost,
                                                c->stream),
                                "download_f32: copy from the staging buffer"));
        DT_CHECK(dt_cuda_status(cudaStreamSynchronize(c->stream), "download_f32"));
    }
    return DT_STATUS_OK;
}

/* ---- casts between the two dtypes (gradient reductions in another dtype) ------ */

template <typename To, typename From> __global__ void cast_kernel(To *dst, const From *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = dt_st<To>(dt_ld(src[i]));
}

static void cuda_cast(dt_device_t *dev, void *dst, dt_dtype_t to, const void *src, dt_dtype_t from, size_t n) {
    dt_cuda_impl *c = dt_cuda(dev);
    if (!n) return;
    if (to == from) {
        if (dst != src) {
            cudaError_t e = cudaMemcpyAsync(dst, src, n * dt_dtype_size(to), cudaMemcpyDeviceToDevice, c->stream);
            if (e != cudaSuccess) dt_cuda_note_error(dev, "cast", e);
        }
        return;
    }
    if (to == DT_DTYPE_BF16)
        DT_LAUNCH((cast_kernel<dt_bf16, float>), dt_cuda_grid(dev, n, 256), 256, 0, c->stream)((dt_bf16 *)dst,
                                                                                            (const float *)src, n);
    else
        DT_LAUNCH((cast_kernel<float, dt_bf16>), dt_cuda_grid(dev, n, 256), 256, 0, c->stream)((float *)dst,
                                                                                            (const dt_bf16 *)src, n);
    DT_CUDA_LAUNCHED(dev);
}

/* ---- the op tables ---------------------------------------------------------- */

static dt_ops_t ops_bf16, ops_f32;
static pthread_once_t ops_once = PTHREAD_ONCE_INIT;

static void fill_table(dt_ops_t *o, dt_dtype_t dtype) {
    memset(o, 0, sizeof *o);
    o->name = "cuda";
    o->dtype = dtype;
    o->alloc = cuda_alloc;
    o->free = cuda_free;
    o->copy = cuda_copy;
    o->copy_2d = cuda_copy_2d;
    o->set = cuda_set;
    o->synchronize = cuda_synchronize;
    o->host_alloc = cuda_host_alloc;
    o->host_free = cuda_host_free;
    o->copy_async = cuda_copy_async;
    o->copy_async_wait = cuda_copy_async_wait;
    o->upload_f32 = cuda_upload_f32;
    o->download_f32 = cuda_download_f32;
    o->peak_flops = cuda_peak_flops;
    o->mem_info = cuda_mem_info;
    o->cast = cuda_cast;
    dt_cuda_fill_core_ops(o, dtype);
    if (dt_cuda_fill_layer_ops) dt_cuda_fill_layer_ops(o, dtype);
}

static void fill_tables(void) {
    fill_table(&ops_bf16, DT_DTYPE_BF16);
    fill_table(&ops_f32, DT_DTYPE_F32);
}

/* ---- open / close ------------------------------------------------------------ */

extern "C" dt_status_t dt_cuda_device_init(dt_device_t *dev, int ordinal, dt_dtype_t dtype) {
    if (dtype != DT_DTYPE_F32 && dtype != DT_DTYPE_BF16)
        return dt_error(DT_STATUS_UNSUPPORTED, "device 'cuda' computes in fp32 or bf16 (asked for dtype %d)",
                        (int)dtype);
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return dt_error(DT_STATUS_UNSUPPORTED, "device 'cuda' is not available: %s (%s); CUDA_VISIBLE_DEVICES=%s",
                        cudaGetErrorString(e), cudaGetErrorName(e), cvd ? cvd : "(unset)");
    }
    if (ordinal < 0 || ordinal >= n)
        return dt_error(DT_STATUS_UNSUPPORTED,
                        "device 'cuda' is not available: no CUDA device %d, %d GPU%s visible (CUDA_VISIBLE_DEVICES=%s)", ordinal, n,
                        n == 1 ? "" : "s", cvd ? cvd : "(unset)");
    e = cudaSetDevice(ordinal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return dt_error(DT_STATUS_UNSUPPORTED, "cannot use CUDA device %d of %d (CUDA_VISIBLE_DEVICES=%s): %s (%s)",
                        ordinal, n, cvd ? cvd : "(unset)", cudaGetErrorString(e), cudaGetErrorName(e));
    }

    dt_cuda_impl *c = (dt_cuda_impl *)dt_xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->alloc_lock, NULL);
    dev->kind = DT_DEVICE_CUDA;
    dev->ordinal = ordinal;
    dev->impl = c;
    dt_status_t st = DT_STATUS_OK;

    cudaDeviceProp prop;
    DT_CHECK_GOTO(dt_cuda_status(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties"), st, out_free);
    snprintf(c->name, sizeof c->name, "%s", prop.name);
    snprintf(dev->name, sizeof dev->name, "%.*s", (int)sizeof dev->name - 1, prop.name); /* runtime/ reads it */
    c->sm_count = prop.multiProcessorCount;
    c->cc_major = prop.major;
    c->cc_minor = prop.minor;
    if (dtype == DT_DTYPE_BF16 && c->cc_major < 8) {
        st = dt_error(DT_STATUS_UNSUPPORTED, "CUDA device %d (%s, compute capability %d.%d) has no bf16 tensor cores; "
                      "bf16 needs 8.0 or newer (set bf16.enabled=false for fp32)", ordinal, c->name, c->cc_major, c->cc_minor);
        goto out_free;
    }

    DT_CHECK_GOTO(dt_cuda_status(cudaStreamCreate(&c->stream), "cudaStreamCreate"), st, out_free);
    DT_CHECK_GOTO(dt_cublas_status(cublasLtCreate(&c->lt), "cublasLtCreate"), st, out_free);
    DT_CHECK_GOTO(dt_cublas_status(cublasCreate(&c->blas), "cublasCreate"), st, out_free);
    DT_CHECK_GOTO(dt_cublas_status(cublasSetStream(c->blas, c->stream), "cublasSetStream"), st, out_free);
    DT_CHECK_GOTO(dt_cuda_status(cudaMalloc(&c->workspace, WORKSPACE_BYTES), "cuBLASLt workspace (32 MiB)"), st, out_free);
    c->workspace_bytes = WORKSPACE_BYTES;
    dt_mem_account(DT_MEM_OTHER, (int64_t)c->workspace_bytes);
    DT_CHECK_GOTO(dt_cuda_status(cudaMalloc(&c->scratch, SCRATCH_BYTES), "reduction scratch"), st, out_free);
    c->scratch_bytes = SCRATCH_BYTES;
    dt_mem_account(DT_MEM_OTHER, (int64_t)c->scratch_bytes);

    pthread_once(&ops_once, fill_tables);
    dev->ops = dtype == DT_DTYPE_BF16 ? &ops_bf16 : &ops_f32;
    if (!dev->ops->encoder_forward || !dev->ops->layernorm_forward || !dev->ops->attention_forward ||
        !dev->ops->softmax_xent_forward)
        DT_LOG_WARN("cuda device %d: this build has no CUDA layer ops (encoder, layernorm, attention, losses); "
                    "only the core ops (memory, matmul, elementwise, optimizer) are available", ordinal);
    {
        const char *e = getenv("DTRUN_CUDA_SYNC_OPS");
        c->sync_each_op = e && *e && strcmp(e, "0") != 0;
        e = getenv("DTRUN_CUDA_MATMUL");
        c->matmul_gemmex = e && strcmp(e, "gemmex") == 0;
    }
    DT_CHECK_GOTO(dt_attention_kind_from_env(&c->attention), st, out_free);
    DT_LOG_DEBUG("cuda device %d: %s, %d SMs, cc %d.%d, %s compute", ordinal, c->name, c->sm_count, c->cc_major,
                 c->cc_minor, dt_dtype_name(dtype));
    return DT_STATUS_OK;

out_free:
    dt_cuda_device_free(dev);
    return st;
}

extern "C" void dt_cuda_device_free(dt_device_t *dev) {
    dt_cuda_impl *c = dev ? dt_cuda(dev) : NULL;
    if (!c) return;
    if (c->stream) (void)cudaStreamSynchronize(c->stream);
    dt_cuda_matmul_cache_free(c);
    if (c->copy_stream) (void)cudaStreamSynchronize(c->copy_stream);
    for (size_t i = 0; i < c->nallocs; i++) {
        /* Buffers the caller did not free: release them so accounting stays honest. */
        if (c->allocs[i].host) cudaFreeHost(c->allocs[i].ptr);
        else cudaFree(c->allocs[i].ptr);
        dt_mem_account(c->allocs[i].cat, -(int64_t)c->allocs[i].bytes);
    }
    if (c->nallocs) DT_LOG_DEBUG("cuda device %d closed with %zu buffers still allocated; freed them", dev->ordinal, c->nallocs);
    free(c->allocs);
    h2d_ring_free(c->h2d);
    c->h2d = NULL;
    if (c->staging) {
        cudaFree(c->staging);
        dt_mem_account(DT_MEM_OTHER, -(int64_t)c->staging_bytes);
    }
    if (c->scratch) {
        cudaFree(c->scratch);
        dt_mem_account(DT_MEM_OTHER, -(int64_t)c->scratch_bytes);
    }
    if (c->workspace) {
        cudaFree(c->workspace);
        dt_mem_account(DT_MEM_OTHER, -(int64_t)c->workspace_bytes);
    }
    if (c->blas) cublasDestroy(c->blas);
    if (c->lt) cublasLtDestroy(c->lt);
    if (c->copy_after) cudaEventDestroy(c->copy_after);
    if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
    if (c->stream) cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    pthread_mutex_destroy(&c->alloc_lock);
    free(c);
    dev->impl = NULL;
    dev->ops = NULL;
}
