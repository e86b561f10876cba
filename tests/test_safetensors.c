/*
 * test_safetensors.c - the export format parsed back by an independent reader
 * here: header length, JSON header (dtype, shape, data_offsets), every tensor's
 * bytes, the Conv1D transpose and the unpadded vocabulary; and the sampler
 * (same seed same tokens, top_k 1 = greedy, prompt checks).
 */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mem.h"
#include "kernels/kernels.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"
#include "runtime/ckpt/safetensors.h"
#include "runtime/model/sample.h"

static void gpt(dt_model_layout *l, int vocab, int pad) {
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = 2, .n_head = 2, .n_embd = 16, .seq_len = 8,
                       .vocab_size = vocab, .vocab_pad_multiple = pad};
    cr_assert_eq(dt_model_layout_init(&s, l), DT_STATUS_OK);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n);
    cr_assert_eq(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

Test(safetensors, parses_back_with_hf_gpt2_layout) {
    dt_model_layout l;
    gpt(&l, 200, 64); /* Vp 256: the file must hold 200 rows */
    float *p = malloc(l.n_params * sizeof(float));
    for (size_t i = 0; i < l.n_params; i++) p[i] = (float)i * 0.5f - 7.0f;
    char path[] = "/tmp/dt-st-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    size_t bytes = 0;
    cr_assert_eq(dt_safetensors_write(&l, p, path, &bytes), DT_STATUS_OK, "%s", dt_error_detail());
    size_t n;
    unsigned char *f = slurp(path, &n);
    unlink(path);
    cr_assert_eq(n, bytes);
    uint64_t hlen = 0;
    for (int b = 0; b < 8; b++) hlen |= (uint64_t)f[b] << (8 * b);
    cr_assert_lt(8 + hlen, n);
    cr_assert_eq((8 + hlen) % 8, 0, "data aligned to 8 bytes");
    char *json = strndup((char *)f + 8, hlen);
    cJSON *h = cJSON_Parse(json);
    cr_assert_not_null(h, "header is JSON");
    const unsigned char *data = f + 8 + hlen;
    size_t data_len = n - 8 - hlen, covered = 0;
    int seen = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, h) {
        if (!strcmp(t->string, "__metadata__")) continue;
        seen++;
        int i = dt_model_find(&l, t->string);
        cr_assert_geq(i, 0, "unknown tensor %s", t->string);
        const dt_tensor_info *ti = &l.tensors[i];
        cr_assert_str_eq(cJSON_GetObjectItem(t, "dtype")->valuestring, "F32");
        cJSON *shape = cJSON_GetObjectItem(t, "shape"), *off = cJSON_GetObjectItem(t, "data_offsets");
        size_t b0 = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble, b1 = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        cr_assert_leq(b1, data_len);
        size_t numel = 1;
        for (int d = 0; d < cJSON_GetArraySize(shape); d++) numel *= (size_t)cJSON_GetArrayItem(shape, d)->valuedouble;
        cr_assert_eq(b1 - b0, numel * 4, "%s: offsets and shape agree", t->string);
        covered += b1 - b0;
        const float *got = (const float *)(const void *)(data + b0);
        int conv = strstr(t->string, "c_attn.weight") || strstr(t->string, "c_proj.weight") || strstr(t->string, "c_fc.weight");
        if (!strcmp(t->string, "wte.weight")) {
            cr_assert_eq(cJSON_GetArrayItem(shape, 0)->valuedouble, 200);
            cr_assert(memcmp(got, p + ti->offset, numel * 4) == 0);
        } else if (conv) {
            int64_t rows = ti->shape[0], cols = ti->shape[1]; /* ours (out, in); file (in, out) */
            cr_assert_eq(cJSON_GetArrayItem(shape, 0)->valuedouble, (double)cols, "%s", t->string);
            cr_assert_eq(cJSON_GetArrayItem(shape, 1)->valuedouble, (double)rows, "%s", t->string);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++)
                    cr_assert_eq(got[c * rows + r], p[ti->offset + (size_t)(r * cols + c)]);
        } else {
            cr_assert_eq((size_t)cJSON_GetArraySize(shape), (size_t)ti->ndim);
            cr_assert(memcmp(got, p + ti->offset, numel * 4) == 0, "%s", t->string);
        }
    }
    cr_assert_eq(seen, l.n_tensors);
    cr_assert_eq(covered, data_len, "tensors tile the data section");
    cJSON_Delete(h);
    free(json);
    free(f);
    free(p);
    dt_model_layout_free(&l);
}

Test(safetensors, unwritable_path_is_an_error) {
    dt_model_layout l;
    gpt(&l, 64, 1);
    float *p = calloc(l.n_params, sizeof(float));
    cr_assert_neq(dt_safetensors_write(&l, p, "/nonexistent-dir/x.safetensors", NULL), DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "/nonexistent-dir/x.safetensors"), "%s", dt_error_detail());
    free(p);
    dt_model_layout_free(&l);
}

Test(safetensors, sampler_seeded_greedy_and_checked) {
    dt_model_layout l;
    gpt(&l, 64, 1);
    float *p = malloc(l.n_params * sizeof(float));
    dt_model_init_params(&l, 3, p);
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK);
    dt_net_t net;
    cr_assert_eq(dt_net_init(&net, dev, &l, 1), DT_STATUS_OK);
    dt_net_bind(&net, p, NULL);
    int32_t prompt[3] = {5, 9, 11}, a[20], b[20], g[20], k1[20];
    dt_sample_opts o = {.tokens = 20, .temperature = 1.0, .seed = 7};
    cr_assert_eq(dt_sample_generate(&net, prompt, 3, &o, a), DT_STATUS_OK);
    cr_assert_eq(dt_sample_generate(&net, prompt, 3, &o, b), DT_STATUS_OK);
    cr_assert(memcmp(a, b, sizeof a) == 0, "same seed, same tokens");
    o.seed = 8;
    cr_assert_eq(dt_sample_generate(&net, prompt, 3, &o, b), DT_STATUS_OK);
    cr_assert(memcmp(a, b, sizeof a) != 0, "another seed, other tokens");
    o.temperature = 0;
    cr_assert_eq(dt_sample_generate(&net, prompt, 3, &o, g), DT_STATUS_OK);
    o.temperature = 1.5, o.top_k = 1;
    cr_assert_eq(dt_sample_generate(&net, prompt, 3, &o, k1), DT_STATUS_OK);
    cr_assert(memcmp(g, k1, sizeof g) == 0, "top_k 1 is greedy");
    for (int i = 0; i < 20; i++) cr_assert(a[i] >= 0 && a[i] < 64);
    int32_t badp[1] = {64};
    cr_assert_eq(dt_sample_generate(&net, badp, 1, &o, a), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "outside the vocabulary"));
    dt_net_free(&net);
    dt_device_free(dev);
    free(p);
    dt_model_layout_free(&l);
}
