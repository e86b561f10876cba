/*
 * cmd_plan_lora.c - `dtrun plan`'s LoRA section (--lora-r R, --base-dtype
 * int8|fp32|bf16, --lora-targets a,b; or the config's lora section): the adapters'
 * trainable parameters and the model-state bytes per GPU the trainer allocates
 * (runtime/model/lora.h: the frozen base in its dtype, int8 linears with a 4-byte
 * scale per row; 16 bytes per adapter parameter: parameter, gradient and Adam's two
 * moments in fp32, or bf16 parameter and gradient plus the fp32 master), against
 * full fine-tuning's 16 bytes per parameter. The adapters are replicated under ddp
 * and sharded by ZeRO like any parameters. With LoRA, every row of plan's tables and
 * its recommendation is the LoRA run's (dt_plan_lora_row); the section after them
 * gives ddp's figures (one full copy).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/model/lora.h"        /* defines: dt_lora_spec, dt_lora_parse_targets */
#include "runtime/tools/plan_sweep.h" /* defines: dt_plan_lora_compute */

#include "cli/args.h" /* defines: dt_arg_int */
#include <cjson/cJSON.h>
#include "cli/cmd_plan.h"

int cmd_plan_parse_lora_flag(const char *flag, const char *val, plan_opts *o) {
    if (!strcmp(flag, "--lora-r")) {
        if (dt_arg_int(val, 1, 65536, &o->lora_r))
            return cmd_plan_usage_error("--lora-r: expected a rank from 1 to 65536, found \"%s\"", val);
        return 0;
    }
    if (!strcmp(flag, "--base-dtype")) {
        if (strcasecmp(val, "int8") && strcasecmp(val, "fp32") && strcasecmp(val, "bf16") && strcasecmp(val, "auto"))
            return cmd_plan_usage_error("--base-dtype: expected int8, fp32, bf16 or auto, found \"%s\"", val);
        o->base_dtype = val;
        return 0;
    }
    if (!strcmp(flag, "--lora-targets")) {
        o->lora_targets = val;
        return 0;
    }
    return 1;
}

int cmd_plan_setup_lora(const plan_opts *o, plan_ctx *c) {
    int cfg_lora = c->have_cfg && c->cfg.lora.r > 0;
    if (!o->lora_r && !cfg_lora) {
        if (o->base_dtype || o->lora_targets)
            return cmd_plan_usage_error("--base-dtype/--lora-targets: give --lora-r (or a config with lora.r)");
        return 0;
    }
    if (!c->have_spec) return cmd_plan_usage_error("--lora-r: needs a config (the model LoRA adapts)");
    for (int k = 0; k < o->ax.n_tps; k++)
        if (o->ax.tps[k] > 1)
            return cmd_plan_usage_error("%s: LoRA runs with data parallelism only; TP size %d cannot be planned "
                                        "with it (leave out --tp, or set tensor_parallel.size 1)",
                                        o->lora_r ? "--lora-r" : "lora.r", o->ax.tps[k]);
    for (int j = 0; j < o->ax.n_layouts; j++)
        if (o->ax.layouts[j].pp > 1)
            return cmd_plan_usage_error("%s: LoRA runs with data parallelism only; PP size %d cannot be planned "
                                        "with it (leave out --pp, or set pipeline.stages 1)",
                                        o->lora_r ? "--lora-r" : "lora.r", o->ax.layouts[j].pp);
    dt_dtype_t compute = c->sw.in.precision == DT_PLAN_PRECISION_FP32 ? DT_DTYPE_F32 : DT_DTYPE_BF16;
    dt_lora_spec ls;
    memset(&ls, 0, sizeof ls);
    ls.r = o->lora_r ? o->lora_r : (int)c->cfg.lora.r;
    ls.alpha = cfg_lora ? c->cfg.lora.alpha : 8;
    const char *targets = o->lora_targets ? o->lora_targets : c->have_cfg ? c->cfg.lora.target_modules : NULL;
    const char *bd = o->base_dtype;
    if (!bd && c->have_cfg)
        bd = c->cfg.lora.base_dtype == DT_CONFIG_LORA_BASE_INT8   ? "int8"
             : c->cfg.lora.base_dtype == DT_CONFIG_LORA_BASE_FP32 ? "fp32"
             : c->cfg.lora.base_dtype == DT_CONFIG_LORA_BASE_BF16 ? "bf16"
                                                                  : "auto";
    if (dt_plan_lora_base(bd, compute, &ls.base) != DT_STATUS_OK || dt_lora_parse_targets(&ls, targets) != DT_STATUS_OK ||
        dt_plan_lora_compute(&c->spec, &ls, compute, &c->lora) != DT_STATUS_OK)
        return cmd_plan_usage_error("%s", cmd_plan_detail());
    c->have_lora = 1;
    c->sw.lora = &c->lora;
    return 0;
}

void cmd_plan_print_lora(const plan_ctx *c) {
    if (!c->have_lora) return;
    const dt_plan_lora *pl = &c->lora;
    printf("\nLoRA r %d (alpha %g, scale %g), targets", pl->spec.r, pl->spec.alpha, pl->scale);
    for (int i = 0; i < pl->spec.n_targets; i++) printf("%s%s", i ? "," : " ", pl->spec.targets[i]);
    printf(", base %s (the tables above are this run's: the adapters trained, the base frozen):\n",
           pl->spec.base == DT_LORA_BASE_INT8 ? "int8 linears (+ fp32 scale per row)" : dt_dtype_name(pl->compute));
    printf("  trainable parameters  %.0f (%.3f%% of %.0f)\n", pl->adapter_params,
           100.0 * pl->adapter_params / pl->base_params, pl->base_params);
    printf("  frozen base           %.0f bytes (%.1f MB)\n", pl->base_bytes, pl->base_bytes / 1e6);
    printf("  adapters' state       %.0f bytes (16 per adapter parameter)\n", 16 * pl->adapter_params);
    printf("  model-state bytes     %.0f per GPU (ddp; full fine-tuning: %.0f, %.1fx more)\n", pl->state_bytes,
           pl->full_bytes, pl->full_bytes / pl->state_bytes);
}

void cmd_plan_lora_json(const plan_ctx *c, cJSON *root) {
    if (!c->have_lora) return;
    const dt_plan_lora *pl = &c->lora;
    cJSON *l = cJSON_AddObjectToObject(root, "lora");
    cJSON_AddNumberToObject(l, "r", pl->spec.r);
    cJSON_AddNumberToObject(l, "alpha", pl->spec.alpha);
    cJSON *t = cJSON_AddArrayToObject(l, "targets");
    for (int i = 0; i < pl->spec.n_targets; i++) cJSON_AddItemToArray(t, cJSON_CreateString(pl->spec.targets[i]));
    cJSON_AddStringToObject(l, "base", pl->spec.base == DT_LORA_BASE_INT8 ? "int8" : dt_dtype_name(pl->compute));
    cJSON_AddNumberToObject(l, "trainable_params", pl->adapter_params);
    cJSON_AddNumberToObject(l, "base_params", pl->base_params);
    cJSON_AddNumberToObject(l, "base_bytes", pl->base_bytes);
    cJSON_AddNumberToObject(l, "sink_bytes", pl->sink_bytes);
    cJSON_AddNumberToObject(l, "state_bytes_ddp", pl->state_bytes);
    cJSON_AddNumberToObject(l, "full_finetune_bytes", pl->full_bytes);
}
