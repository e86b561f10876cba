/*
 * train_mem.c - out of memory before it happens: before the trainer allocates its
 * model state and activations, each rank compares the bytes `dtrun plan` says it will
 * hold (runtime/tools/mem_check.h) with what it can get: its GPU's free memory
 * (the device ops' mem_info: cudaMemGetInfo), or the host's available memory shared
 * by the node's ranks. When they do not fit the rank stops with DT_STATUS_CONFIG
 * (exit 2) naming the shortfall, the biggest consumer and the cheapest change that
 * fits. DTRUN_SKIP_MEMORY_CHECK=1 skips the check. A failure of plan's arithmetic
 * inside the check names the config's keys (plan's "{tp}" placeholders expanded to
 * tensor_parallel.size, ...), not `dtrun plan`'s flags.
 */
#include "runtime/train/train_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/meminfo.h"
#include "runtime/tools/mem_check.h" /* defines: dt_mem_check */
#include "runtime/tools/plan.h"      /* defines: DT_PLAN_INPUT_MAP, dt_plan_msg_expand */
#include "runtime/train/metrics.h"     /* defines: dt_peak_flops_gpu */

/* The config's words for the inputs plan's messages name (runtime/tools/plan.h): its
 * keys, or the launch's environment (WORLD_SIZE, LOCAL_WORLD_SIZE). The config and the
 * model check these layouts first (dt_model_tp_check, the launcher's layout rules),
 * so this is for a failure they let through: a worker started by hand (`dtrun
 * __worker`) whose LOCAL_WORLD_SIZE cannot hold its TP group. */
static const char *const config_words[DT_PLAN_INPUT_COUNT] = {
    [DT_PLAN_INPUT_params] = "the parameter count",
    [DT_PLAN_INPUT_hidden] = "the model's width",
    [DT_PLAN_INPUT_layers] = "the model's layers",
    [DT_PLAN_INPUT_heads] = "the model's heads",
    [DT_PLAN_INPUT_kv_heads] = "the model's key/value heads",
    [DT_PLAN_INPUT_seq] = "model.seq_len",
    [DT_PLAN_INPUT_vocab] = "the padded vocabulary",
    [DT_PLAN_INPUT_ffn] = "the model's MLP width",
    [DT_PLAN_INPUT_tp] = "tensor_parallel.size",
    [DT_PLAN_INPUT_pp] = "pipeline.stages",
    [DT_PLAN_INPUT_virtual_stages] = "pipeline.virtual_stages",
    [DT_PLAN_INPUT_schedule] = "pipeline.schedule",
    [DT_PLAN_INPUT_accum] = "gradient_accumulation_steps",
    [DT_PLAN_INPUT_gpus] = "WORLD_SIZE",
    [DT_PLAN_INPUT_gpus_per_node] = "LOCAL_WORLD_SIZE",
    [DT_PLAN_INPUT_nodes] = "the node count",
    [DT_PLAN_INPUT_base_dtype] = "lora.base_dtype",
    [DT_PLAN_INPUT_cp] = "context_parallel.size",
};

/* The host's memory for this node's ranks: the agent's sample taken before it
 * started them (DTRUN_NODE_MEM_AVAILABLE "<bytes> <what>"), so that a rank checking
 * after another already filled its arena does not count that arena as taken; read
 * here when there is none (a worker started by hand). */
static double host_available(const char **what) {
    static char src[200];
    const char *e = getenv(DT_MEMINFO_NODE_ENV);
    char *end = NULL;
    double v = e ? strtod(e, &end) : 0;
    if (e && end != e && v >= 0 && *end == ' ') {
        snprintf(src, sizeof src, "%s", end + 1);
        *what = src;
        return v;
    }
    return dt_meminfo_host_available(what);
}

dt_status_t dt_train_mem_check_(const dt_config_t *cfg, const dt_torchenv_t *env, dt_device_t *dev,
                                const dt_model_spec *spec) {
    const char *skip = getenv("DTRUN_SKIP_MEMORY_CHECK");
    if (skip && !strcmp(skip, "1")) return DT_STATUS_OK;
    dt_mem_check_in in = {.cfg = cfg, .spec = spec, .world_size = env->world_size,
                          .local_world_size = env->local_world_size > 0 ? env->local_world_size : 1,
                          .cpu_threads = dev->nthreads};
    char what[160];
    if (dev->kind == DT_DEVICE_CUDA && dev->ops->mem_info) {
        size_t free_b = 0, total_b = 0;
        DT_CHECK(dev->ops->mem_info(dev, &free_b, &total_b));
        int ngpu = dt_device_count(DT_DEVICE_CUDA);
        in.gpu = 1;
        in.gpu_sharers = ngpu > 0 ? (in.local_world_size + ngpu - 1) / ngpu : 1;
        dt_attention_kind_t ak;
        if (dt_attention_kind_from_env(&ak) == DT_STATUS_OK) in.gpu_attention_fused = ak == DT_ATTENTION_FUSED;
        in.avail_bytes = (double)free_b;
        in.device_name = dev->name;
        in.peak_flops = dt_peak_flops_gpu(dev->name);
        snprintf(what, sizeof what, "free on GPU %d (%s, %.2f GB in all)", dev->ordinal, dev->name,
                 (double)total_b / 1e9);
        in.avail_what = what;
    } else {
        in.avail_bytes = host_available(&in.avail_what);
        if (in.avail_bytes <= 0) return DT_STATUS_OK; /* unknown: nothing to compare with */
        in.peak_flops = dev->ops->peak_flops ? dev->ops->peak_flops(dev) : 0;
    }
    dt_mem_check_out out;
    dt_status_t st = dt_mem_check(&in, &out);
    if (st != DT_STATUS_OK) {
        char msg[1024];
        return dt_error(st, "%s", dt_plan_msg_expand(dt_error_detail(), config_words, msg, sizeof msg));
    }
    if (!out.checked || out.fits) return DT_STATUS_OK;
    return dt_error(DT_STATUS_CONFIG, "rank %d: %s", env->rank, out.message);
}
