/*
 * config_resolve.c - the batch identity (config.h): train_batch_size =
 * micro batch x gradient accumulation x data-parallel size (the layout's,
 * runtime/layout/layout.h), any two given and the third derived, checked against the
 * world size the launcher knows; the pipeline schedule's rules
 * (runtime/layout/pp_sched.h) against the micro-batches; the checks against the node shape (a
 * tensor-parallel group within one node) and the model's vocabulary once known;
 * whether a config runs on CUDA, and in which dtype it computes.
 */
#include "runtime/config/config_impl.h"
#include "runtime/config/config_errors.h"

#include <stdbool.h>
#include <stdio.h>

#include "common/gpuinfo.h"         /* defines: dt_gpuinfo_count */
#include "runtime/layout/layout.h"   /* defines: dt_layout_of */
#include "runtime/layout/pp_sched.h" /* defines: dt_pp_schedule_check */

/* The pipeline schedule against the micro-batches per step (the keys' bounds keep
 * the three int-sized). */
static void check_pp_schedule(dt_config_t *cfg, const char *src) {
    char msg[600];
    if (dt_pp_schedule_check(cfg->pp.schedule, (int)cfg->pp.stages, (int)cfg->pp.virtual_stages,
                             (int)cfg->gradient_accumulation_steps, msg, sizeof msg))
        dt_config_add_error_(cfg, src, msg);
}

dt_status_t dt_config_resolve(dt_config_t *cfg, int world_size) {
    /* forget the errors of an earlier resolve */
    cfg->errors_len = cfg->load_errors_len;
    cfg->n_errors = cfg->load_n_errors;
    if (cfg->errors) cfg->errors[cfg->errors_len] = '\0';
    const char *src = cfg->source ? cfg->source : "config";

    /* world = tensor_parallel.size x pipeline.stages x data-parallel ranks; the batch is
     * over DP ranks */
    dt_layout_dims dims = dt_layout_dims_of(cfg->tp.size, cfg->cp.size, cfg->pp.stages);
    dt_layout lay;
    dt_status_t lst = dt_layout_of(&dims, world_size, 0, &lay);
    if (world_size >= 1) cfg->world_size = world_size; /* a world the sizes do not divide is still this one */
    if (lst != DT_STATUS_OK) {
        dt_config_add_error_(cfg, src, dt_error_detail());
        dt_config_error_detail_(cfg);
        return DT_STATUS_CONFIG;
    }
    int64_t tp = dt_layout_tp_size(&lay), pp = dt_layout_pp_size(&lay), replica = dt_layout_replica_size(&lay);
    cfg->dp_size = dt_layout_dp_size(&lay);
    /* how the size in the identity came, for its messages: "world size 4", or
     * "world size 4 / tensor_parallel.size 2 = 2 data-parallel ranks" */
    char dp_how[200];
    const char *dp_name = replica > 1 ? "data-parallel size" : "world size";
    int64_t cp = dt_layout_cp_size(&lay);
    if ((tp > 1) + (pp > 1) + (cp > 1) > 1)
        snprintf(dp_how, sizeof dp_how,
                 "world size %d / (tensor_parallel.size %lld x context_parallel.size %lld x pipeline.stages %lld) "
                 "= %d data-parallel ranks",
                 world_size, (long long)tp, (long long)cp, (long long)pp, cfg->dp_size);
    else if (replica > 1)
        snprintf(dp_how, sizeof dp_how, "world size %d / %s %lld = %d data-parallel ranks", world_size,
                 tp > 1 ? "tensor_parallel.size" : cp > 1 ? "context_parallel.size" : "pipeline.stages",
                 (long long)replica, cfg->dp_size);
    else
        snprintf(dp_how, sizeof dp_how, "world size %d", world_size);
    bool g_tb = dt_config_given(cfg, "train_batch_size");
    bool g_mb = dt_config_given(cfg, "train_micro_batch_size_per_gpu");
    bool g_ga = dt_config_given(cfg, "gradient_accumulation_steps");
    int64_t tb = g_tb ? cfg->train_batch_size : 0;
    int64_t mb = g_mb ? cfg->train_micro_batch_size_per_gpu : 0;
    int64_t ga = g_ga ? cfg->gradient_accumulation_steps : 0;
    int64_t ws = cfg->dp_size;
    const char *why = NULL;
    char whybuf[200];

    if (g_tb && g_mb && g_ga) {
        if (tb != mb * ga * ws) {
            snprintf(whybuf, sizeof whybuf, "%lld * %lld * %lld = %lld, not %lld",
                     (long long)mb, (long long)ga, (long long)ws, (long long)(mb * ga * ws),
                     (long long)tb);
            why = whybuf;
        }
    } else if (g_tb && g_mb) {
        if (tb % (mb * ws) != 0) {
            snprintf(whybuf, sizeof whybuf,
                     "%lld is not a multiple of %lld * %lld, so gradient_accumulation_steps "
                     "cannot be derived",
                     (long long)tb, (long long)mb, (long long)ws);
            why = whybuf;
        } else {
            ga = tb / (mb * ws);
        }
    } else if (g_tb && g_ga) {
        if (tb % (ga * ws) != 0) {
            snprintf(whybuf, sizeof whybuf,
                     "%lld is not a multiple of %lld * %lld, so train_micro_batch_size_per_gpu "
                     "cannot be derived",
                     (long long)tb, (long long)ga, (long long)ws);
            why = whybuf;
        } else {
            mb = tb / (ga * ws);
        }
    } else if (g_mb && g_ga) {
        tb = mb * ga * ws;
    } else if (g_tb) {
        ga = 1;
        if (tb % ws != 0) {
            snprintf(whybuf, sizeof whybuf,
                     "%lld is not a multiple of the %s, so "
                     "train_micro_batch_size_per_gpu cannot be derived",
                     (long long)tb, dp_name);
            why = whybuf;
        } else {
            mb = tb / ws;
        }
    } else if (g_mb) {
        ga = 1;
        tb = mb * ws;
    } else {
        mb = 1;
        ga = g_ga ? ga : 1;
        tb = mb * ga * ws;
    }
    if (why) {
        char a[32], b[32], c[32];
        snprintf(a, sizeof a, g_tb ? "%lld" : "(not given)", (long long)tb);
        snprintf(b, sizeof b, g_mb ? "%lld" : "(not given)", (long long)mb);
        snprintf(c, sizeof c, g_ga ? "%lld" : "(not given)", (long long)ga);
        char msg[900];
        snprintf(msg, sizeof msg,
                  "train_batch_size %s, train_micro_batch_size_per_gpu %s, "
                  "gradient_accumulation_steps %s, %s: expected train_batch_size = "
                  "train_micro_batch_size_per_gpu * gradient_accumulation_steps * %s, "
                  "found %s",
                  a, b, c, dp_how, dp_name, why);
        dt_config_add_error_(cfg, src, msg);
        dt_config_error_detail_(cfg);
        return DT_STATUS_CONFIG;
    }
    cfg->train_batch_size = tb;
    cfg->train_micro_batch_size_per_gpu = mb;
    cfg->gradient_accumulation_steps = ga;
    if (pp > 1) check_pp_schedule(cfg, src);
    /* sequence parallelism cuts a micro-batch's B*T token rows in tp.size parts */
    if (cfg->tp.size > 1 && cfg->tp.sequence_parallel && cfg->model.ops &&
        cfg->model.ops->data == DT_MODEL_DATA_TOKENS && cfg->model.seq_len > 0 &&
        (mb * (cfg->model.seq_len / cp)) % cfg->tp.size != 0) {
        char msg[400];
        snprintf(msg, sizeof msg,
                 "tensor_parallel.sequence_parallel: the micro-batch's train_micro_batch_size_per_gpu x model.seq_len%s "
                 "= %lld x %d = %lld token rows must divide among tensor_parallel.size %lld ranks",
                 cp > 1 ? " / context_parallel.size" : "", (long long)mb, (int)(cfg->model.seq_len / cp),
                 (long long)(mb * (cfg->model.seq_len / cp)), (long long)cfg->tp.size);
        dt_config_add_error_(cfg, src, msg);
    }
    /* ZeRO-Offload moves the optimizer's shard: DDP has none (DeepSpeed refuses stage 0 too) */
    if (cfg->zero.offload_optimizer.device == DT_CONFIG_OFFLOAD_CPU &&
        !dt_strategy_shards(cfg->strategy, DT_STRATEGY_SHARDS_OPTIM))
        dt_config_add_error_(cfg, src,
                             "zero_optimization.offload_optimizer.device cpu: expected a sharded optimizer "
                             "(strategy zero1, zero2, fsdp or hsdp; zero_optimization.stage 1-3), found strategy "
                             "ddp");
    if (cfg->n_errors) {
        dt_config_error_detail_(cfg);
        return DT_STATUS_CONFIG;
    }
    return DT_STATUS_OK;
}

int dt_config_given(const dt_config_t *cfg, const char *key) {
    int row = dt_config_key_find_(key);
    return row >= 0 && cfg->origin[row] != DT_CONFIG_ORIGIN_DEFAULT;
}

int dt_config_uses_cuda(const dt_config_t *cfg) {
    return cfg->device == DT_CONFIG_DEVICE_CUDA || (cfg->device == DT_CONFIG_DEVICE_AUTO && dt_gpuinfo_count() > 0);
}

dt_dtype_t dt_config_compute_dtype(const dt_config_t *cfg, int on_gpu) {
    return on_gpu && cfg->bf16.enabled ? DT_DTYPE_BF16 : DT_DTYPE_F32;
}

dt_status_t dt_config_check_nodes(dt_config_t *cfg, int nproc_per_node) {
    const char *src = cfg->source ? cfg->source : "config";
    int64_t tp = cfg->tp.size > 0 ? cfg->tp.size : 1;
    if (tp > 1 && (nproc_per_node < 1 || nproc_per_node % tp != 0)) {
        char msg[600];
        snprintf(msg, sizeof msg,
                 "tensor_parallel.size %lld and nproc_per_node %d: expected nproc_per_node to be a "
                 "multiple of tensor_parallel.size (a tensor-parallel group is consecutive local "
                 "ranks of one node and may not span nodes)",
                 (long long)tp, nproc_per_node);
        dt_config_add_error_(cfg, src, msg);
    }
    if (cfg->n_errors) {
        dt_config_error_detail_(cfg);
        return DT_STATUS_CONFIG;
    }
    return DT_STATUS_OK;
}

int dt_config_tp_check_vocab(const dt_config_t *cfg, int vocab_size, char *msg, size_t len) {
    if (cfg->tp.size <= 1) return 0;
    if (cfg->tp.size > 1 << 30) { /* the key's bound keeps it an int; a struct set by hand may not */
        snprintf(msg, len, "tensor_parallel.size: expected an integer in [1, 2^30], found %lld",
                 (long long)cfg->tp.size);
        return 1;
    }
    dt_model_spec s = cfg->model; /* a plain copy: only sizes are read */
    s.vocab_size = vocab_size;
    return dt_model_tp_check(&s, (int)cfg->tp.size, msg, len);
}
