/*
 * cmd_export.c - dtrun export CHECKPOINT -o FILE.safetensors: a checkpoint's
 * parameters, consolidated from every shard, as one safetensors file with Hugging
 * Face GPT-2 names and layout (runtime/ckpt/safetensors.h).
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "common/clock.h"
#include "common/mem.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/safetensors.h"

static const char export_usage[] =
    "usage: dtrun export CHECKPOINT -o FILE.safetensors\n"
    "  CHECKPOINT: a step directory or a checkpoint.dir (its latest).\n"
    "  GPT models get Hugging Face GPT-2 names and layout (Conv1D weights (in, out), vocab\n"
    "  unpadded, lm_head tied to wte and not stored).\n";

int dt_cmd_export(int argc, char **argv) {
    const char *path = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(export_usage, stdout);
            return DT_EXIT_OK;
        } else if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) out = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(stderr, "dtrun export: unknown flag or missing value: %s\n%s", argv[i], export_usage);
            return DT_EXIT_USAGE;
        } else if (!path) path = argv[i];
        else {
            fprintf(stderr, "dtrun export: unexpected argument %s\n%s", argv[i], export_usage);
            return DT_EXIT_USAGE;
        }
    }
    if (!path || !out) {
        fprintf(stderr, "dtrun export: %s\n%s", !path ? "no CHECKPOINT given" : "no -o FILE given", export_usage);
        return DT_EXIT_USAGE;
    }
    double t0 = dt_now_s();
    dt_ckpt_t *ck;
    dt_model_layout l;
    float *params;
    if (dt_ckpt_load_params(path, &ck, &l, &params) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun export: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    size_t bytes = 0;
    dt_status_t st = dt_safetensors_write(&l, params, out, &bytes);
    if (st != DT_STATUS_OK) fprintf(stderr, "dtrun export: %s\n", dt_error_detail());
    else
        printf("dtrun export: wrote %s: %d tensors, %.1f MB, from %s (step %lld, saved by %d rank(s)) in %.2f s\n", out,
               l.n_tensors, (double)bytes / 1e6, dt_ckpt_path(ck), (long long)dt_ckpt_step(ck), dt_ckpt_world_size(ck),
               dt_now_s() - t0);
    dt_mem_free(params);
    dt_model_layout_free(&l);
    dt_ckpt_close(ck);
    return st == DT_STATUS_OK ? DT_EXIT_OK : DT_EXIT_FAILED;
}
