/*
 * test_checkpoint_meta.c - the integers of a checkpoint's meta.json are checked
 * before use: a real checkpoint is saved in a temporary directory, one field of its
 * meta.json is replaced by a value out of its range (2^40 ranks, 2^31 layers, a
 * negative offset, 1e309, a string, a fraction), and opening it (or reading its
 * model) must fail with an error naming meta.json, the field and the value - never
 * succeed with a truncated number (2^40 ranks read as 0, 2^31 layers as negative).
 */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/model/model.h"

static char top[64], step_dir[160], meta_path[200];

static void save_one(void) {
    strcpy(top, "/tmp/dt-ckmeta-XXXXXX");
    cr_assert_not_null(mkdtemp(top));
    dt_model_spec s = {.ops = &dt_model_gpt, .n_layer = 1, .n_head = 2, .n_embd = 32, .seq_len = 16,
                       .vocab_size = 256, .vocab_pad_multiple = 64};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    float *p = calloc(l.n_params, sizeof *p);
    for (size_t i = 0; i < l.n_params; i++) p[i] = (float)i * 0.001f;
    dt_ckpt_range r = {.buffer = "params", .offset = 0, .count = l.n_params, .data = p};
    dt_ckpt_save_args a = {.dir = top, .step = 7, .world_size = 1, .layout = &l, .ranges = &r, .n_ranges = 1};
    cr_assert_eq(dt_ckpt_save(&a, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    free(p);
    dt_model_layout_free(&l);
    snprintf(step_dir, sizeof step_dir, "%s/step_00000007", top);
    snprintf(meta_path, sizeof meta_path, "%s/meta.json", step_dir);
}

static void rm_top(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", top);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(ckpt_meta, .init = save_one, .fini = rm_top, .timeout = 30);

/* Replaces the member at path (keys separated by '/', a number for a list index)
 * by the JSON text `raw`, written as is (1e309 survives: cJSON would print null). */
static void set_raw(const char *path, const char *raw) {
    FILE *f = fopen(meta_path, "r");
    cr_assert_not_null(f);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    cJSON *m = cJSON_Parse(text), *o = m;
    cr_assert_not_null(m);
    char buf[128], *save, *last = NULL;
    snprintf(buf, sizeof buf, "%s", path);
    cJSON *parent = NULL;
    for (char *k = strtok_r(buf, "/", &save); k; k = strtok_r(NULL, "/", &save)) {
        parent = o;
        last = k;
        o = cJSON_IsArray(o) ? cJSON_GetArrayItem(o, atoi(k)) : cJSON_GetObjectItemCaseSensitive(o, k);
        cr_assert_not_null(o, "no %s in meta.json", path);
    }
    cJSON *mark = cJSON_CreateString("@RAW@");
    if (cJSON_IsArray(parent)) cJSON_ReplaceItemInArray(parent, atoi(last), mark);
    else cJSON_ReplaceItemInObjectCaseSensitive(parent, last, mark);
    char *out = cJSON_Print(m), *at = strstr(out, "\"@RAW@\"");
    cr_assert_not_null(at);
    f = fopen(meta_path, "w");
    fprintf(f, "%.*s%s%s", (int)(at - out), out, raw, at + 7);
    fclose(f);
    free(out);
    cJSON_Delete(m);
}

/* Opening fails, the error naming meta.json and each of the words. */
static void open_fails_naming(const char *w1, const char *w2) {
    dt_ckpt_t *c = NULL;
    dt_status_t st = dt_ckpt_open(top, &c);
    if (st == DT_STATUS_OK) {
        int ws = dt_ckpt_world_size(c);
        long long step = (long long)dt_ckpt_step(c);
        dt_ckpt_close(c);
        cr_assert_fail("opened: world_size %d, step %lld", ws, step);
    }
    const char *d = dt_error_detail();
    cr_assert(strstr(d, "meta.json") && strstr(d, w1) && strstr(d, w2), "error: %s", d);
}

Test(ckpt_meta, unchanged_checkpoint_opens) {
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(top, &c), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_ckpt_world_size(c), 1);
    cr_assert_eq(dt_ckpt_step(c), 7);
    dt_model_spec s;
    cr_assert_eq(dt_ckpt_model_spec(c, &s), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(s.n_layer, 1);
    dt_ckpt_close(c);
}

Test(ckpt_meta, world_size_2_40_refused_not_zero) {
    set_raw("world_size", "1099511627776");
    open_fails_naming("'world_size'", "1099511627776");
}

Test(ckpt_meta, world_size_1e309_refused) {
    set_raw("world_size", "1e309");
    open_fails_naming("'world_size'", "not finite");
}

Test(ckpt_meta, step_string_refused) {
    set_raw("step", "\"12\"");
    open_fails_naming("'step'", "\"12\"");
}

Test(ckpt_meta, step_fraction_refused) {
    set_raw("step", "7.5");
    open_fails_naming("'step'", "7.5");
}

Test(ckpt_meta, negative_range_offset_refused) {
    set_raw("shards/0/ranges/0/offset", "-5");
    open_fails_naming("'shards[0].ranges[0].offset'", "-5");
}

Test(ckpt_meta, shard_bytes_1e309_refused) {
    set_raw("shards/0/bytes", "1e309");
    open_fails_naming("'shards[0].bytes'", "not finite");
}

Test(ckpt_meta, crc_out_of_range_refused) {
    set_raw("shards/0/ranges/0/crc32c/0", "4294967296");
    open_fails_naming("'shards[0].ranges[0].crc32c[0]'", "4294967296");
}

/* n_layer 2^31 cast to int is negative: the model key's own bounds (1 to 1024)
 * refuse it while reading the spec, naming the key. */
Test(ckpt_meta, n_layer_2_31_refused_not_negative) {
    set_raw("model/n_layer", "2147483648");
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(top, &c), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_spec s;
    dt_status_t st = dt_ckpt_model_spec(c, &s);
    int n_layer = s.n_layer;
    dt_ckpt_close(c);
    cr_assert_neq(st, DT_STATUS_OK, "read n_layer as %d", n_layer);
    const char *d = dt_error_detail();
    cr_assert(strstr(d, "meta.json") && strstr(d, "model.n_layer") && strstr(d, "2147483648"), "error: %s", d);
}

Test(ckpt_meta, float_key_1e309_refused) {
    set_raw("model/n_embd", "1e309");
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(top, &c), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_spec s;
    dt_status_t st = dt_ckpt_model_spec(c, &s);
    dt_ckpt_close(c);
    cr_assert_neq(st, DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "model.n_embd") && strstr(dt_error_detail(), "not finite"), "%s",
              dt_error_detail());
}

Test(ckpt_meta, tensor_shape_string_refused) {
    set_raw("tensors/0/shape/0", "\"256\"");
    dt_ckpt_t *c;
    cr_assert_eq(dt_ckpt_open(top, &c), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_spec s;
    dt_model_layout l;
    cr_assert_eq(dt_ckpt_model_spec(c, &s), DT_STATUS_OK);
    cr_assert_eq(dt_model_layout_init(&s, &l), DT_STATUS_OK);
    dt_status_t st = dt_ckpt_check_layout(c, &l);
    dt_model_layout_free(&l);
    dt_ckpt_close(c);
    cr_assert_neq(st, DT_STATUS_OK);
    cr_assert(strstr(dt_error_detail(), "'tensors[0].shape[0]'"), "%s", dt_error_detail());
}
