/*
 * backend.c - the one file that knows which compute backends exist: it opens a
 * device of a given kind and hands out its op table (kernels.h). The CPU backend
 * is always built; the CUDA backend joins under DT_USE_CUDA in a later issue.
 */
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

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
    switch (kind) {
    case DT_DEVICE_CPU: return 1;
    case DT_DEVICE_CUDA:
        /* The CUDA op table arrives with its own issue; until then no CUDA device. */
        return 0;
    }
    return 0;
}

dt_status_t dt_device_init(dt_device_t **out, dt_device_kind_t kind, int nthreads) {
    *out = NULL;
    if (!dt_device_built(kind)) {
#ifdef DT_USE_CUDA
        const char *why = "the CUDA op table is not implemented yet";
#else
        const char *why = "this dtrun was built without CUDA (no nvcc, or NO_CUDA=1)";
#endif
        return dt_error(DT_STATUS_UNSUPPORTED, "device '%s' is not available: %s",
                        dt_device_kind_name(kind), why);
    }
    dt_device_t *dev = dt_xcalloc(1, sizeof *dev);
    dt_status_t st = DT_STATUS_OK;
    switch (kind) {
    case DT_DEVICE_CPU: DT_CHECK_GOTO(dt_cpu_device_init(dev, nthreads), st, out_free_dev); break;
    default:
        st = dt_error(DT_STATUS_UNSUPPORTED, "device kind %d unknown", (int)kind);
        goto out_free_dev;
    }
    *out = dev;
    return DT_STATUS_OK;

out_free_dev:
    free(dev);
    return st;
}

void dt_device_free(dt_device_t *dev) {
    if (!dev) return;
    if (dev->kind == DT_DEVICE_CPU) dt_cpu_device_free(dev);
    free(dev);
}
