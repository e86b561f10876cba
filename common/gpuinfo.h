/*
 * gpuinfo.h - what dtrun knows about GPUs without CUDA: how many the driver has
 * (no CUDA context is created, so the agent may ask before it forks) and the one
 * table of GPU models (memory, dense bf16 peak, usual link) that `dtrun plan` and
 * the trainer's MFU read. Below both the launcher and the trainer.
 */
#ifndef DT_COMMON_GPUINFO_H
#define DT_COMMON_GPUINFO_H

#include <stddef.h>

/* GPUs a process started now would see, found without initialising CUDA: the
 * entries of CUDA_VISIBLE_DEVICES up to the first invalid one as CUDA counts them
 * ("" or a leading -1: none) when it is set, else the driver's GPUs (NVML through
 * dlopen, else /proc/driver/nvidia/gpus; DTRUN_CUEMU_GPUS, default 1, in the CPU
 * emulator's build). */
int dt_gpuinfo_count(void);
/* The same with `visible` as the value of CUDA_VISIBLE_DEVICES (NULL: unset). */
int dt_gpuinfo_count_visible(const char *visible);

/* The health of one GPU a process started now would use, as the driver reports it
 * without CUDA (NVML), for the launcher's preflight. */
typedef struct dt_gpu_health {
    char name[96];           /* "NVIDIA H200" */
    double mem_bytes;        /* total device memory */
    long long ecc_uncorrected; /* volatile uncorrectable ECC errors since the driver
                              * loaded; -1: not reported (ECC off, or not this GPU's) */
    int remap_failed;        /* 1: a row remapping failed (the GPU needs service) */
    int remap_pending;       /* 1: a row remapping waits for a GPU reset */
} dt_gpu_health;

/* The GPUs a process started now would use (CUDA_VISIBLE_DEVICES's entries as
 * indices into the driver's PCI order, or GPU-UUIDs; unset: all), at most max of
 * them into out. Returns how many, or -1 when the driver cannot be asked (no NVML:
 * no NVIDIA driver). The CPU emulator's build reports DTRUN_CUEMU_GPUS GPUs named
 * DTRUN_CUEMU_GPU_NAME ("cuemu"), with DTRUN_CUEMU_GPU_MEM_GIB (80) and the
 * comma-separated uncorrectable counts of DTRUN_CUEMU_ECC (tests). */
int dt_gpuinfo_health(dt_gpu_health *out, int max);

/* One GPU model. */
typedef struct dt_gpu_spec {
    const char *name;        /* --gpu name: "h100", "a100-80", "cpu" */
    const char *device_name; /* substrings of the CUDA device name, '|'-separated */
    double mem_gib;          /* device memory; cpu: 0 = this host's MemTotal */
    double tflops;           /* dense bf16 tensor-core peak; cpu: 0 = measured */
    const char *intra_link;  /* the usual link between GPUs of one node */
} dt_gpu_spec;

int dt_gpu_spec_count(void);
const dt_gpu_spec *dt_gpu_spec_at(int i);
/* By --gpu name (case-insensitive), NULL when unknown. */
const dt_gpu_spec *dt_gpu_spec_find(const char *name);
/* By CUDA device name ("NVIDIA H100 80GB HBM3"), NULL when unknown. */
const dt_gpu_spec *dt_gpu_spec_by_device_name(const char *device_name);
/* "h200, h100-pcie, ..." for messages. */
void dt_gpu_spec_names(char *buf, size_t len);

/* Dense bf16 peak FLOP/s of a GPU by its CUDA device name: DTRUN_PEAK_TFLOPS
 * (TFLOP/s) when set and positive, else the table; 0 when unknown. */
double dt_gpuinfo_peak_flops(const char *device_name);

#endif /* DT_COMMON_GPUINFO_H */
