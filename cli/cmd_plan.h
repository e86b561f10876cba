/*
 * cmd_plan.h - what `dtrun plan`'s two files share (private to cli/): the parsed
 * flags, the resolved model and hardware, and the printers. cmd_plan.c parses and
 * computes the rows; cmd_plan_report.c prints them (text, --json) and runs
 * --measure.
 */
#ifndef DT_CLI_CMD_PLAN_H
#define DT_CLI_CMD_PLAN_H

#include "common/gpuinfo.h" /* defines: dt_gpu_spec */
#include "runtime/config/config.h"
#include "runtime/tools/plan.h"

#define MAX_GPU_COUNTS 32
/* The most GPUs a plan covers (--gpus counts, --nodes M*G, --gpus-per-node): counts
 * stay far from int overflow in every product the plan forms. */
#define PLAN_MAX_GPUS 1000000
#define MAX_OVERRIDES 64
#define MAX_TP_SIZES 16
#define MAX_PP_LAYOUTS 32

/* One pipeline layout a row is planned at: P ranks of V chunks under a schedule
 * (P 1: no pipeline). */
typedef struct plan_pp_layout {
    int pp, virtual_stages, schedule;
} plan_pp_layout;

typedef struct plan_opts {
    const char *config;
    const char *overrides[MAX_OVERRIDES];
    int n_overrides;
    double params;
    int layers, hidden, heads, seq, vocab, micro_batch, accum;
    int counts[MAX_GPU_COUNTS], n_counts;
    const char *gpu, *link, *intra_link, *precision, *comm_dtype;
    double gpu_mem, gpu_tflops, link_gbps, intra_gbps, mfu, reserve, tokens, hours, price;
    int nodes_m, nodes_g, gpus_per_node;
    int strategies[DT_STRATEGY_COUNT], n_strategies;
    int json, measure, measure_steps;
    int highlight_strategy; /* the config's strategy, -1 none */
    int lora_r;                              /* --lora-r: 0 = the config's lora.r */
    const char *base_dtype, *lora_targets;   /* --base-dtype, --lora-targets */
    int tps[MAX_TP_SIZES], n_tps; /* --tp sizes (none given: 1) */
    int tp_auto;                  /* --tp auto: every size dividing the node and the model */
    int sp;                       /* --sp: sequence parallelism */
    int kv_heads, ffn;            /* sized Llama-shaped models */
    /* pipeline: --pp sizes (none: 1) or auto, --schedule (-1: 1f1b, with --pp auto
     * 1f1b and interleaved), --virtual-stages (0: 2 for interleaved), --partition
     * (-1: uniform); the layouts searched (cmd_plan_pp.c) */
    int pps[MAX_PP_LAYOUTS], n_pps, pp_auto;
    int schedule, virtual_stages, partition;
    plan_pp_layout layouts[MAX_PP_LAYOUTS];
    int n_layouts;
} plan_opts;

typedef struct plan_ctx {
    dt_plan_input in;
    dt_config_t cfg;
    int have_cfg;
    int cfg_bf16;       /* the config's bf16.enabled (1 without a config) */
    int cfg_comm_bytes; /* the config's communication_data_type, 0 = the precision's */
    int cfg_threads;    /* the config's threads per rank, 0 = auto */
    int cfg_tp;         /* the config's tensor_parallel.size (1 without a config) */
    const dt_gpu_spec *gpu;
    /* the config's model (have_spec), and the model at each TP size of opts.tps */
    dt_model_spec spec;
    int have_spec;
    dt_plan_model tp_models[MAX_TP_SIZES];
    int n_tp_models;
    char gpu_label[96], model_label[384], work_label[160];
    /* the cheapest plan's stages when it is a pipeline (n_stages 0 otherwise) */
    dt_plan_stage stages[DT_PLAN_MAX_CHUNKS];
    dt_plan_row stage_rows[DT_PLAN_MAX_CHUNKS];
    int n_stages;
} plan_ctx;

/* cmd_plan_pp.c: --pp, --schedule, --virtual-stages, --partition (1: not one of
 * them, else 0 or an exit code); the layouts to plan (exit code on a bad one); the
 * model of TP model base at a layout (0, or 1 with msg); the cheapest row's stages
 * into c->stages / c->stage_rows. */
int cmd_plan_parse_pp_flag(const char *flag, const char *val, plan_opts *o);
int cmd_plan_setup_pp(plan_opts *o, plan_ctx *c);
int cmd_plan_pp_model(const plan_opts *o, const plan_ctx *c, const dt_plan_model *base, const plan_pp_layout *pl,
                      dt_plan_model *out, char *msg, size_t len);
/* cmd_plan_lora.c: --lora-r, --base-dtype, --lora-targets (1: not one of them, else 0
 * or an exit code); the LoRA model-state section when --lora-r or the config's
 * lora.r is set (0, or an exit code). */
int cmd_plan_parse_lora_flag(const char *flag, const char *val, plan_opts *o);
int cmd_plan_print_lora(const plan_opts *o, const plan_ctx *c);
int cmd_plan_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* cmd_plan_help.c: the --help text (printf format: the GPU names, the link names) */
extern const char cmd_plan_help_text[];

void cmd_plan_print_text(const plan_opts *o, const plan_ctx *c, const dt_plan_row *rows,
                         int n_rows, const dt_plan_choice *ch);
void cmd_plan_print_json(const plan_opts *o, const plan_ctx *c, const dt_plan_row *rows,
                         int n_rows, const dt_plan_choice *ch);
int cmd_plan_measure(const plan_opts *o, const dt_plan_row *est);

#endif /* DT_CLI_CMD_PLAN_H */
