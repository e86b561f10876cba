/*
 * backend.c - the one file that knows which compute backends exist: it opens a
 * device of a given kind and hands out its op table (kernels.h). The CPU backend
 * is linked in; the CUDA backend (kernels/cuda) lives in the CUDA library, whose
 * entry points come through the loader (common/cudalib.h) the first time a CUDA
 * device is counted or opened, so a process that never asks maps no CUDA.
 */
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

#include "common/cudalib.h" /* defines: dt_cudalib_sym_checked, dt_cudalib_present */
#include "common/gpuinfo.h" /* defines: dt_gpuinfo_count */
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h" /* the prototypes of the library's entry points */

static const char *const kind_names[] = {"cpu", "cuda"};

const char *dt_device_kind_name(dt_device_kind_t kind) {
    return (unsigned)kind < sizeof kind_names / sizeof kind_names[0] ? kind_names[kind]
                                                                     : "unknown";
}

dt_status_t dt_device_kind_parse(const char *s, dt_device_kind_t *out) {
    for (unsigned i = 0; i < sizeof kind_names / sizeof kind_names[0]; i++) {
        if (s && strcmp(s, kind_names[i]) == 0) {
            *out = (dt_device_kind_t)i;
            return DT_STATUS_OK;
        }
    }
    return dt_error(DT_STATUS_INVALID, "unknown device '%s' (expected cpu or cuda)",
                    s ? s : "(null)");
}

size_t dt_dtype_size(dt_dtype_t dtype) { return dtype == DT_DTYPE_BF16 ? 2 : 4; }

const char *dt_dtype_name(dt_dtype_t dtype) {
    switch (dtype) {
    case DT_DTYPE_F32: return "fp32";
    case DT_DTYPE_BF16: return "bf16";
    }
    return "unknown";
}

int dt_device_built(dt_device_kind_t kind) {
    char path[4096];
    switch (kind) {
    case DT_DEVICE_CPU: return 1;
    case DT_DEVICE_CUDA: return dt_cudalib_present(path, sizeof path);
    }
    return 0;
}

/* The CUDA library's entry `name`, from a library compiled against this binary's
 * kernels.h (DT_KERNELS_LAYOUT). */
static dt_status_t cuda_sym(const char *name, void **out) {
    return dt_cudalib_sym_checked(name, "dt_cuda_kernels_layout", DT_KERNELS_LAYOUT, "kernels.h", out);
}

dt_status_t dt_device_load(dt_device_kind_t kind) {
    void *p;
    return kind == DT_DEVICE_CUDA ? cuda_sym("dt_cuda_device_init", &p) : DT_STATUS_OK;
}

int dt_device_count(dt_device_kind_t kind) {
    switch (kind) {
    case DT_DEVICE_CPU: return 1;
    case DT_DEVICE_CUDA: {
        /* No GPU the driver knows of: no reason to load CUDA to hear it say 0. */
        if (dt_gpuinfo_count() == 0) return 0;
        void *fn;
        if (cuda_sym("dt_cuda_device_count", &fn) != DT_STATUS_OK) return 0;
        return ((__typeof__(dt_cuda_device_count) *)fn)();
    }
    }
    return 0;
}

dt_status_t dt_attention_kind_from_env(dt_attention_kind_t *out) {
    const char *e = getenv("DTRUN_CUDA_ATTENTION");
    *out = DT_ATTENTION_CUBLAS;
    if (!e || !*e || strcmp(e, "cublas") == 0) return DT_STATUS_OK;
    if (strcmp(e, "fused") == 0) {
        *out = DT_ATTENTION_FUSED;
        return DT_STATUS_OK;
    }
    return dt_error(DT_STATUS_INVALID, "DTRUN_CUDA_ATTENTION='%s': expected 'cublas' (the default) or 'fused'", e);
}

dt_status_t dt_device_open(dt_device_t **out, const dt_device_opts_t *o) {
    *out = NULL;
    if (o->kind == DT_DEVICE_CPU && o->dtype != DT_DTYPE_F32)
        return dt_error(DT_STATUS_UNSUPPORTED, "device 'cpu' computes in fp32 only (asked for %s)",
                        dt_dtype_name(o->dtype));
    dt_device_t *dev = dt_xcalloc(1, sizeof *dev);
    dt_status_t st = DT_STATUS_OK;
    switch (o->kind) {
    case DT_DEVICE_CPU: DT_CHECK_GOTO(dt_cpu_device_init(dev, o->nthreads), st, out_free_dev); break;
    case DT_DEVICE_CUDA: {
        void *init;
        DT_CHECK_GOTO(cuda_sym("dt_cuda_device_init", &init), st, out_free_dev);
        dev->nthreads = 1;
        DT_CHECK_GOTO(((__typeof__(dt_cuda_device_init) *)init)(dev, o->ordinal, o->dtype), st, out_free_dev);
        break;
    }
    default:
        st = dt_error(DT_STATUS_UNSUPPORTED, "device kind %d unknown", (int)o->kind);
        goto out_free_dev;
    }
    *out = dev;
    return DT_STATUS_OK;

out_free_dev:
    free(dev);
    return st;
}

dt_status_t dt_device_init(dt_device_t **out, dt_device_kind_t kind, int nthreads) {
    dt_device_opts_t o = {kind, nthreads, 0, kind == DT_DEVICE_CUDA ? DT_DTYPE_BF16 : DT_DTYPE_F32};
    return dt_device_open(out, &o);
}

void dt_device_free(dt_device_t *dev) {
    if (!dev) return;
    if (dev->kind == DT_DEVICE_CPU) dt_cpu_device_free(dev);
    void *fn;
    /* A CUDA device was opened through the library, so it is loaded. */
    if (dev->kind == DT_DEVICE_CUDA && cuda_sym("dt_cuda_device_free", &fn) == DT_STATUS_OK)
        ((__typeof__(dt_cuda_device_free) *)fn)(dev);
    free(dev);
}
