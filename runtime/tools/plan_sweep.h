/*
 * plan_sweep.h - `dtrun plan`'s sweep: the rows of every strategy x TP size x
 * pipeline layout x GPU count (plan.h prices one row), the models at each TP size
 * and layout, a config's batch at each count, the cheapest pipeline's stages; and
 * the LoRA arithmetic (plan_lora.c): a LoRA run's adapters, frozen base and the
 * model-state bytes per GPU the trainer allocates. `dtrun plan` (cli/) parses the
 * flags into the axes and prints; the memory check before the first step
 * (mem_check.c) prices its one row with the same functions.
 *
 * Errors are DT_STATUS_USAGE with a message naming the flag (--tp, --pp, --gpus,
 * ...), as `dtrun plan` prints it; DT_STATUS_CONFIG from dt_plan_sweep_row_input
 * when the config's batch does not fit a GPU count (its message ends with ':',
 * the config's errors follow: dt_config_errors).
 */
#ifndef DT_RUNTIME_PLAN_SWEEP_H
#define DT_RUNTIME_PLAN_SWEEP_H

#include <stddef.h>

#include "common/status.h"
#include "runtime/config/config.h" /* defines: dt_config_t */
#include "runtime/model/lora.h"    /* defines: dt_lora_spec */
#include "runtime/model/model.h"   /* defines: dt_model_spec */
#include "runtime/tools/plan.h"

#define DT_PLAN_SWEEP_MAX_COUNTS 32
#define DT_PLAN_SWEEP_MAX_TP 16
#define DT_PLAN_SWEEP_MAX_LAYOUTS 32
#define DT_PLAN_SWEEP_MAX_CP 16

/* One pipeline layout a row is planned at: P ranks of V chunks under a schedule
 * (P 1: no pipeline). */
typedef struct dt_plan_pp_layout {
    int pp, virtual_stages, schedule;
} dt_plan_pp_layout;

/* What to sweep (`dtrun plan`'s --gpus, --strategy, --tp, --sp, --cp, --pp, --schedule,
 * --virtual-stages, --partition); dt_plan_sweep_setup_tp and _setup_pp fill in the
 * TP sizes, the CP sizes and the layouts. */
typedef struct dt_plan_sweep_axes {
    int counts[DT_PLAN_SWEEP_MAX_COUNTS], n_counts;
    int strategies[DT_STRATEGY_COUNT], n_strategies;
    int tps[DT_PLAN_SWEEP_MAX_TP], n_tps; /* none given: the config's, else 1 */
    int tp_auto; /* every size dividing the node and the model */
    int sp;      /* sequence parallelism */
    /* context parallelism: sizes (none given: the config's, else 1) */
    int cps[DT_PLAN_SWEEP_MAX_CP], n_cps;
    /* pipeline: sizes (none: 1) or auto, schedule (-1: 1f1b, with auto 1f1b and
     * interleaved), virtual stages (0: 2 for interleaved), partition (-1: uniform) */
    int pps[DT_PLAN_SWEEP_MAX_LAYOUTS], n_pps, pp_auto;
    int schedule, virtual_stages, partition;
    dt_plan_pp_layout layouts[DT_PLAN_SWEEP_MAX_LAYOUTS];
    int n_layouts;
} dt_plan_sweep_axes;

typedef struct dt_plan_sweep {
    dt_plan_sweep_axes *ax;     /* the caller's */
    dt_plan_input in;           /* the base input: its model is the whole model (TP 1) */
    dt_config_t *cfg;           /* the config (resolved per GPU count), NULL: a sized model */
    const dt_model_spec *spec;  /* the config's model, NULL: in.model from sizes */
    int cfg_threads;            /* the config's threads per rank, 0 = auto */
    int peak_given;             /* in.peak_flops was given: the CPU's is not measured per row */
    /* the model at each TP size of ax->tps (dt_plan_sweep_setup_tp) */
    dt_plan_model tp_models[DT_PLAN_SWEEP_MAX_TP];
    int n_tp_models;
    /* the cheapest plan's stages when it is a pipeline (n_stages 0 otherwise) */
    dt_plan_stage stages[DT_PLAN_MAX_CHUNKS];
    dt_plan_row stage_rows[DT_PLAN_MAX_CHUNKS];
    int n_stages;
    /* a LoRA run (NULL: full training): every row is the adapters' (dt_plan_lora_row),
     * and there are no TP or pipeline rows (LoRA runs with data parallelism only) */
    const struct dt_plan_lora *lora;
} dt_plan_sweep;

/* The CPU's peak with `threads` threads, from the CPU device's own probe (0: none). */
double dt_plan_cpu_peak_flops(int threads);
/* CPU threads of each of n ranks on this host: the config's `threads`, else what
 * the trainer gets by default: all cores for one rank, one each for several
 * (OMP_NUM_THREADS=1 with more than one worker). */
int dt_plan_sweep_cpu_threads(const dt_plan_sweep *sw, int n);

/* The model at TP size tp and pipeline layout pl (NULL or pp 1: none): rank 0's TP
 * layout of sw->spec cut into pl's stages, or the sized sw->in.model cut by
 * dt_plan_model_set_tp / _set_pp. DT_STATUS_USAGE with what does not divide (the
 * caller names --tp). Free with dt_plan_model_free. */
dt_status_t dt_plan_sweep_model(const dt_plan_sweep *sw, int tp, const dt_plan_pp_layout *pl, dt_plan_model *out);
/* The TP sizes and their models: ax->tps (each must divide the GPUs per node and
 * the model), tp_auto's (the powers of two up to the GPUs per node that divide it
 * and the model), or the config's tensor_parallel section, else 1. */
dt_status_t dt_plan_sweep_setup_tp(dt_plan_sweep *sw);
/* The pipeline layouts to plan (after setup_tp): the config's pipeline section as
 * the defaults, --pp auto's powers of two dividing the layers. The CP sizes: ax->cps
 * (each checked against the model: dt_plan_model_set_cp), else the config's
 * context_parallel.size, else 1. */
dt_status_t dt_plan_sweep_setup_pp(dt_plan_sweep *sw);
/* Sets sw->in's micro-batch and accumulation (and the CPU's threads and peak) for
 * n GPUs at TP tp x CP cp x PP pp: a config keeps its global batch (dt_config_resolve). */
dt_status_t dt_plan_sweep_row_input(dt_plan_sweep *sw, int n, int tp, int cp, int pp);
/* The rows of one (strategy, TP size ax->tps[k], CP size cp, layout) at every GPU
 * count TP x CP x PP divides, appended at rows[*r]. */
dt_status_t dt_plan_sweep_rows(dt_plan_sweep *sw, int strategy, int k, int cp, const dt_plan_pp_layout *pl,
                               dt_plan_row *rows, int *r);
/* Every row (free *rows), sw->in left at the first row's batch, the recommendation
 * and, when the cheapest is a pipeline, its stages in sw->stages / stage_rows. */
dt_status_t dt_plan_sweep_all(dt_plan_sweep *sw, dt_plan_row **rows, int *n_rows, dt_plan_choice *ch);
/* One row without a pipeline: strategy at n GPUs at TP size tp (one of ax->tps) and
 * CP size cp. */
dt_status_t dt_plan_sweep_row(dt_plan_sweep *sw, int strategy, int tp, int cp, int n, dt_plan_row *out);
void dt_plan_sweep_free(dt_plan_sweep *sw);

/* ---- LoRA (plan_lora.c) ------------------------------------------------------ */

/* A LoRA run's model-state arithmetic: the adapters (trainable, the flat buffer the
 * strategy shards like any parameters: 16 bytes per adapter parameter) and the
 * frozen base (runtime/model/lora.h: the base dtype, int8 linears with a 4-byte
 * scale per row; replicated on every rank). */
typedef struct dt_plan_lora {
    dt_lora_spec spec;       /* its targets resolved (the model's default when none) */
    double scale;            /* alpha / r */
    dt_dtype_t compute;
    double base_params;      /* the base model's elements */
    double adapter_params;   /* the adapters' elements */
    double base_bytes;       /* the frozen base on the device */
    double sink_bytes;       /* the base's 1-D tensors' gradient sink (a run's, not in state_bytes) */
    double state_bytes;      /* model-state bytes per GPU under ddp: base + 16 per adapter parameter */
    double full_bytes;       /* full fine-tuning's: 16 per parameter */
    double scratch_per_row;  /* adapter activation bytes per row (token) of a micro-batch */
    dt_plan_model adapters;  /* the adapters as plan's model (free with dt_plan_lora_free) */
} dt_plan_lora;

/* The base dtype by name ("int8", "fp32", "bf16", "auto") for compute; DT_STATUS_USAGE
 * naming --base-dtype when it is neither int8, auto nor the compute dtype. */
dt_status_t dt_plan_lora_base(const char *name, dt_dtype_t compute, dt_lora_base_t *out);
/* The LoRA model of spec (whole model, one stage) under ls. */
dt_status_t dt_plan_lora_compute(const dt_model_spec *spec, const dt_lora_spec *ls, dt_dtype_t compute,
                                 dt_plan_lora *out);
/* A row of the base model turned into the LoRA run's: the model states are the
 * adapters' under the row's strategy plus the frozen base, the communication
 * buffers and collectives the adapters', the activations the base's plus the
 * adapters' scratch; the totals, the fit (usable stays the row's), the step time,
 * efficiency, tokens/s and cost follow. */
dt_status_t dt_plan_lora_row(const dt_plan_input *in, const dt_plan_lora *lora, dt_plan_row *row);
void dt_plan_lora_free(dt_plan_lora *l);

#endif /* DT_RUNTIME_PLAN_SWEEP_H */
