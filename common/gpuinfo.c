/*
 * gpuinfo.c - GPU count without CUDA (NVML or the driver's /proc entries) and the
 * table of GPU models (gpuinfo.h).
 */
#include "common/gpuinfo.h"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- count ------------------------------------------------------------------ */

/* GPUs the NVIDIA driver has: NVML when its library is there, else /proc. Asked
 * once per process (nvmlInit takes a while on a node of many GPUs, and the answer
 * does not change): the launcher's checks and a worker's device choice ask again. */
static int count_physical_gpus(void) {
#ifdef DT_CUEMU
    const char *e = getenv("DTRUN_CUEMU_GPUS"); /* the CPU emulator's GPUs (tests) */
    return e ? atoi(e) : 1;
#else
    int n = 0;
    /* NVML is the driver's own library: it maps no CUDA runtime and makes no context. */
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

static pthread_once_t physical_once = PTHREAD_ONCE_INIT;
static int physical_count;
static void physical_init(void) { physical_count = count_physical_gpus(); }

static int physical_gpus(void) {
    pthread_once(&physical_once, physical_init);
    return physical_count;
}

/* The next entry of a CUDA_VISIBLE_DEVICES value at *p (into ent, cut to len - 1),
 * *p moved past it; 0 at the end. CUDA's rule: entries up to the first invalid one;
 * "" or a leading -1 hides all. */
static int next_visible(const char **p, char *ent, size_t len) {
    const char *s = *p;
    while (*s == ' ') s++;
    if (*s == '-' || *s == ',' || !*s) return 0;
    size_t k = 0;
    for (; *s && *s != ','; s++)
        if (k + 1 < len) ent[k++] = *s;
    if (len) ent[k] = '\0';
    *p = *s == ',' ? s + 1 : s;
    return 1;
}

int dt_gpuinfo_count_visible(const char *visible) {
    if (!visible) return physical_gpus();
    int n = 0;
    char ent[128];
    for (const char *p = visible; next_visible(&p, ent, sizeof ent);) n++;
    return n;
}

int dt_gpuinfo_count(void) { return dt_gpuinfo_count_visible(getenv("CUDA_VISIBLE_DEVICES")); }

/* ---- health ------------------------------------------------------------------ */

#ifdef DT_CUEMU
int dt_gpuinfo_health(dt_gpu_health *out, int max) {
    int n = dt_gpuinfo_count();
    if (n > max) n = max;
    const char *name = getenv("DTRUN_CUEMU_GPU_NAME"), *mem = getenv("DTRUN_CUEMU_GPU_MEM_GIB");
    const char *ecc = getenv("DTRUN_CUEMU_ECC");
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].name, sizeof out[i].name, "%s", name && *name ? name : "cuemu");
        out[i].mem_bytes = (mem ? atof(mem) : 80) * 1024.0 * 1024 * 1024;
        out[i].ecc_uncorrected = 0;
        if (ecc) { /* the i-th comma-separated count */
            const char *p = ecc;
            for (int k = 0; k < i && p; k++) p = strchr(p, ','), p = p ? p + 1 : NULL;
            if (p && *p && *p != ',') out[i].ecc_uncorrected = atoll(p);
        }
    }
    return n;
}
#else
/* NVML's functions as its header declares them (nvmlDevice_t is a pointer, the
 * return an enum where 0 is NVML_SUCCESS), looked up by name: no header needed. */
typedef struct nvml_memory { unsigned long long total, free, used; } nvml_memory_t;
typedef struct nvml_api {
    int (*init)(void), (*shutdown)(void);
    int (*count)(unsigned *);
    int (*by_index)(unsigned, void **);
    int (*by_uuid)(const char *, void **);
    int (*name)(void *, char *, unsigned);
    int (*memory)(void *, nvml_memory_t *);
    int (*ecc)(void *, int, int, unsigned long long *);
    int (*remapped)(void *, unsigned *, unsigned *, unsigned *, unsigned *);
} nvml_api_t;

#define NVML_MEMORY_ERROR_TYPE_UNCORRECTED 1
#define NVML_VOLATILE_ECC 0

static void health_of(const nvml_api_t *a, void *dev, dt_gpu_health *h) {
    memset(h, 0, sizeof *h);
    h->ecc_uncorrected = -1;
    if (a->name(dev, h->name, sizeof h->name) != 0) snprintf(h->name, sizeof h->name, "?");
    nvml_memory_t m;
    if (a->memory && a->memory(dev, &m) == 0) h->mem_bytes = (double)m.total;
    unsigned long long c = 0;
    if (a->ecc && a->ecc(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &c) == 0)
        h->ecc_uncorrected = (long long)c;
    unsigned corr = 0, unc = 0, pending = 0, failed = 0;
    if (a->remapped && a->remapped(dev, &corr, &unc, &pending, &failed) == 0) {
        h->remap_failed = failed != 0;
        h->remap_pending = pending != 0;
    }
}

int dt_gpuinfo_health(dt_gpu_health *out, int max) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return -1;
    nvml_api_t a = {
        .init = (int (*)(void))dlsym(lib, "nvmlInit_v2"),
        .shutdown = (int (*)(void))dlsym(lib, "nvmlShutdown"),
        .count = (int (*)(unsigned *))dlsym(lib, "nvmlDeviceGetCount_v2"),
        .by_index = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"),
        .by_uuid = (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByUUID"),
        .name = (int (*)(void *, char *, unsigned))dlsym(lib, "nvmlDeviceGetName"),
        .memory = (int (*)(void *, nvml_memory_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo"),
        .ecc = (int (*)(void *, int, int, unsigned long long *))dlsym(lib, "nvmlDeviceGetTotalEccErrors"),
        .remapped = (int (*)(void *, unsigned *, unsigned *, unsigned *, unsigned *))dlsym(lib, "nvmlDeviceGetRemappedRows"),
    };
    int n = -1;
    if (!a.init || !a.shutdown || !a.count || !a.by_index || !a.by_uuid || !a.name || a.init() != 0) {
        dlclose(lib);
        return -1;
    }
    unsigned total = 0;
    if (a.count(&total) == 0) {
        n = 0;
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        if (!vis) {
            for (unsigned i = 0; i < total && n < max; i++) {
                void *dev = NULL;
                if (a.by_index(i, &dev) == 0) health_of(&a, dev, &out[n++]);
            }
        } else {
            char ent[128];
            for (const char *p = vis; n < max && next_visible(&p, ent, sizeof ent);) {
                void *dev = NULL;
                char *end;
                unsigned long idx = strtoul(ent, &end, 10);
                int r = (end != ent && (*end == '\0' || *end == ' ')) ? a.by_index((unsigned)idx, &dev)
                                                                      : a.by_uuid(ent, &dev);
                if (r != 0) break; /* as CUDA stops at an entry it cannot find */
                health_of(&a, dev, &out[n++]);
            }
        }
    }
    a.shutdown();
    dlclose(lib);
    return n;
}
#endif

/* ---- models ------------------------------------------------------------------
 * Memory as sold (GiB of HBM/GDDR) and dense bf16 tensor-core peaks without
 * sparsity, from the vendors' data sheets (H100 SXM 989, H100 PCIe 756, H200 989,
 * B200 2250, A100 312, L40S 362, L4 121, A10G 125 as NVIDIA lists the A10). The
 * GeForce figures (4090 165, 5090 209) are NVIDIA's "FP16/BF16 tensor" numbers;
 * with fp32 accumulation those cards run at half that, so give --gpu-tflops or a
 * lower --mfu for them. Order matters for device-name lookup: longer names first. */
static const dt_gpu_spec gpus[] = {
    {"h200", "H200", 141, 989, "nvlink4"},
    {"h100-pcie", "H100 PCIe", 80, 756, "pcie5"},
    {"h100", "H100", 80, 989, "nvlink4"},
    {"b200", "B200", 180, 2250, "nvlink5"},
    {"a100-80", "A100-SXM4-80GB|A100 80GB|A100-SXM-80GB", 80, 312, "nvlink3"},
    {"a100-40", "A100", 40, 312, "nvlink3"},
    {"a10g", "A10G", 24, 125, "pcie4"},
    {"l40s", "L40S", 48, 362, "pcie4"},
    {"l4", "L4", 24, 121, "pcie4"},
    {"rtx4090", "RTX 4090", 24, 165, "pcie4"},
    {"rtx5090", "RTX 5090", 32, 209, "pcie5"},
    {"v100", "V100", 32, 125, "nvlink2"},
    /* this machine's CPU: host memory shared by the ranks, peak measured by sgemm */
    {"cpu", NULL, 0, 0, "shm"},
};

int dt_gpu_spec_count(void) { return (int)(sizeof gpus / sizeof gpus[0]); }

const dt_gpu_spec *dt_gpu_spec_at(int i) { return i >= 0 && i < dt_gpu_spec_count() ? &gpus[i] : NULL; }

const dt_gpu_spec *dt_gpu_spec_find(const char *name) {
    for (int i = 0; name && i < dt_gpu_spec_count(); i++)
        if (!strcasecmp(name, gpus[i].name)) return &gpus[i];
    return NULL;
}

const dt_gpu_spec *dt_gpu_spec_by_device_name(const char *device_name) {
    if (!device_name) return NULL;
    for (int i = 0; i < dt_gpu_spec_count(); i++) {
        const char *p = gpus[i].device_name;
        while (p && *p) {
            const char *bar = strchr(p, '|');
            size_t n = bar ? (size_t)(bar - p) : strlen(p);
            char needle[64];
            if (n >= sizeof needle) n = sizeof needle - 1;
            memcpy(needle, p, n);
            needle[n] = '\0';
            if (strstr(device_name, needle)) return &gpus[i];
            p = bar ? bar + 1 : NULL;
        }
    }
    return NULL;
}

void dt_gpu_spec_names(char *buf, size_t len) {
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < dt_gpu_spec_count() && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", gpus[i].name);
}

double dt_gpuinfo_peak_flops(const char *device_name) {
    const char *env = getenv("DTRUN_PEAK_TFLOPS");
    if (env && atof(env) > 0) return atof(env) * 1e12;
    const dt_gpu_spec *g = dt_gpu_spec_by_device_name(device_name);
    return g && g->tflops > 0 ? g->tflops * 1e12 : 0;
}
