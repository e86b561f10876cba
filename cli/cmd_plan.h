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
    int strategies[DT_PLAN_STRATEGY_COUNT_], n_strategies;
    int json, measure, measure_steps;
    int highlight_strategy; /* the config's strategy, -1 none */
    int tps[MAX_TP_SIZES], n_tps; /* --tp sizes (none given: 1) */
    int tp_auto;                  /* --tp auto: every size dividing the node and the model */
    int sp;                       /* --sp: sequence parallelism */
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
} plan_ctx;

void cmd_plan_print_text(const plan_opts *o, const plan_ctx *c, const dt_plan_row *rows,
                         int n_rows, const dt_plan_choice *ch);
void cmd_plan_print_json(const plan_opts *o, const plan_ctx *c, const dt_plan_row *rows,
                         int n_rows, const dt_plan_choice *ch);
int cmd_plan_measure(const plan_opts *o, const dt_plan_row *est);

#endif /* DT_CLI_CMD_PLAN_H */
