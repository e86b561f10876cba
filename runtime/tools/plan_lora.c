/*
 * plan_lora.c - a LoRA run's arithmetic (plan_sweep.h): the adapters' trainable
 * parameters and the model-state bytes per GPU the trainer allocates
 * (runtime/model/lora.h: the frozen base in its dtype, int8 linears with a 4-byte
 * scale per row; 16 bytes per adapter parameter: parameter, gradient and Adam's two
 * moments in fp32, or bf16 parameter and gradient plus the fp32 master), against
 * full fine-tuning's 16 bytes per parameter. The adapters are the flat buffer a
 * strategy holds: replicated under ddp and sharded by ZeRO like any parameters
 * (dt_plan_lora_row prices them per strategy); the base is replicated on every rank.
 */
#include "runtime/tools/plan_sweep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/mem.h" /* defines: dt_xcalloc */

dt_status_t dt_plan_lora_base(const char *bd, dt_dtype_t compute, dt_lora_base_t *out) {
    if (!bd) bd = "auto";
    *out = DT_LORA_BASE_COMPUTE;
    if (!strcasecmp(bd, "int8")) *out = DT_LORA_BASE_INT8;
    else if (strcasecmp(bd, "auto") && strcasecmp(bd, compute == DT_DTYPE_F32 ? "fp32" : "bf16"))
        return dt_error(DT_STATUS_USAGE, "{base_dtype}: %s is not the compute dtype (%s): int8, auto or %s", bd,
                        dt_dtype_name(compute), compute == DT_DTYPE_F32 ? "fp32" : "bf16");
    return DT_STATUS_OK;
}

dt_status_t dt_plan_lora_compute(const dt_model_spec *spec, const dt_lora_spec *ls, dt_dtype_t compute,
                                 dt_plan_lora *out) {
    memset(out, 0, sizeof *out);
    dt_model_layout base, adapters;
    dt_lora_t lora;
    DT_CHECK(dt_model_layout_init(spec, &base));
    dt_status_t st = dt_lora_init(&base, ls, compute, &lora, &adapters);
    if (st != DT_STATUS_OK) goto out_free_base;
    out->spec = lora.spec;
    out->scale = lora.scale;
    out->compute = compute;
    out->base_params = (double)base.n_params;
    out->adapter_params = (double)adapters.n_params;
    out->base_bytes = (double)dt_lora_base_state_bytes(&lora);
    out->sink_bytes = (double)lora.sink_elems * (double)dt_dtype_size(compute);
    out->state_bytes = out->base_bytes + 16.0 * out->adapter_params;
    out->full_bytes = 16.0 * out->base_params;
    out->scratch_per_row = 2.0 * ls->r * (double)dt_dtype_size(compute); /* the net's x·A and its gradient */
    /* the adapters as plan sees a model: the base's shapes (its arena, FLOPs), the
     * adapters' elements and units (what the strategy holds and shards) */
    st = dt_plan_model_from_layout(&base, &out->adapters);
    if (st == DT_STATUS_OK) {
        dt_plan_model *m = &out->adapters;
        m->n_params = m->n_params_global = m->n_params_unpadded = (double)adapters.n_params;
        m->n_units = adapters.n_units;
        m->largest_unit = 0;
        free(m->unit_numel);
        m->unit_numel = dt_xcalloc((size_t)adapters.n_units, sizeof *m->unit_numel);
        for (int u = 0; u < adapters.n_units; u++) {
            m->unit_numel[u] = (double)adapters.units[u].numel;
            if (m->unit_numel[u] > m->largest_unit) m->largest_unit = m->unit_numel[u];
        }
    }
    dt_lora_free(&lora);
    dt_model_layout_free(&adapters);
out_free_base:
    dt_model_layout_free(&base);
    return st;
}

dt_status_t dt_plan_lora_row(const dt_plan_input *in, const dt_plan_lora *lora, dt_plan_row *row) {
    dt_plan_input ai = *in;
    ai.model = lora->adapters;
    ai.model.recompute_every = in->model.recompute_every;
    dt_plan_row a;
    DT_CHECK(dt_plan_row_compute(&ai, row->strategy, row->n_gpus, &a));
    double scratch = lora->scratch_per_row * (double)in->micro_batch * (double)in->model.seq_len;
    /* the base row's compute without recomputation (efficiency = base / step) */
    double base_s = row->efficiency * row->step_s;
    row->params = a.params + lora->base_bytes + lora->sink_bytes;
    row->grads = a.grads;
    row->optim = a.optim;
    row->comm_buf = a.comm_buf;
    row->acts += scratch;
    row->acts_ckpt += scratch;
    double states = row->params + row->grads + row->optim;
    row->total = states + row->acts + row->comm_buf;
    row->total_ckpt = states + row->acts_ckpt + row->comm_buf;
    /* what fits now (the adapters' states are a fraction of the base row's): the
     * cheaper recomputation policy again when it fits, as dt_plan_row_compute picks */
    if (!in->model.feature_rows && row->ckpt_policy == DT_MODEL_RECOMPUTE_FULL) {
        double sel = dt_plan_input_activation_bytes(in, &in->model, DT_MODEL_RECOMPUTE_SELECTIVE) + scratch;
        if (states + sel + row->comm_buf <= row->usable) {
            row->ckpt_policy = DT_MODEL_RECOMPUTE_SELECTIVE;
            row->acts_ckpt = sel;
            row->total_ckpt = states + sel + row->comm_buf;
        }
    }
    row->fit = row->total <= row->usable ? DT_PLAN_FIT_YES
               : row->total_ckpt <= row->usable ? DT_PLAN_FIT_CKPT
                                                : DT_PLAN_FIT_NO;
    if (base_s > 0)
        row->compute_s = base_s * (row->fit == DT_PLAN_FIT_CKPT ? dt_plan_recompute_factor(&in->model, row->ckpt_policy) : 1.0);
    /* the collectives move the adapters' gradients and states only (the base's
     * compute stays: its activations' gradients are still computed) */
    row->comm_s = a.comm_s - a.tp_comm_s + row->tp_comm_s;
    row->exposed_s = a.exposed_s - a.tp_comm_s + row->tp_comm_s;
    row->overlapped_s = row->comm_s - row->exposed_s;
    row->n_collectives = a.n_collectives;
    double tokens = row->step_s * row->tokens_per_s; /* the job's tokens per step */
    row->step_s = row->compute_s + row->exposed_s; /* no pipeline: LoRA runs data-parallel */
    if (row->step_s > 0) {
        row->efficiency = base_s / row->step_s;
        row->tokens_per_s = tokens / row->step_s;
    }
    dt_plan_cost(in->hours_1gpu, row->n_gpus, in->price, row->efficiency, &row->hours, &row->cost);
    return DT_STATUS_OK;
}

void dt_plan_lora_free(dt_plan_lora *l) { dt_plan_model_free(&l->adapters); }
