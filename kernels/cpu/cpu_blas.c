/*
 * cpu_blas.c - OpenBLAS, loaded with dlopen when the first CPU device opens
 * (cpu.h). Linking it would start it in every dtrun process: its constructor
 * picks kernels and spawns a thread per core, in the agent (which computes
 * nothing) as in a GPU worker. Loaded here, it starts only where the CPU computes,
 * with OPENBLAS_NUM_THREADS=1 when unset (dtrun runs it single-threaded: all
 * parallelism is OpenMP over independent calls), so no thread pool is made at all.
 */
#include "kernels/cpu/cpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define BLAS_SONAME "libopenblas.so.0"

dt_cpu_sgemm_fn dt_cpu_sgemm;

static void (*set_num_threads)(int);
static char *(*get_corename)(void);
/* OpenBLAS built with DYNAMIC_ARCH has these: its kernel selection, re-run below. */
static void (*dynamic_init)(void);
static void (*dynamic_quit)(void);

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[1024];

static int core_is_generic(const char *core) {
    static const char *const generic[] = {"Prescott", "Katmai",  "Coppermine", "Northwood",
                                          "Banias",   "Core2",   "Penryn",     "Dunnington",
                                          "Nehalem",  "Atom",    "Unknown"};
    for (size_t i = 0; i < sizeof generic / sizeof generic[0]; i++)
        if (strcmp(core, generic[i]) == 0) return 1;
    return 0;
}

static void load_now(void) {
    setenv("OPENBLAS_NUM_THREADS", "1", 0); /* read by OpenBLAS's constructor */
    void *h = dlopen(BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        char first[512]; /* the soname's failure is the one to report */
        snprintf(first, sizeof first, "%s", dlerror());
        h = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(load_error, sizeof load_error,
                     "the CPU device needs OpenBLAS (%s), which could not be loaded: %s; install it "
                     "(Debian: apt-get install libopenblas0)",
                     BLAS_SONAME, first);
            return;
        }
    }
    dt_cpu_sgemm_fn sgemm = (dt_cpu_sgemm_fn)dlsym(h, "cblas_sgemm");
    set_num_threads = (void (*)(int))dlsym(h, "openblas_set_num_threads");
    get_corename = (char *(*)(void))dlsym(h, "openblas_get_corename");
    dynamic_init = (void (*)(void))dlsym(h, "gotoblas_dynamic_init");
    dynamic_quit = (void (*)(void))dlsym(h, "gotoblas_dynamic_quit");
    if (!sgemm || !set_num_threads || !get_corename) {
        snprintf(load_error, sizeof load_error,
                 "%s has no cblas_sgemm, openblas_set_num_threads or openblas_get_corename: not OpenBLAS?",
                 BLAS_SONAME);
        return;
    }
    const char *core = get_corename();
    if (!getenv("OPENBLAS_CORETYPE") && dynamic_init && dynamic_quit && core && core_is_generic(core)) {
        const char *want = NULL;
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
            want = "SkylakeX";
        else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            want = "Haswell";
        if (want) {
            /* Re-runs OpenBLAS's own selection, which reads OPENBLAS_CORETYPE. This
             * happens before any of our sgemm calls. */
            setenv("OPENBLAS_CORETYPE", want, 0);
            dynamic_quit();
            dynamic_init();
            DT_LOG_DEBUG("OpenBLAS took this CPU for %s; switched to its %s kernels", core, get_corename());
        }
    }
    set_num_threads(1);
    dt_cpu_sgemm = sgemm; /* last: non-NULL means ready */
}

dt_status_t dt_cpu_blas_load(void) {
    pthread_once(&load_once, load_now);
    if (!dt_cpu_sgemm) return dt_error(DT_STATUS_UNSUPPORTED, "%s", load_error);
    return DT_STATUS_OK;
}

const char *dt_cpu_blas_core(void) {
    if (dt_cpu_blas_load() != DT_STATUS_OK) return "unavailable";
    return get_corename();
}
