/*
 * test_gpuinfo.c - GPU information without CUDA (common/gpuinfo.h: visible-GPU
 * counting by CUDA's rule, the GPU model table, peaks by device name) and the
 * CUDA library loader's answers where no CUDA library is to be found
 * (common/cudalib.h): one message naming it and where it looked, the same to
 * every thread, and nothing CUDA mapped when `present` is asked.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cudalib.h"
#include "common/gpuinfo.h"

Test(gpuinfo, visible_devices_count_as_cuda_counts_them) {
    cr_assert_eq(dt_gpuinfo_count_visible("0,1,2"), 3);
    cr_assert_eq(dt_gpuinfo_count_visible("GPU-ab, GPU-cd"), 2);
    cr_assert_eq(dt_gpuinfo_count_visible(""), 0);
    cr_assert_eq(dt_gpuinfo_count_visible("-1"), 0);
    cr_assert_eq(dt_gpuinfo_count_visible("0,-1,2"), 1, "entries stop at the first invalid one");
    cr_assert_eq(dt_gpuinfo_count_visible("3,,4"), 1);
    setenv("CUDA_VISIBLE_DEVICES", "4,5", 1);
    cr_assert_eq(dt_gpuinfo_count(), 2);
    unsetenv("CUDA_VISIBLE_DEVICES");
    cr_assert_geq(dt_gpuinfo_count(), 0);
}

Test(gpuinfo, models_by_name_and_by_device_name) {
    cr_assert_eq(dt_gpu_spec_find("H200")->mem_gib, 141);
    cr_assert_str_eq(dt_gpu_spec_by_device_name("NVIDIA H100 PCIe")->name, "h100-pcie");
    cr_assert_str_eq(dt_gpu_spec_by_device_name("NVIDIA H100 80GB HBM3")->name, "h100");
    cr_assert_null(dt_gpu_spec_by_device_name("Mystery GPU"));
    cr_assert_null(dt_gpu_spec_by_device_name(NULL));
    char names[512];
    dt_gpu_spec_names(names, sizeof names);
    cr_assert(strstr(names, "h200, h100-pcie, h100") == names, "%s", names);
    cr_assert_str_eq(dt_gpu_spec_at(dt_gpu_spec_count() - 1)->name, "cpu");
    cr_assert_null(dt_gpu_spec_at(dt_gpu_spec_count()));
}

Test(gpuinfo, peak_by_device_name_with_the_env_override) {
    unsetenv("DTRUN_PEAK_TFLOPS");
    cr_assert_float_eq(dt_gpuinfo_peak_flops("NVIDIA B200"), 2250e12, 1);
    cr_assert_eq(dt_gpuinfo_peak_flops("Mystery GPU"), 0);
    setenv("DTRUN_PEAK_TFLOPS", "50", 1);
    cr_assert_float_eq(dt_gpuinfo_peak_flops("Mystery GPU"), 50e12, 1);
    unsetenv("DTRUN_PEAK_TFLOPS");
}

/* 1 when /proc/self/maps names a library whose name contains `what`. */
static int mapped(const char *what) {
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert_not_null(f);
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, what)) found = 1;
    fclose(f);
    return found;
}

static void *load_in_thread(void *arg) {
    dt_status_t st = dt_cudalib_load();
    snprintf(arg, 2048, "%d %s", (int)st, dt_error_detail());
    return NULL;
}

/* This test binary has no CUDA library beside it and links none in. */
Test(cudalib, absent_library_is_one_message_naming_it_and_where_it_looked) {
    char path[PATH_MAX];
    unsetenv("LD_LIBRARY_PATH");
    cr_assert_eq(dt_cudalib_present(path, sizeof path), 0);
    cr_assert_eq(mapped("libcudart") + mapped("libdtrun_cuda"), 0, "asking whether it is present loads nothing");
    cr_assert_null(dt_cudalib_path());

    char self[PATH_MAX], dir[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert_gt(n, 0);
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(dir, sizeof dir, "looked in %s (beside this dtrun)", self);

    static char answers[4][2048];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&th[i], NULL, load_in_thread, answers[i]), 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        cr_assert_str_eq(answers[i], answers[0], "every thread gets the one answer");
        cr_assert(strstr(answers[i], dt_cudalib_name()), "%s", answers[i]);
    }
    cr_assert_eq(atoi(answers[0]), DT_STATUS_UNSUPPORTED, "%s", answers[0]);
    /* either the library itself (CUDA installed here) or a CUDA dependency is missing */
    cr_assert(strstr(answers[0], dir) || strstr(answers[0], "which was not found: looked in the system's library path"),
              "%s", answers[0]);
    void *sym;
    cr_assert_eq(dt_cudalib_sym("dt_cuda_device_init", &sym), DT_STATUS_UNSUPPORTED);
    cr_assert_null(sym);
    cr_assert_eq(mapped(dt_cudalib_name()), 0, "nothing of the library stays mapped after a failed load");
}

/* ---- the preflight's judgement of a node's GPU lines (runtime/launch/preflight_gpu.c) ---- */
#include "runtime/launch/agent_impl.h"

typedef struct { const char *k[8], *v[8]; } kv_t;
static const char *kv_get(const void *rec, const char *key) {
    const kv_t *r = rec;
    for (int i = 0; i < 8 && r->k[i]; i++)
        if (!strcmp(r->k[i], key)) return r->v[i];
    return NULL;
}

Test(gpuinfo, preflight_judges_ecc_remapping_likeness_and_memory) {
    char err[600], warn[640], cell[64];
    kv_t ok = {{"@gpu_run", "@gpu_need", "@gpu 0", "@gpu 1"},
               {"1", "0", "NVIDIA H100|85899345920|0|0|0", "NVIDIA H100|85899345920|-1|0|0"}};
    cr_assert_eq(dt_pf_gpu_judge(kv_get, &ok, &ok, err, sizeof err, warn, sizeof warn, cell, sizeof cell), 0,
                 "ECC not reported (-1) is not an error: %s", err);
    cr_assert_str_eq(warn, "");
    cr_assert_str_eq(cell, "2 x NVIDIA H100 80 GiB ok");
    kv_t ecc = {{"@gpu_run", "@gpu_need", "@gpu 0", "@gpu 1", "@gpu 2"},
                {"1", "0", "NVIDIA H100|85899345920|0|0|1", "NVIDIA H100|85899345920|2|0|0",
                 "NVIDIA H100|85899345920|0|1|0"}};
    cr_assert_eq(dt_pf_gpu_judge(kv_get, &ecc, &ok, err, sizeof err, warn, sizeof warn, cell, sizeof cell), 3);
    cr_assert(strstr(err, "GPU 0 (NVIDIA H100) has a row remapping pending (reset the GPU first)"), "%s", err);
    cr_assert(strstr(err, "GPU 1 (NVIDIA H100) has 2 uncorrectable ECC error(s)"), "%s", err);
    cr_assert(strstr(err, "GPU 2 (NVIDIA H100) has a failed row remapping"), "%s", err);
    cr_assert(strstr(cell, " BAD"), "%s", cell);
    kv_t odd = {{"@gpu_run", "@gpu_need", "@gpu 0", "@gpu 1"},
                {"1", "90000000000", "NVIDIA A100|42949672960|0|0|0", "NVIDIA H100|85899345920|0|0|0"}};
    cr_assert_eq(dt_pf_gpu_judge(kv_get, &odd, &ok, err, sizeof err, warn, sizeof warn, cell, sizeof cell), 0);
    cr_assert(strstr(warn, "GPUs are not alike: GPU 0 is NVIDIA A100 (40 GiB), GPU 1 is NVIDIA H100 (80 GiB)"), "%s", warn);
    cr_assert(strstr(warn, "GPU 0 (NVIDIA A100) has 40 GiB, each rank needs 84 GiB (dtrun plan)"), "%s", warn);
    cr_assert(strstr(warn, "its GPUs are NVIDIA A100, node 0's are NVIDIA H100"), "%s", warn);
    kv_t cpu = {{"@gpus"}, {"0"}};
    cr_assert_eq(dt_pf_gpu_judge(kv_get, &cpu, &ok, err, sizeof err, warn, sizeof warn, cell, sizeof cell), 0);
    cr_assert_str_eq(cell, "-");
}
