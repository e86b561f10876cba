/*
 * train_summary.c - rank 0's summary.json at the end of a run: the run's figures
 * (losses, tokens, wall time), the parallel layout, recomputation, the strategy and
 * its overlap, and every rank's memory figures (model state by kind, buffers,
 * activations, host state under offload), which each rank measures
 * (dt_train_my_memory_) and the trainer gathers. The parts write their own keys in
 * their places: the pipeline's (train_parallel.c), LoRA's (train_lora.c), the
 * resizes (train_elastic.c), asynchronous saves (train_async.c), the stragglers.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>

#include "common/mem.h"
#include "kernels/kernels.h"
#include "runtime/model/model.h"
#include "runtime/parallel/dp.h"
#include "runtime/train/metrics.h"
#include "runtime/train/train_elastic.h"
#include "runtime/train/train_lora.h"
#include "runtime/train/train_parallel.h"
#include "runtime/train/trainer_impl.h"

/* Memory figures of one rank, in the order summary.json lists them. */
enum {
    MEM_PEAK, MEM_PARAMS, MEM_GRADS, MEM_MASTER, MEM_OPTIM, MEM_ACT, MEM_COMM, MEM_EXPECT, MEM_WORK,
    MEM_PP, /* the pipeline's DT_TRAIN_PP_FIGS figures ride along (dt_train_pp_my_figures_) */
    MEM_PP_END = MEM_PP + DT_TRAIN_PP_FIGS - 1,
    MEM_HOST, MEM_HOST_MASTER, MEM_HOST_OPTIM, MEM_HOST_GRADS, /* optimizer offload: host memory */
    MEM_LORA_BASE, /* LoRA: the frozen base's bytes */
    MEM_N
};
_Static_assert((int)MEM_N == (int)DT_TRAIN_MEM_N, "trainer_impl.h: DT_TRAIN_MEM_N is the number of figures");


void dt_train_my_memory_(dt_trainer_t *t, double *v) {
    dt_dp_mem e;
    dt_dp_expected_mem(t->dp, &e);
    v[MEM_PEAK] = (double)dt_mem_peak_total();
    v[MEM_PARAMS] = (double)dt_mem_peak(DT_MEM_PARAMS);
    v[MEM_GRADS] = (double)dt_mem_peak(DT_MEM_GRADS);
    v[MEM_MASTER] = (double)dt_mem_peak(DT_MEM_MASTER);
    v[MEM_OPTIM] = (double)dt_mem_peak(DT_MEM_OPTIM);
    v[MEM_ACT] = (double)dt_mem_peak(DT_MEM_ACTIVATIONS);
    v[MEM_COMM] = (double)dt_mem_peak(DT_MEM_COMM);
    v[MEM_LORA_BASE] = dt_train_lora_base_bytes_(&t->lora);
    v[MEM_EXPECT] = (double)(e.params + e.grads + e.master + e.optim) + v[MEM_LORA_BASE];
    v[MEM_WORK] = (double)e.work;
    dt_train_pp_my_figures_(&t->pp, v + MEM_PP);
    v[MEM_HOST] = (double)dt_mem_peak(DT_MEM_OFFLOAD);
    v[MEM_HOST_MASTER] = (double)e.host_master;
    v[MEM_HOST_OPTIM] = (double)e.host_optim;
    v[MEM_HOST_GRADS] = (double)e.host_grads;
}

dt_status_t dt_train_write_summary_(dt_trainer_t *t, double final_loss, double final_val, double tokens,
                                    double wall_s, int64_t steps, const double *mem) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "steps", (double)steps);
    cJSON_AddNumberToObject(o, "final_loss", final_loss);
    if (!isnan(final_val)) cJSON_AddNumberToObject(o, "final_val_loss", final_val);
    cJSON_AddNumberToObject(o, "tokens", tokens);
    cJSON_AddNumberToObject(o, "wall_s", wall_s);
    cJSON_AddNumberToObject(o, "tokens_per_s", tokens / wall_s);
    cJSON_AddNumberToObject(o, "world_size", t->env->world_size);
    dt_train_elastic_summary(t->log_dir, o); /* "resizes": [] unless an elastic run changed size */
    cJSON *lay = cJSON_AddObjectToObject(o, "parallel");
    cJSON_AddNumberToObject(lay, "tensor_parallel", t->place.tp_size);
    cJSON_AddBoolToObject(lay, "sequence_parallel", t->layout.sequence_parallel);
    cJSON_AddNumberToObject(lay, "context_parallel", t->place.cp_size);
    cJSON_AddNumberToObject(lay, "pipeline_parallel", t->place.pp_size);
    dt_train_pp_write_summary_(&t->pp, lay); /* schedule, micro-batches, bubble, bounds */
    cJSON_AddNumberToObject(lay, "data_parallel", t->place.dp_size);
    cJSON *ac = cJSON_AddObjectToObject(o, "activation_checkpointing"); /* this rank's layout */
    cJSON_AddStringToObject(ac, "policy", dt_model_recompute_name((dt_model_recompute_t)t->layout.recompute));
    cJSON_AddNumberToObject(ac, "every", t->layout.recompute_every);
    cJSON_AddNumberToObject(ac, "checkpointed_blocks",
                            dt_model_recompute_count(&t->layout, dt_model_max_chunk_blocks(&t->layout)));
    cJSON_AddStringToObject(o, "device", dt_device_kind_name(t->dev->kind));
    cJSON_AddStringToObject(o, "strategy", dt_config_strategy_name(t->cfg->strategy));
    cJSON_AddStringToObject(o, "offload_optimizer", dt_dp_offloaded(t->dp) ? "cpu" : "none");
    dt_train_async_summary(t->async, o); /* checkpoint.async's figures, when it saved */
    cJSON_AddNumberToObject(o, "n_params", (double)t->layout.n_params);
    const dt_dp_plan *plan = dt_dp_get_plan(t->dp);
    cJSON_AddNumberToObject(o, "n_shards", plan->n_shards);
    cJSON_AddNumberToObject(o, "padded_params", (double)plan->padded_total);
    cJSON_AddNumberToObject(o, "n_buckets", plan->n_buckets);
    dt_dp_stats ds; /* rank 0's: what overlapped with compute */
    dt_dp_get_stats(t->dp, &ds);
    cJSON *ov = cJSON_AddObjectToObject(o, "overlap");
    cJSON_AddBoolToObject(ov, "enabled", t->cfg->zero.overlap_comm);
    cJSON_AddNumberToObject(ov, "reductions_in_backward", (double)ds.reductions_in_backward);
    cJSON_AddNumberToObject(ov, "reductions_after", (double)ds.reductions_after);
    cJSON_AddNumberToObject(ov, "gathers_prefetched", (double)ds.gathers_prefetched);
    cJSON_AddNumberToObject(ov, "gathers_on_demand", (double)ds.gathers_on_demand);
    dt_stragglers_summary(t->stragglers, o);
    cJSON *ranks = cJSON_AddArrayToObject(o, "ranks");
    for (int k = 0; k < t->env->world_size; k++) {
        const double *v = mem + (size_t)k * MEM_N;
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "rank", k);
        cJSON_AddNumberToObject(r, "peak_bytes", v[MEM_PEAK]);
        cJSON *ms = cJSON_AddObjectToObject(r, "model_state_bytes");
        cJSON_AddNumberToObject(ms, "params", v[MEM_PARAMS]);
        cJSON_AddNumberToObject(ms, "grads", v[MEM_GRADS]);
        cJSON_AddNumberToObject(ms, "master", v[MEM_MASTER]);
        cJSON_AddNumberToObject(ms, "optim", v[MEM_OPTIM]);
        cJSON_AddNumberToObject(ms, "total", v[MEM_PARAMS] + v[MEM_GRADS] + v[MEM_MASTER] + v[MEM_OPTIM]);
        cJSON_AddNumberToObject(ms, "expected", v[MEM_EXPECT]);
        dt_train_lora_write_rank_summary_(&t->lora, v[MEM_LORA_BASE], ms);
        /* comm: the communicator's buffers plus dp's bucket/unit buffers (dp_buffer_bytes) */
        cJSON_AddNumberToObject(r, "comm_buffer_bytes", v[MEM_COMM]);
        cJSON_AddNumberToObject(r, "dp_buffer_bytes", v[MEM_WORK]);
        cJSON_AddNumberToObject(r, "activation_bytes", v[MEM_ACT]);
        if (dt_dp_offloaded(t->dp)) { /* model_state_bytes above: the device's; this: the host's */
            cJSON *h = cJSON_AddObjectToObject(r, "host_state_bytes");
            cJSON_AddNumberToObject(h, "master", v[MEM_HOST_MASTER]);
            cJSON_AddNumberToObject(h, "optim", v[MEM_HOST_OPTIM]);
            cJSON_AddNumberToObject(h, "grads", v[MEM_HOST_GRADS]);
            cJSON_AddNumberToObject(h, "total", v[MEM_HOST]);
            cJSON_AddNumberToObject(h, "expected", v[MEM_HOST_MASTER] + v[MEM_HOST_OPTIM] + v[MEM_HOST_GRADS]);
        }
        dt_train_pp_write_rank_summary_(&t->pp, v + MEM_PP, r);
        cJSON_AddItemToArray(ranks, r);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    dt_status_t st = dt_metrics_write_file(t->log_dir, "summary.json", text);
    free(text);
    return st;
}

