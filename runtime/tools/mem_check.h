/*
 * mem_check.h - out of memory before it happens: the bytes a rank of a resolved
 * config will hold, by `dtrun plan`'s arithmetic (plan.h, which equals the trainer's
 * arena and model state), against what the rank can get; when they do not fit, a
 * message naming the shortfall, the biggest consumer and the cheapest change plan
 * says would fit (strategy, activation recomputation, a smaller micro-batch with
 * more accumulation, optimizer offload), each tried with plan's own functions.
 * A LoRA run (lora.r > 0) is priced as plan_lora.c prices it: the strategy holds
 * the adapters, the frozen base is replicated, the arena is the base model's.
 *
 * What a rank can get: a GPU's free memory (cudaMemGetInfo, through the device
 * ops), or the host's (common/meminfo.h) shared by the node's ranks;
 * 10% of it is the reserve plan keeps (CUDA context, allocator, the process's own
 * memory).
 */
#ifndef DT_RUNTIME_MEM_CHECK_H
#define DT_RUNTIME_MEM_CHECK_H

#include <stddef.h>

#include "common/status.h"
#include "runtime/config/config.h" /* defines: dt_config_t */
#include "runtime/model/model.h"   /* defines: dt_model_spec */

typedef struct dt_mem_check_in {
    const dt_config_t *cfg;     /* resolved for world_size */
    const dt_model_spec *spec;  /* the model, its vocabulary resolved */
    int world_size, local_world_size;
    int gpu;                    /* 1: a GPU's memory; 0: the host's, shared by the node's ranks */
    int gpu_sharers;            /* ranks sharing one GPU (more ranks than GPUs on a node); <= 1: one */
    int gpu_attention_fused;    /* the CUDA attention kind (DTRUN_CUDA_ATTENTION=fused) */
    int cpu_threads;            /* threads per rank (the CPU attention's scratch) */
    double peak_flops;          /* the device's (CPU: measured; GPU: by name); 0: unknown */
    const char *device_name;    /* the GPU's name, for its usual link (NULL: the CPU's) */
    double avail_bytes;         /* what the rank (gpu) or the node (host) can get */
    const char *avail_what;     /* where avail_bytes came from, for the message */
} dt_mem_check_in;

typedef struct dt_mem_check_out {
    int checked;       /* 1: priced (a LoRA run too: the adapters trained, the base frozen) */
    int fits;
    double need;       /* bytes per rank under the config (plan's total) */
    double usable;     /* bytes per rank: avail less the reserve, / ranks when shared */
    char message[2048]; /* when !fits: the shortfall, the consumer, the suggestion */
    char suggestion[256]; /* when !fits: KEY=VALUE overrides that fit ("" when none does) */
} dt_mem_check_out;

/* Fills out; DT_STATUS_OK also when the run does not fit (out->fits 0). An error
 * only when plan cannot price the config (its message). */
dt_status_t dt_mem_check(const dt_mem_check_in *in, dt_mem_check_out *out);

#endif /* DT_RUNTIME_MEM_CHECK_H */
