/*
 * cmd_plan_report.c - what `dtrun plan` prints (cmd_plan.h): the text table with
 * its recommendation, the --json document (keys in cmd_plan.c's purpose block), and
 * --measure: a short real run of the config whose memory and step time are printed
 * beside the estimate.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "common/fs.h"
#include "common/gpuinfo.h" /* defines: dt_gpu_spec_* */
#include "common/mem.h"
#include "kernels/kernels.h"
#include "runtime/config/config.h"
#include "runtime/train/metrics.h"
#include "runtime/model/model.h"
#include "runtime/layout/pp_sched.h" /* defines: dt_pp_schedule_name */
#include "runtime/tools/plan.h"

#include "cli/cmd_plan.h"

/* ---- output ------------------------------------------------------------------ */

static const char *fit_name(dt_plan_fit_t f) {
    return f == DT_PLAN_FIT_YES ? "yes" : f == DT_PLAN_FIT_CKPT ? "ckpt" : "no";
}

void cmd_plan_print_text(const plan_opts *o, const plan_ctx *c, const dt_plan_row *rows,
                       int n_rows, const dt_plan_choice *ch) {
    const dt_plan_input *in = &c->sw.in;
    printf("model:  %s\n", c->model_label);
    printf("        %.0f parameters, %.4g training FLOPs per token, micro-batch %d per GPU "
           "(accumulation per GPU count in the tables), %s\n",
           in->model.n_params, in->model.flops_per_token, in->micro_batch,
           in->precision == DT_PLAN_PRECISION_BF16 ? "bf16 mixed precision" : "fp32");
    printf("gpu:    %s, %.1f GB (%.1f GiB) per %s, %.4g TFLOP/s peak%s, MFU %.2f (assumed), "
           "%.0f%% of memory reserved\n",
           c->gpu_label, in->mem_bytes / 1e9, in->mem_bytes / 1073741824.0,
           in->mem_shared ? "host, shared by its ranks" : "GPU", in->peak_flops / 1e12,
           in->mem_shared ? " per rank (sgemm at the rank's threads, measured)" : "", in->mfu,
           100 * in->reserve);
    printf("links:  within a node %s %.4g GB/s α %.0f µs; across nodes %s %.4g GB/s α %.0f µs;",
           in->intra.name, in->intra.gbps, in->intra.alpha_us, in->inter.name, in->inter.gbps,
           in->inter.alpha_us);
    if (in->gpus_per_node > 0) printf(" %d GPUs per node\n", in->gpus_per_node);
    else printf(" all ranks on one host\n");
    printf("work:   %s%s\n", c->work_label, in->price > 0 ? "" : "; no --price: cost not shown");
    if (o->ax.n_tps > 1 || o->ax.tps[0] > 1) {
        char sizes[128] = "";
        size_t off = 0;
        for (int k = 0; k < o->ax.n_tps && off < sizeof sizes; k++)
            off += (size_t)snprintf(sizes + off, sizeof sizes - off, "%s%d", k ? "," : "", o->ax.tps[k]);
        printf("tp:     sizes %s%s, sequence parallelism %s; a TP group is consecutive GPUs of one node, its "
               "collectives on the %s link (tp-comm, all exposed); data parallelism over GPUs/TP\n",
               sizes, o->ax.tp_auto ? " (auto)" : "", o->ax.sp ? "on" : "off", in->intra.name);
    }
    int have_pp = 0, have_cp = 0;
    for (int i = 0; i < n_rows; i++) have_pp |= rows[i].pp > 1, have_cp |= rows[i].cp > 1;
    if (have_cp) {
        char sizes[128] = "";
        size_t off = 0;
        for (int k = 0; k < o->ax.n_cps && off < sizeof sizes; k++)
            off += (size_t)snprintf(sizes + off, sizeof sizes - off, "%s%d", k ? "," : "", o->ax.cps[k]);
        printf("cp:     context-parallel sizes %s: each rank holds seq/CP positions of every sequence (acts per "
               "rank), ring attention passes key/value blocks around the CP group (TP apart); ring-MB: what a rank "
               "sends per step, ring-exp: its exposed ms (the forward's blocks overlap compute, the backward's "
               "gradients do not); world = TP x CP x PP x DP\n",
               sizes);
    }
    if (have_pp)
        printf("pp:     pipeline layouts TP x PP x DP (TP innermost in a node, then PP, then DP); %d micro-batches per "
               "step in the first row; memory is the worst stage's (stg), time the slowest stage's with the "
               "schedule's bubble; p2p: what a stage sends per step, one message per stage boundary exposed\n",
               in->accum);
    /* GB unless every figure is below 1 GB (small models): then MB */
    double most = 0;
    for (int i = 0; i < n_rows; i++) most = fmax(most, rows[i].total);
    double unit = most < 1e9 ? 1e6 : 1e9;
    printf("\nMemory per %s in %s; times per optimizer step in ms (comm: all of it, exposed: "
           "the part not overlapped with compute); fits: yes, ckpt (only with activation "
           "checkpointing), no.\n",
           in->mem_shared ? "rank" : "GPU", unit == 1e9 ? "GB (1e9 bytes)" : "MB (1e6 bytes)");
    int cur = -1;
    for (int i = 0; i < n_rows; i++) {
        const dt_plan_row *r = &rows[i];
        if ((int)r->strategy != cur) {
            cur = (int)r->strategy;
            printf("\n%s%s\n", dt_strategy_label(r->strategy),
                   cur == o->highlight_strategy ? "  <- the config's strategy" : "");
            if (have_pp) printf("%3s %3s %-11s %3s ", "PP", "V", "schedule", "stg");
            printf("%5s %3s ", "GPUs", "TP");
            if (have_cp) printf("%3s ", "CP");
            printf("%5s %5s | %8s %8s %8s %8s %8s %7s | %8s %8s %4s | %9s %9s %8s %9s %9s | %6s | "
                   "%10s %9s %10s",
                   "nodes", "accum", "params", "grads", "optim", "acts", "acts-ck", "comm",
                   "total", "total-ck", "fits", "compute", "comm", "tp-comm", "exposed", "step", "eff",
                   "tokens/s", "hours", "cost");
            if (have_pp) printf(" | %9s %7s %9s %9s", "bubble", "ideal", "p2p-MB", "p2p-exp");
            if (have_cp) printf(" | %9s %9s", "ring-MB", "ring-exp");
            printf("\n");
        }
        char hours[32] = "-", cost[32] = "-";
        if (r->hours > 0 && r->fit != DT_PLAN_FIT_NO) snprintf(hours, sizeof hours, "%.2f", r->hours);
        if (r->cost > 0 && r->fit != DT_PLAN_FIT_NO) snprintf(cost, sizeof cost, "%.2f", r->cost);
        int mark = ch->cheapest == i || ch->fastest == i;
        if (have_pp)
            printf("%3d %3d %-11s %3d ", r->pp, r->virtual_stages,
                   r->pp > 1 ? dt_pp_schedule_name((dt_pp_schedule_t)r->schedule) : "-", r->worst_stage);
        printf("%5d %3d ", r->n_gpus, r->tp);
        if (have_cp) printf("%3d ", r->cp > 1 ? r->cp : 1);
        printf("%5d %5d | %8.2f %8.2f %8.2f %8.2f %8.2f %7.3f | %8.2f %8.2f %4s | %9.2f %9.2f "
               "%8.2f %9.2f %9.2f | %5.1f%% | %10.0f %9s %10s%s",
               r->n_nodes, r->accum, r->params / unit, r->grads / unit,
               r->optim / unit, r->acts / unit, r->acts_ckpt / unit, r->comm_buf / unit,
               r->total / unit, r->total_ckpt / unit, fit_name(r->fit), 1e3 * r->compute_s, 1e3 * r->comm_s,
               1e3 * r->tp_comm_s, 1e3 * r->exposed_s, 1e3 * r->step_s, 100 * r->efficiency, r->tokens_per_s, hours,
               cost, "");
        if (have_pp)
            printf(" | %9.2f %6.1f%% %9.1f %9.3f", 1e3 * r->bubble_s, 100 * r->bubble_ideal, r->p2p_bytes / 1e6,
                   1e3 * r->p2p_exposed_s);
        if (have_cp) printf(" | %9.1f %9.3f", r->cp_bytes / 1e6, 1e3 * r->cp_exposed_s);
        printf("%s\n", mark ? (ch->cheapest == i && ch->fastest == i ? "  <- cheapest, fastest"
                               : ch->cheapest == i                    ? "  <- cheapest"
                                                                      : "  <- fastest")
                            : "");
    }
    if (c->have_lora) printf("\nRecommendation (LoRA r %d: the adapters trained, the base frozen)", c->lora.spec.r);
    else printf("\nRecommendation");
    printf("\n  cheapest: %s\n  fastest:  %s\n", ch->cheapest_reason,
           ch->fastest_reason);
    if (ch->tp_reason[0]) printf("  TP:       %s\n", ch->tp_reason);
    if (ch->cp_reason[0]) printf("  CP:       %s\n", ch->cp_reason);
    if (c->sw.n_stages) {
        const dt_plan_row *b = &rows[ch->cheapest];
        printf("\nStages of the cheapest plan (%s, %d micro-batches per step, partition %s; ideal bubble %.1f%%, "
               "planned %.1f ms of %.1f ms per step; p2p %.1f MB sent per stage per step on the %s link)\n",
               dt_pp_schedule_name((dt_pp_schedule_t)b->schedule), b->accum,
               dt_pp_partition_name((dt_pp_partition_t)(o->ax.partition >= 0 ? o->ax.partition : 0)),
               100 * b->bubble_ideal, 1e3 * b->bubble_s, 1e3 * b->step_s, b->p2p_bytes / 1e6,
               b->p2p_inter ? in->inter.name : in->intra.name);
        printf("%5s  %-16s %12s %14s %6s %10s %10s %10s %10s\n", "stage", "layers", "params", "FLOPs/token",
               "arenas", "states GB", "acts GB", "total GB", "busy ms");
        for (int s = 0; s < c->sw.n_stages; s++) {
            const dt_plan_stage *st = &c->sw.stages[s];
            const dt_plan_row *sr = &c->sw.stage_rows[s];
            char layers[64] = "";
            size_t off = 0;
            for (int j = 0; j < st->n_chunks && off < sizeof layers; j++)
                off += (size_t)snprintf(layers + off, sizeof layers - off, "%s%d-%d", j ? "," : "", st->chunk_l0[j],
                                        st->chunk_l1[j] - 1);
            printf("%5d%s %-16s %12.4g %14.4g %6d %10.2f %10.2f %10.2f %10.2f%s%s\n", s,
                   st->first && st->last ? "*" : st->first ? "e" : st->last ? "h" : " ", layers, st->n_params,
                   st->flops_per_token, sr->arenas, (sr->params + sr->grads + sr->optim) / 1e9,
                   (b->fit == DT_PLAN_FIT_CKPT ? sr->acts_ckpt : sr->acts) / 1e9,
                   (b->fit == DT_PLAN_FIT_CKPT ? sr->total_ckpt : sr->total) / 1e9, 1e3 * sr->compute_s,
                   s == b->worst_stage ? "  <- most memory" : "", s == b->slowest_stage ? "  <- slowest" : "");
        }
        printf("  (e: holds the embedding, h: the final norm, head and loss%s; params of TP rank 0)\n",
               c->sw.stages[c->sw.n_stages - 1].tied_copy > 0 ? " and a copy of the tied embedding (param + grad)" : "");
    }
}

static cJSON *row_json(const dt_plan_row *r) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "strategy", dt_strategy_label(r->strategy));
    cJSON_AddNumberToObject(j, "gpus", r->n_gpus);
    cJSON_AddNumberToObject(j, "nodes", r->n_nodes);
    cJSON_AddNumberToObject(j, "shard", r->shard);
    cJSON_AddNumberToObject(j, "tp", r->tp);
    cJSON_AddNumberToObject(j, "cp", r->cp > 1 ? r->cp : 1);
    cJSON_AddNumberToObject(j, "dp", r->dp);
    cJSON_AddNumberToObject(j, "pp", r->pp);
    cJSON_AddNumberToObject(j, "virtual_stages", r->virtual_stages);
    cJSON *ring = cJSON_AddObjectToObject(j, "ring");
    cJSON_AddNumberToObject(ring, "bytes", r->cp_bytes);
    cJSON_AddNumberToObject(ring, "s", r->cp_s);
    cJSON_AddNumberToObject(ring, "exposed_s", r->cp_exposed_s);
    cJSON_AddBoolToObject(ring, "inter_node", r->cp_inter);
    cJSON_AddStringToObject(j, "schedule", r->pp > 1 ? dt_pp_schedule_name((dt_pp_schedule_t)r->schedule) : "none");
    cJSON_AddNumberToObject(j, "worst_stage", r->worst_stage);
    cJSON_AddNumberToObject(j, "slowest_stage", r->slowest_stage);
    cJSON_AddNumberToObject(j, "arenas", r->pp > 1 ? r->arenas : 1);
    cJSON *pp = cJSON_AddObjectToObject(j, "pipeline");
    cJSON_AddNumberToObject(pp, "bubble_s", r->bubble_s);
    cJSON_AddNumberToObject(pp, "bubble_ideal", r->bubble_ideal);
    cJSON_AddNumberToObject(pp, "p2p_bytes", r->p2p_bytes);
    cJSON_AddNumberToObject(pp, "p2p_s", r->p2p_s);
    cJSON_AddNumberToObject(pp, "p2p_exposed_s", r->p2p_exposed_s);
    cJSON_AddBoolToObject(pp, "p2p_inter_node", r->p2p_inter);
    cJSON_AddNumberToObject(j, "micro_batch", r->micro_batch);
    cJSON_AddNumberToObject(j, "accum", r->accum);
    cJSON *m = cJSON_AddObjectToObject(j, "memory_bytes");
    cJSON_AddNumberToObject(m, "params", r->params);
    cJSON_AddNumberToObject(m, "grads", r->grads);
    cJSON_AddNumberToObject(m, "optim", r->optim);
    cJSON_AddNumberToObject(m, "model_states", r->params + r->grads + r->optim);
    cJSON_AddNumberToObject(m, "activations", r->acts);
    cJSON_AddNumberToObject(m, "activations_ckpt", r->acts_ckpt);
    cJSON_AddNumberToObject(m, "comm_buffers", r->comm_buf);
    cJSON_AddNumberToObject(m, "total", r->total);
    cJSON_AddNumberToObject(m, "total_ckpt", r->total_ckpt);
    cJSON_AddNumberToObject(m, "usable", r->usable);
    cJSON_AddStringToObject(j, "fits", fit_name(r->fit));
    cJSON *t = cJSON_AddObjectToObject(j, "step_s");
    cJSON_AddNumberToObject(t, "compute", r->compute_s);
    cJSON_AddNumberToObject(t, "comm", r->comm_s);
    cJSON_AddNumberToObject(t, "overlapped", r->overlapped_s);
    cJSON_AddNumberToObject(t, "exposed", r->exposed_s);
    cJSON_AddNumberToObject(t, "tp_comm", r->tp_comm_s);
    cJSON_AddNumberToObject(t, "total", r->step_s);
    cJSON_AddNumberToObject(j, "collectives", r->n_collectives);
    cJSON_AddNumberToObject(j, "efficiency", r->efficiency);
    cJSON_AddNumberToObject(j, "tokens_per_s", r->tokens_per_s);
    if (r->hours > 0) cJSON_AddNumberToObject(j, "hours", r->hours);
    else cJSON_AddNullToObject(j, "hours");
    if (r->cost > 0) cJSON_AddNumberToObject(j, "cost", r->cost);
    else cJSON_AddNullToObject(j, "cost");
    return j;
}

static cJSON *choice_json(const dt_plan_row *rows, int idx, const char *reason) {
    cJSON *j = cJSON_CreateObject();
    if (idx >= 0) {
        cJSON_AddStringToObject(j, "strategy", dt_strategy_label(rows[idx].strategy));
        cJSON_AddNumberToObject(j, "gpus", rows[idx].n_gpus);
        cJSON_AddNumberToObject(j, "tp", rows[idx].tp);
        cJSON_AddNumberToObject(j, "cp", rows[idx].cp > 1 ? rows[idx].cp : 1);
        cJSON_AddNumberToObject(j, "pp", rows[idx].pp);
        cJSON_AddNumberToObject(j, "dp", rows[idx].dp);
        cJSON_AddNumberToObject(j, "row", idx);
    } else {
        cJSON_AddNullToObject(j, "strategy");
        cJSON_AddNullToObject(j, "gpus");
        cJSON_AddNullToObject(j, "tp");
        cJSON_AddNullToObject(j, "cp");
        cJSON_AddNullToObject(j, "row");
    }
    cJSON_AddStringToObject(j, "reason", reason);
    return j;
}

void cmd_plan_print_json(const plan_opts *o, const plan_ctx *c, const dt_plan_row *rows,
                       int n_rows, const dt_plan_choice *ch) {
    const dt_plan_input *in = &c->sw.in;
    cJSON *root = cJSON_CreateObject();
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "source", o->config ? o->config : "flags");
    cJSON_AddStringToObject(m, "type", in->model.type);
    cJSON_AddNumberToObject(m, "params", in->model.n_params);
    cJSON_AddNumberToObject(m, "params_unpadded", in->model.n_params_unpadded);
    cJSON_AddNumberToObject(m, "flops_per_token", in->model.flops_per_token);
    cJSON_AddNumberToObject(m, "micro_batch", in->micro_batch);
    cJSON_AddNumberToObject(m, "accum", in->accum);
    cJSON_AddNumberToObject(m, "seq_len", in->model.seq_len);
    cJSON_AddStringToObject(m, "precision",
                            in->precision == DT_PLAN_PRECISION_BF16 ? "bf16" : "fp32");
    if (o->highlight_strategy >= 0)
        cJSON_AddStringToObject(m, "strategy", dt_strategy_label(o->highlight_strategy));
    cJSON *tps = cJSON_AddArrayToObject(m, "tp_sizes");
    for (int k = 0; k < o->ax.n_tps; k++) cJSON_AddItemToArray(tps, cJSON_CreateNumber(o->ax.tps[k]));
    cJSON *cps = cJSON_AddArrayToObject(m, "cp_sizes");
    for (int k = 0; k < o->ax.n_cps; k++) cJSON_AddItemToArray(cps, cJSON_CreateNumber(o->ax.cps[k]));
    cJSON_AddBoolToObject(m, "sequence_parallel", o->ax.sp);
    cJSON *g = cJSON_AddObjectToObject(root, "gpu");
    cJSON_AddStringToObject(g, "name", c->gpu_label);
    cJSON_AddNumberToObject(g, "mem_bytes", in->mem_bytes);
    cJSON_AddBoolToObject(g, "mem_shared", in->mem_shared);
    cJSON_AddNumberToObject(g, "peak_flops", in->peak_flops);
    cJSON_AddNumberToObject(g, "mfu", in->mfu);
    cJSON_AddNumberToObject(g, "reserve", in->reserve);
    cJSON *l = cJSON_AddObjectToObject(root, "links");
    const dt_plan_link *ls[2] = {&in->intra, &in->inter};
    const char *keys[2] = {"intra", "inter"};
    for (int i = 0; i < 2; i++) {
        cJSON *x = cJSON_AddObjectToObject(l, keys[i]);
        cJSON_AddStringToObject(x, "name", ls[i]->name);
        cJSON_AddNumberToObject(x, "bytes_per_s", ls[i]->gbps * 1e9);
        cJSON_AddNumberToObject(x, "alpha_s", ls[i]->alpha_us * 1e-6);
    }
    cJSON_AddNumberToObject(l, "gpus_per_node", in->gpus_per_node);
    cJSON *w = cJSON_AddObjectToObject(root, "work");
    if (in->hours_1gpu > 0) cJSON_AddNumberToObject(w, "hours_1gpu", in->hours_1gpu);
    else cJSON_AddNullToObject(w, "hours_1gpu");
    if (o->tokens > 0) cJSON_AddNumberToObject(w, "tokens", o->tokens);
    else cJSON_AddNullToObject(w, "tokens");
    if (in->price > 0) cJSON_AddNumberToObject(w, "price", in->price);
    else cJSON_AddNullToObject(w, "price");
    cmd_plan_lora_json(c, root);
    cJSON *arr = cJSON_AddArrayToObject(root, "rows");
    for (int i = 0; i < n_rows; i++) cJSON_AddItemToArray(arr, row_json(&rows[i]));
    cJSON *r = cJSON_AddObjectToObject(root, "recommendation");
    cJSON_AddItemToObject(r, "cheapest", choice_json(rows, ch->cheapest, ch->cheapest_reason));
    cJSON_AddItemToObject(r, "fastest", choice_json(rows, ch->fastest, ch->fastest_reason));
    cJSON *stages = cJSON_AddArrayToObject(r, "stages"); /* the cheapest plan's, when a pipeline */
    for (int s = 0; s < c->sw.n_stages; s++) {
        const dt_plan_stage *st = &c->sw.stages[s];
        const dt_plan_row *sr = &c->sw.stage_rows[s];
        cJSON *x = cJSON_CreateObject();
        cJSON *ch_ = cJSON_AddArrayToObject(x, "layers");
        for (int q = 0; q < st->n_chunks; q++) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(st->chunk_l0[q]));
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(st->chunk_l1[q]));
            cJSON_AddItemToArray(ch_, pair);
        }
        cJSON_AddNumberToObject(x, "params", st->n_params);
        cJSON_AddNumberToObject(x, "tied_copy", st->tied_copy);
        cJSON_AddNumberToObject(x, "flops_per_token", st->flops_per_token);
        cJSON_AddNumberToObject(x, "arenas", sr->arenas);
        cJSON_AddNumberToObject(x, "model_states", sr->params + sr->grads + sr->optim);
        cJSON_AddNumberToObject(x, "activations", sr->acts);
        cJSON_AddNumberToObject(x, "activations_ckpt", sr->acts_ckpt);
        cJSON_AddNumberToObject(x, "total", sr->total);
        cJSON_AddNumberToObject(x, "total_ckpt", sr->total_ckpt);
        cJSON_AddNumberToObject(x, "compute_s", sr->compute_s);
        cJSON_AddItemToArray(stages, x);
    }
    cJSON_AddStringToObject(r, "tp", ch->tp_reason);
    cJSON_AddStringToObject(r, "cp", ch->cp_reason);
    char *text = cJSON_Print(root);
    if (text) puts(text);
    free(text);
    cJSON_Delete(root);
}

/* ---- --measure ------------------------------------------------------------------ */

/* The file's text, or NULL (a missing or unreadable file is reported by what is
 * then missing from it). */
static char *read_text(const char *path) {
    char *text = NULL;
    return dt_fs_read_file(path, (size_t)64 << 20, &text, NULL) == DT_STATUS_OK ? text : NULL;
}

static double pct_err(double measured, double est) {
    return est != 0 ? 100.0 * (measured - est) / est : NAN;
}

/* Runs `dtrun --standalone --nproc_per_node N CONFIG [overrides] train_steps=K
 * log.dir=TMP ...` (for one rank `dtrun __worker CONFIG ...` with RANK=0
 * WORLD_SIZE=1, what the agent would exec) and prints measured against
 * estimated. Returns an exit code. */
int cmd_plan_measure(const plan_opts *o, const dt_plan_row *est) {
    char exe[4096];
    /* DTRUN_PLAN_MEASURE_EXE replaces the binary (tests use a stand-in trainer) */
    const char *env_exe = getenv("DTRUN_PLAN_MEASURE_EXE");
    if (env_exe && *env_exe) {
        snprintf(exe, sizeof exe, "%s", env_exe);
    } else {
        if (dt_fs_self_exe(exe, sizeof exe) != DT_STATUS_OK) {
            fprintf(stderr, "dtrun plan: --measure: %s\n", dt_error_detail());
            return DT_EXIT_FAILED;
        }
    }
    const char *tmp = getenv("TMPDIR"); /* as mktemp(1) */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/dtrun-plan-measure.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "dtrun plan: --measure: cannot create a temporary directory: %s\n",
                strerror(errno));
        return DT_EXIT_FAILED;
    }
    char nproc[16], steps[48], logdir[1100];
    snprintf(nproc, sizeof nproc, "%d", est->n_gpus);
    snprintf(steps, sizeof steps, "train_steps=%d", o->measure_steps);
    snprintf(logdir, sizeof logdir, "log.dir=%s", dir);
    /* One rank needs no launcher: run the worker as the agent would exec it. */
    int one = est->n_gpus == 1;
    const char *args[MAX_OVERRIDES + 16];
    int k = 0;
    args[k++] = exe;
    if (one) {
        args[k++] = "__worker";
    } else {
        args[k++] = "--standalone";
        args[k++] = "--nproc_per_node";
        args[k++] = nproc;
    }
    args[k++] = o->config;
    for (int i = 0; i < o->n_overrides; i++) args[k++] = o->overrides[i];
    args[k++] = steps;
    args[k++] = logdir;
    args[k++] = "steps_per_print=1";
    args[k++] = "checkpoint.every_steps=0";
    args[k++] = "eval.every_steps=0";
    args[k++] = NULL;
    fprintf(stderr, "dtrun plan: measuring: %s %s%s %s ... %s %s\n", exe,
            one ? "__worker" : "--standalone --nproc_per_node ", one ? "" : nproc, o->config,
            steps, logdir);
    fflush(NULL);
    int rc = DT_EXIT_FAILED;
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "dtrun plan: --measure: fork failed: %s\n", strerror(errno));
        goto out_remove_dir;
    }
    if (pid == 0) {
        dup2(STDERR_FILENO, STDOUT_FILENO); /* the run's lines go to stderr, ours to stdout */
        if (one) { /* torchrun's environment of a single rank */
            setenv("RANK", "0", 1);
            setenv("WORLD_SIZE", "1", 1);
            setenv("LOCAL_RANK", "0", 1);
            setenv("LOCAL_WORLD_SIZE", "1", 1);
        }
        execv(exe, (char *const *)args);
        fprintf(stderr, "dtrun plan: --measure: cannot run %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "dtrun plan: --measure: the measuring run failed (%s %d); see its "
                        "error above\n",
                WIFEXITED(status) ? "exit code" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        goto out_remove_dir;
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/summary.json", dir);
    char *text = read_text(path);
    cJSON *sum = text ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *ranks = sum ? cJSON_GetObjectItem(sum, "ranks") : NULL;
    double states = 0, peak = 0;
    int nr = 0;
    cJSON *rk;
    cJSON_ArrayForEach(rk, ranks) {
        cJSON *msb = cJSON_GetObjectItem(rk, "model_state_bytes");
        cJSON *tot = msb ? cJSON_GetObjectItem(msb, "total") : NULL;
        cJSON *pk = cJSON_GetObjectItem(rk, "peak_bytes");
        if (cJSON_IsNumber(tot) && tot->valuedouble > states) states = tot->valuedouble;
        if (cJSON_IsNumber(pk) && pk->valuedouble > peak) peak = pk->valuedouble;
        nr++;
    }
    cJSON_Delete(sum);
    if (!nr) {
        fprintf(stderr, "dtrun plan: --measure: %s has no ranks[] with model_state_bytes.total "
                        "and peak_bytes\n",
                path);
        goto out_remove_dir;
    }
    /* step time: mean step_ms of metrics.jsonl lines after the first (warm-up) */
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    text = read_text(path);
    double sum_ms = 0, first_ms = NAN;
    int n_ms = 0;
    for (char *save = NULL, *line = text ? strtok_r(text, "\n", &save) : NULL; line;
         line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        cJSON *ms = j ? cJSON_GetObjectItem(j, "step_ms") : NULL;
        if (cJSON_IsNumber(ms)) {
            if (isnan(first_ms)) first_ms = ms->valuedouble;
            else {
                sum_ms += ms->valuedouble;
                n_ms++;
            }
        }
        cJSON_Delete(j);
    }
    free(text);
    double step_ms = n_ms ? sum_ms / n_ms : first_ms;
    double est_total = est->fit == DT_PLAN_FIT_CKPT ? est->total_ckpt : est->total;
    printf("\nMeasured (%s on %d rank%s, %d steps) against the plan:\n",
           dt_strategy_label(est->strategy), est->n_gpus, est->n_gpus > 1 ? "s" : "",
           o->measure_steps);
    printf("  %-26s %14s %14s %8s\n", "", "measured", "estimated", "error");
    printf("  %-26s %14.0f %14.0f %7.1f%%\n", "model-state bytes per rank", states,
           est->params + est->grads + est->optim,
           pct_err(states, est->params + est->grads + est->optim));
    printf("  %-26s %14.0f %14.0f %7.1f%%\n", "peak bytes per rank", peak, est_total,
           pct_err(peak, est_total));
    printf("  %-26s %14.2f %14.2f %7.1f%%\n", "step ms", step_ms, 1e3 * est->step_s,
           pct_err(step_ms, 1e3 * est->step_s));
    rc = DT_EXIT_OK;
out_remove_dir:
    dt_fs_rm_rf(dir);
    return rc;
}
