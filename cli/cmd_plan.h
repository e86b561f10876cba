/*
 * cmd_plan.h - what `dtrun plan`'s two files share (private to cli/): the parsed
 * flags, the resolved model and hardware, and the printers. cmd_plan.c parses and
 * has runtime/tools/plan_sweep.c compute the rows; cmd_plan_report.c prints them
 * (text, --json) and runs --measure.
 */
#ifndef DT_CLI_CMD_PLAN_H
#define DT_CLI_CMD_PLAN_H

#include "common/gpuinfo.h" /* defines: dt_gpu_spec */
#include "runtime/config/config.h"
#include "runtime/tools/plan.h"
#include "runtime/tools/plan_sweep.h" /* defines: dt_plan_sweep, dt_plan_sweep_axes */

#define MAX_GPU_COUNTS DT_PLAN_SWEEP_MAX_COUNTS
/* The most GPUs a plan covers (--gpus counts, --nodes M*G, --gpus-per-node): counts
 * stay far from int overflow in every product the plan forms. */
#define PLAN_MAX_GPUS 1000000
#define MAX_OVERRIDES 64
#define MAX_TP_SIZES DT_PLAN_SWEEP_MAX_TP
#define MAX_PP_LAYOUTS DT_PLAN_SWEEP_MAX_LAYOUTS

typedef struct plan_opts {
    const char *config;
    const char *overrides[MAX_OVERRIDES];
    int n_overrides;
    double params;
    int layers, hidden, heads, seq, vocab, micro_batch, accum;
    const char *gpu, *link, *intra_link, *precision, *comm_dtype;
    double gpu_mem, gpu_tflops, link_gbps, intra_gbps, mfu, reserve, tokens, hours, price;
    int nodes_m, nodes_g, gpus_per_node;
    int json, measure, measure_steps;
    int highlight_strategy; /* the config's strategy, -1 none */
    int lora_r;                              /* --lora-r: 0 = the config's lora.r */
    const char *base_dtype, *lora_targets;   /* --base-dtype, --lora-targets */
    int kv_heads, ffn;            /* sized Llama-shaped models */
    /* what the plan sweeps: --gpus, --strategy, --tp (none given: the config's, else
     * 1; auto), --sp, --cp (none given: the config's, else 1), --pp (none: 1; auto), --schedule, --virtual-stages, --partition
     * (cmd_plan_pp.c); the TP sizes and layouts the sweep fills in */
    dt_plan_sweep_axes ax;
} plan_opts;

typedef struct plan_ctx {
    /* the sweep (runtime/tools/plan_sweep.h): the input, the models at each TP size,
     * the cheapest pipeline's stages; its cfg and spec point at cfg and spec here */
    dt_plan_sweep sw;
    dt_config_t cfg;
    int have_cfg;
    int cfg_bf16;       /* the config's bf16.enabled (1 without a config) */
    int cfg_comm_bytes; /* the config's communication_data_type, 0 = the precision's */
    int cfg_tp;         /* the config's tensor_parallel.size (1 without a config) */
    int cfg_cp;         /* the config's context_parallel.size (1 without a config) */
    const dt_gpu_spec *gpu;
    dt_model_spec spec; /* the config's model (have_spec) */
    int have_spec;
    char gpu_label[96], model_label[384], work_label[160];
    dt_plan_lora lora; /* --lora-r or the config's lora section (have_lora); sw.lora points here */
    int have_lora;
} plan_ctx;

/* cmd_plan_pp.c: --pp, --schedule, --virtual-stages, --partition (1: not one of
 * them, else 0 or an exit code). */
int cmd_plan_parse_pp_flag(const char *flag, const char *val, plan_opts *o);
/* cmd_plan_lora.c: --lora-r, --base-dtype, --lora-targets (1: not one of them, else 0
 * or an exit code); cmd_plan_setup_lora: the LoRA run's arithmetic when --lora-r or
 * the config's lora.r is set, every row then the LoRA run's (0, or an exit code);
 * cmd_plan_print_lora / _json: its section. */
int cmd_plan_parse_lora_flag(const char *flag, const char *val, plan_opts *o);
int cmd_plan_setup_lora(const plan_opts *o, plan_ctx *c); /* after the sweep's TP/PP setup */
void cmd_plan_print_lora(const plan_ctx *c);
struct cJSON;
void cmd_plan_lora_json(const plan_ctx *c, struct cJSON *root);
int cmd_plan_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* cmd_plan_usage.c: plan's messages ("{tp}", runtime/tools/plan.h) in `dtrun plan`'s
 * flags ("--tp"): this thread's dt_error_detail (a static buffer), and msg in place
 * (len its buffer's size, the result cut there). */
const char *cmd_plan_detail(void);
void cmd_plan_expand(char *msg, size_t len);
/* The exit code of a failed sweep call: its message as a usage error (a config's
 * batch that does not fit: with the config's errors). */
int cmd_plan_sweep_error(const plan_ctx *c, dt_status_t st);
/* cmd_plan_help.c: the --help text (printf format: the GPU names, the link names) */
extern const char cmd_plan_help_text[];

void cmd_plan_print_text(const plan_opts *o, const plan_ctx *c, const dt_plan_row *rows,
                         int n_rows, const dt_plan_choice *ch);
void cmd_plan_print_json(const plan_opts *o, const plan_ctx *c, const dt_plan_row *rows,
                         int n_rows, const dt_plan_choice *ch);
int cmd_plan_measure(const plan_opts *o, const dt_plan_row *est);

#endif /* DT_CLI_CMD_PLAN_H */
