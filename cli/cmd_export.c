/*
 * cmd_export.c - dtrun export CHECKPOINT -o OUT [--format safetensors|hf|peft]
 * [--merge] [--dtype bf16|fp32] [--max-shard-size BYTES]: a checkpoint's parameters,
 * consolidated from every shard, as one safetensors file with Hugging Face names and
 * layout (runtime/ckpt/safetensors.h), or as a Hugging Face directory that
 * transformers loads (runtime/ckpt/hf_export.h); a LoRA checkpoint's adapters as a
 * PEFT adapter, or merged into its base (runtime/ckpt/lora_export.h).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/clock.h"
#include "common/fs_safe.h"
#include "common/mem.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/hf_export.h"
#include "runtime/ckpt/lora_export.h"
#include "runtime/ckpt/safetensors.h"

static const char export_usage[] =
    "usage: dtrun export CHECKPOINT -o OUT [--format safetensors|hf|peft] [--merge] [--dtype bf16|fp32]\n"
    "                   [--max-shard-size BYTES]\n"
    "  CHECKPOINT: a step directory or a checkpoint.dir (its latest).\n"
    "  --format safetensors (default): OUT is one .safetensors file (fp32 unless --dtype).\n"
    "  --format hf: OUT is a directory transformers' from_pretrained loads: config.json,\n"
    "    generation_config.json, model.safetensors, or shards of at most --max-shard-size\n"
    "    bytes (default 5GB; suffixes KB MB GB, KiB MiB GiB) with model.safetensors.index.json;\n"
    "    --dtype defaults to the training dtype.\n"
    "  GPT models get Hugging Face GPT-2 names and layout (Conv1D weights (in, out), vocab\n"
    "  unpadded, lm_head tied to wte and not stored); llama models LlamaForCausalLM's.\n"
    "  A LoRA checkpoint (lora.r > 0): --format peft writes OUT/adapter_config.json and\n"
    "    OUT/adapter_model.safetensors (fp32) that peft's PeftModel.from_pretrained loads onto\n"
    "    the base; --format hf --merge writes the base (model.pretrained, an int8 base as\n"
    "    quantized) + alpha/r B A as a Hugging Face directory; --format safetensors the adapters.\n";

/* "5GB", "500MB", "1e6", "64KiB" -> bytes; 0 when not a size. */
static uint64_t parse_size(const char *s) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (!end || end == s || !(v > 0) || !isfinite(v)) return 0;
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0},
        {"GiB", 1073741824.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].suffix)) return (uint64_t)(v * units[i].mult);
    return 0;
}

/* A LoRA checkpoint's export (runtime/ckpt/lora_export.h); -1 when path is not one
 * (the plain export goes on), else the exit code. */
static int export_lora(const char *path, const char *out, int hf, int peft, int merge, const char *dtype,
                       uint64_t max_shard, double t0) {
    dt_ckpt_t *ck;
    if (dt_ckpt_open(path, &ck) != DT_STATUS_OK) return -1; /* the plain path reports it */
    if (!dt_ckpt_is_lora(ck)) {
        dt_ckpt_close(ck);
        if (peft || merge) {
            fprintf(stderr, "dtrun export: %s: %s needs a LoRA checkpoint (lora.r > 0)\n", path,
                    peft ? "--format peft" : "--merge");
            return DT_EXIT_USAGE;
        }
        return -1;
    }
    if (hf && !merge) {
        dt_ckpt_close(ck);
        fprintf(stderr, "dtrun export: %s is a LoRA checkpoint (adapters only): use --format peft, or --format hf "
                        "--merge for the merged model\n", path);
        return DT_EXIT_USAGE;
    }
    dt_hf_export_opts o = {.bf16 = dtype && !strcmp(dtype, "bf16"), .max_shard_bytes = max_shard};
    int n_tensors = 0, files = 0;
    uint64_t bytes = 0;
    dt_lora_export_format_t f = peft ? DT_LORA_EXPORT_PEFT : hf ? DT_LORA_EXPORT_HF_MERGE : DT_LORA_EXPORT_ADAPTERS;
    dt_status_t st = dt_lora_export(ck, out, f, &o, &n_tensors, &files, &bytes);
    int rc = DT_EXIT_OK;
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun export: %s\n", dt_error_detail());
        rc = st == DT_STATUS_UNSUPPORTED || st == DT_STATUS_INVALID ? DT_EXIT_USAGE : DT_EXIT_FAILED;
    } else {
        printf("dtrun export: wrote %s (%s): %d tensors, %.1f MB, from %s (step %lld) in %.2f s\n", out,
               peft ? "PEFT adapter" : hf ? "Hugging Face, LoRA merged" : "LoRA adapters", n_tensors, (double)bytes / 1e6, dt_ckpt_path(ck),
               (long long)dt_ckpt_step(ck), dt_now_s() - t0);
    }
    dt_ckpt_close(ck);
    return rc;
}

/* The full name out will have: its own when it exists, else its folder's joined to
 * its last part. 0 when its folder cannot be resolved (the write will say why). */
static int resolve_out(const char *out, char *full, size_t len) {
    char buf[PATH_MAX], dirpart[PATH_MAX];
    if (realpath(out, buf)) return snprintf(full, len, "%s", buf) < (int)len;
    snprintf(dirpart, sizeof dirpart, "%s", out);
    for (size_t n = strlen(dirpart); n > 1 && dirpart[n - 1] == '/'; n--) dirpart[n - 1] = '\0';
    char *slash = strrchr(dirpart, '/'), *base = slash ? slash + 1 : dirpart;
    const char *parent = slash == dirpart ? "/" : slash ? dirpart : ".";
    if (slash) *slash = '\0';
    if (!realpath(parent, buf)) return 0;
    return snprintf(full, len, "%s/%s", strcmp(buf, "/") ? buf : "", base) < (int)len;
}

/* -o must not be the checkpoint, be inside it, or hold it: the export would write
 * over (or swap away) what it is reading. 0 with the error set otherwise. */
static int output_clear_of_source(const char *src, const char *out) {
    char s[PATH_MAX], o[PATH_MAX + 8];
    if (!realpath(src, s) || !resolve_out(out, o, sizeof o)) return 1; /* the load or the write reports it */
    size_t ns = strlen(s), no = strlen(o);
    int inside = !strncmp(o, s, ns) && (o[ns] == '\0' || o[ns] == '/');
    int holds = !strncmp(s, o, no) && s[no] == '/';
    if (!inside && !holds) return 1;
    dt_error(DT_STATUS_INVALID, "-o %s %s the checkpoint %s it exports: refusing to write over its source", out,
             inside ? (o[ns] ? "is inside" : "is") : "holds", src);
    return 0;
}

int dt_cmd_export(int argc, char **argv) {
    const char *path = NULL, *out = NULL, *format = "safetensors", *dtype = NULL;
    uint64_t max_shard = 0;
    int merge = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(export_usage, stdout);
            return DT_EXIT_OK;
        } else if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--format") && i + 1 < argc) format = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
        else if (!strcmp(argv[i], "--merge")) merge = 1;
        else if ((!strcmp(argv[i], "--max-shard-size") || !strcmp(argv[i], "--max_shard_size")) && i + 1 < argc) {
            if (!(max_shard = parse_size(argv[++i]))) {
                fprintf(stderr, "dtrun export: --max-shard-size: expected a size in bytes (5GB, 500MB, 1000000), found %s\n",
                        argv[i]);
                return DT_EXIT_USAGE;
            }
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "dtrun export: unknown flag or missing value: %s\n%s", argv[i], export_usage);
            return DT_EXIT_USAGE;
        } else if (!path) path = argv[i];
        else {
            fprintf(stderr, "dtrun export: unexpected argument %s\n%s", argv[i], export_usage);
            return DT_EXIT_USAGE;
        }
    }
    if (!path || !out) {
        fprintf(stderr, "dtrun export: %s\n%s", !path ? "no CHECKPOINT given" : "no -o FILE (or DIR) given", export_usage);
        return DT_EXIT_USAGE;
    }
    int hf = !strcmp(format, "hf"), peft = !strcmp(format, "peft");
    if (!hf && !peft && strcmp(format, "safetensors")) {
        fprintf(stderr, "dtrun export: --format: expected safetensors, hf or peft, found %s\n", format);
        return DT_EXIT_USAGE;
    }
    if (merge && !hf) {
        fprintf(stderr, "dtrun export: --merge applies to --format hf (a LoRA checkpoint merged into its base)\n");
        return DT_EXIT_USAGE;
    }
    if (dtype && strcmp(dtype, "bf16") && strcmp(dtype, "fp32")) {
        fprintf(stderr, "dtrun export: --dtype: expected bf16 or fp32, found %s\n", dtype);
        return DT_EXIT_USAGE;
    }
    if (max_shard && !hf) {
        fprintf(stderr, "dtrun export: --max-shard-size applies to --format hf\n");
        return DT_EXIT_USAGE;
    }
    /* Before any work: OUT is replaced by a rename, so it must be nothing yet or
     * what the format writes (a file, or a real directory for hf), never a link,
     * a device or a FIFO. */
    if (dt_fs_check_target(out, hf || peft, "-o") != DT_STATUS_OK) {
        fprintf(stderr, "dtrun export: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    if (!output_clear_of_source(path, out)) {
        fprintf(stderr, "dtrun export: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    double t0 = dt_now_s();
    int lora_rc = export_lora(path, out, hf, peft, merge, dtype, max_shard, t0);
    if (lora_rc >= 0) return lora_rc;
    dt_ckpt_t *ck;
    dt_model_layout l;
    float *params;
    if (dt_ckpt_load_params(path, &ck, &l, &params) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun export: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    int bf16 = 0;
    if (dtype) bf16 = !strcmp(dtype, "bf16");
    else if (hf) { /* the training dtype, as the checkpoint recorded it */
        const cJSON *cd = cJSON_GetObjectItemCaseSensitive((const cJSON *)dt_ckpt_meta(ck), "compute_dtype");
        bf16 = cJSON_IsString(cd) && strstr(cd->valuestring, "bf16") != NULL;
    }
    uint64_t bytes = 0;
    int files = 1;
    dt_status_t st;
    if (hf) {
        dt_hf_export_opts o = {.bf16 = bf16, .max_shard_bytes = max_shard};
        st = dt_hf_export(&l, params, out, &o, &files, &bytes);
    } else {
        size_t b = 0;
        st = dt_safetensors_write_tensors(&l, params, out, 0, l.n_tensors, bf16, &b);
        bytes = b;
    }
    int rc = DT_EXIT_OK;
    if (st != DT_STATUS_OK) {
        fprintf(stderr, "dtrun export: %s\n", dt_error_detail());
        rc = st == DT_STATUS_UNSUPPORTED ? DT_EXIT_USAGE : DT_EXIT_FAILED;
    } else {
        printf("dtrun export: wrote %s%s: %d tensors in %d file(s), %s, %.1f MB, from %s (step %lld, saved by %d "
               "rank(s)) in %.2f s\n",
               out, hf ? " (Hugging Face)" : "", l.n_tensors, files, bf16 ? "bf16" : "fp32", (double)bytes / 1e6,
               dt_ckpt_path(ck), (long long)dt_ckpt_step(ck), dt_ckpt_world_size(ck), dt_now_s() - t0);
    }
    dt_mem_free(params);
    dt_model_layout_free(&l);
    dt_ckpt_close(ck);
    return rc;
}
