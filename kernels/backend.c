/*
 * backend.c - the one file that knows which compute backends exist: it opens a
 * device of a given kind and hands out its op table (kernels.h). The CPU backend
 * is always built; the CUDA backend (kernels/cuda) joins under DT_USE_CUDA.
 */
#include "kernels/kernels.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#ifdef DT_USE_CUDA
#include "kernels/cuda/cuda.h"
#endif

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
#ifdef DT_USE_CUDA
    case DT_DEVICE_CUDA: return 1;
#else
    case DT_DEVICE_CUDA: return 0;
#endif
    }
    return 0;
}

int dt_device_count(dt_device_kind_t kind) {
    switch (kind) {
    case DT_DEVICE_CPU: return 1;
    case DT_DEVICE_CUDA:
#ifdef DT_USE_CUDA
        return dt_cuda_device_count();
#else
        return 0;
#endif
    }
    return 0;
}

/* GPUs the NVIDIA driver has, without creating a CUDA context: NVML when its library
 * is there, else the driver's /proc entries. */
static int physical_gpus(void) {
#ifdef DT_CUEMU
    const char *e = getenv("DTRUN_CUEMU_GPUS"); /* the CPU emulator's GPUs (tests) */
    return e ? atoi(e) : 1;
#else
    int n = 0;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib) {
        int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
        int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(lib, "nvmlDeviceGetCount_v2");
        int (*shutdown)(void) = (int (*)(void))dlsym(lib, "nvmlShutdown");
        if (init && count && shutdown && init() == 0) {
            unsigned c = 0;
            if (count(&c) == 0) n = (int)c;
            shutdown();
        }
        dlclose(lib);
        return n;
    }
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (!d) return 0;
    for (struct dirent *de; (de = readdir(d));)
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
#endif
}

int dt_device_probe_gpus_visible(const char *visible) {
    if (!visible) return physical_gpus();
    /* CUDA's rule: entries up to the first invalid one; "" or a leading -1 hides all. */
    int n = 0;
    for (const char *p = visible; *p;) {
        while (*p == ' ') p++;
        if (*p == '-' || *p == ',' || !*p) break;
        n++;
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
    }
    return n;
}

int dt_device_probe_gpus(void) { return dt_device_probe_gpus_visible(getenv("CUDA_VISIBLE_DEVICES")); }

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
    if (!dt_device_built(o->kind))
        return dt_error(DT_STATUS_UNSUPPORTED, "device '%s' is not available: %s", dt_device_kind_name(o->kind),
                        "this dtrun was built without CUDA (no nvcc, or NO_CUDA=1)");
    if (o->kind == DT_DEVICE_CPU && o->dtype != DT_DTYPE_F32)
        return dt_error(DT_STATUS_UNSUPPORTED, "device 'cpu' computes in fp32 only (asked for %s)",
                        dt_dtype_name(o->dtype));
    dt_device_t *dev = dt_xcalloc(1, sizeof *dev);
    dt_status_t st = DT_STATUS_OK;
    switch (o->kind) {
    case DT_DEVICE_CPU: DT_CHECK_GOTO(dt_cpu_device_init(dev, o->nthreads), st, out_free_dev); break;
#ifdef DT_USE_CUDA
    case DT_DEVICE_CUDA:
        dev->nthreads = 1;
        DT_CHECK_GOTO(dt_cuda_device_init(dev, o->ordinal, o->dtype), st, out_free_dev);
        break;
#endif
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
#ifdef DT_USE_CUDA
    if (dev->kind == DT_DEVICE_CUDA) dt_cuda_device_free(dev);
#endif
    free(dev);
}
