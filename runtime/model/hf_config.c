/*
 * hf_config.c - Hugging Face config.json into a model spec (hf_config.h).
 */
#include "runtime/model/hf_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h" /* defines: dt_fs_read_file */

#define HF_CONFIG_MAX ((size_t)16 << 20) /* a config.json is a few KiB */

const char *dt_hf_config_types(void) { return "llama, mistral, qwen2, gpt2"; }

/* ---- the model's keys as numbers ------------------------------------------------------- */

/* Sets key k of spec from config.json's value v by the key's kind (a bool for BOOL,
 * an integer for INT, a number for FLOAT); 0 when v does not fit. */
static int key_set(dt_model_spec *spec, const dt_model_key *k, const cJSON *v) {
    if (k->kind == DT_MODEL_KEY_BOOL) {
        if (!cJSON_IsBool(v)) return 0;
        dt_model_key_set(spec, k, cJSON_IsTrue(v) ? 1 : 0);
        return 1;
    }
    if (!cJSON_IsNumber(v)) return 0;
    double x = v->valuedouble;
    if (!(x >= k->min && x <= k->max) || (k->kind == DT_MODEL_KEY_INT && floor(x) != x)) return 0;
    dt_model_key_set(spec, k, x);
    return 1;
}

/* config.json's value at the dotted path (nested objects), or NULL (absent or null). */
static const cJSON *at_path(const cJSON *root, const char *path) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *o = root;
    for (char *save = NULL, *p = strtok_r(buf, ".", &save); p && o; p = strtok_r(NULL, ".", &save))
        o = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, p) : NULL;
    return o && !cJSON_IsNull(o) ? o : NULL;
}

static int key_index(const dt_model_ops *ops, const char *path) {
    for (int i = 0; i < ops->n_keys; i++)
        if (!strcmp(ops->keys[i].path, path)) return i;
    return -1;
}

/* Every key its default (the JSON text of dt_model_key.def). */
static void set_defaults(dt_model_spec *spec) {
    for (int i = 0; i < spec->ops->n_keys; i++) {
        cJSON *d = cJSON_Parse(spec->ops->keys[i].def);
        key_set(spec, &spec->ops->keys[i], d);
        cJSON_Delete(d);
    }
}

/* Key `ours` from config.json's `theirs`; CONFIG naming both when it does not fit. */
static dt_status_t take(dt_hf_config *h, const cJSON *root, const char *ours, const char *theirs) {
    int k = key_index(h->spec.ops, ours);
    const cJSON *v = at_path(root, theirs);
    if (k < 0 || !v) return DT_STATUS_OK;
    if (!key_set(&h->spec, &h->spec.ops->keys[k], v)) {
        char *s = cJSON_PrintUnformatted(v);
        const dt_model_key *mk = &h->spec.ops->keys[k];
        dt_status_t st = mk->kind == DT_MODEL_KEY_BOOL
                             ? dt_error(DT_STATUS_CONFIG, "%s: %s: expected true or false for %s, found %s", h->path,
                                        theirs, ours, s ? s : "?")
                             : dt_error(DT_STATUS_CONFIG, "%s: %s: expected %s in [%g, %g] for %s, found %s", h->path,
                                        theirs, mk->kind == DT_MODEL_KEY_INT ? "an integer" : "a number", mk->min,
                                        mk->max, ours, s ? s : "?");
        free(s);
        return st;
    }
    if (k < DT_HF_MAX_KEYS) h->from_file[k] = 1;
    return DT_STATUS_OK;
}

static const char *str_of(const cJSON *root, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- gpt2 ---------------------------------------------------------------------------- */

static dt_status_t read_gpt2(dt_hf_config *h, const cJSON *root) {
    static const char *const map[][2] = {{"model.n_embd", "n_embd"}, {"model.n_layer", "n_layer"},
                                         {"model.n_head", "n_head"}, {"model.vocab_size", "vocab_size"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) DT_CHECK(take(h, root, map[i][0], map[i][1]));
    const cJSON *np = at_path(root, "n_positions");
    if (np && (!cJSON_IsNumber(np) || np->valuedouble < 1 || np->valuedouble > 1048576))
        return dt_error(DT_STATUS_CONFIG, "%s: n_positions: expected an integer in [1, 1048576]", h->path);
    h->max_seq_len = h->seq_len_default = np ? (int)np->valuedouble : 1024;
    h->spec.seq_len = h->seq_len_default;
    const cJSON *eps = at_path(root, "layer_norm_epsilon");
    if (eps && (!cJSON_IsNumber(eps) || fabs(eps->valuedouble - 1e-5) > 1e-12))
        return dt_error(DT_STATUS_CONFIG, "%s: layer_norm_epsilon: dtrun's LayerNorm uses 1e-5, found %g", h->path,
                        cJSON_IsNumber(eps) ? eps->valuedouble : NAN);
    const char *act = str_of(root, "activation_function");
    if (act && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"))
        return dt_error(DT_STATUS_CONFIG, "%s: activation_function: dtrun's GPT uses gelu_new (tanh), found %s",
                        h->path, act);
    const cJSON *inner = at_path(root, "n_inner");
    /* compared as doubles: casting 1e300 to int is undefined (make fuzz) */
    if (inner && (!cJSON_IsNumber(inner) || inner->valuedouble != 4.0 * h->spec.n_embd))
        return dt_error(DT_STATUS_CONFIG, "%s: n_inner: dtrun's GPT has an MLP of 4 * n_embd = %d, found %g", h->path,
                        4 * h->spec.n_embd, cJSON_IsNumber(inner) ? inner->valuedouble : NAN);
    const cJSON *tie = at_path(root, "tie_word_embeddings");
    if (tie && !cJSON_IsTrue(tie))
        return dt_error(DT_STATUS_CONFIG, "%s: tie_word_embeddings: dtrun's GPT ties lm_head to wte, found false",
                        h->path);
    return DT_STATUS_OK;
}

/* ---- the llama family ------------------------------------------------------------------- */

static dt_status_t read_llama(dt_hf_config *h, const cJSON *root) {
    const dt_model_ops *ops = h->spec.ops;
    for (int k = 0; k < ops->n_keys; k++) /* model.X.Y <- X.Y */
        if (!strncmp(ops->keys[k].path, "model.", 6)) DT_CHECK(take(h, root, ops->keys[k].path, ops->keys[k].path + 6));
    if (!strcmp(h->model_type, "qwen2")) { /* Qwen2 has q/k/v biases and no key saying so */
        int k = key_index(ops, "model.attention_bias");
        cJSON *t = cJSON_CreateTrue();
        if (k >= 0 && key_set(&h->spec, &ops->keys[k], t) && k < DT_HF_MAX_KEYS) h->from_file[k] = 1;
        cJSON_Delete(t);
    }
    const cJSON *mp = at_path(root, "max_position_embeddings");
    if (cJSON_IsNumber(mp)) h->max_seq_len = (int)mp->valuedouble;
    const char *act = str_of(root, "hidden_act");
    if (act && strcmp(act, "silu"))
        return dt_error(DT_STATUS_CONFIG, "%s: hidden_act: dtrun's llama uses silu (SwiGLU), found %s", h->path, act);
    const cJSON *mb = at_path(root, "mlp_bias");
    if (mb && cJSON_IsTrue(mb))
        return dt_error(DT_STATUS_CONFIG, "%s: mlp_bias: dtrun's llama has no MLP biases, found true", h->path);
    const cJSON *rs = at_path(root, "rope_scaling");
    if (rs) {
        const char *t = str_of(rs, "rope_type");
        if (!t) t = str_of(rs, "type");
        if (!t || strcmp(t, "llama3"))
            return dt_error(DT_STATUS_CONFIG, "%s: rope_scaling: dtrun reads null or rope_type \"llama3\", found %s",
                            h->path, t ? t : "an object without rope_type");
    }
    const cJSON *use = at_path(root, "use_sliding_window"), *sw = at_path(root, "sliding_window");
    int applies = !strcmp(h->model_type, "qwen2") ? cJSON_IsTrue(use) : sw != NULL;
    if (applies && cJSON_IsNumber(sw) && sw->valuedouble > 0) {
        if (sw->valuedouble > INT_MAX || floor(sw->valuedouble) != sw->valuedouble) /* before the cast (make fuzz) */
            return dt_error(DT_STATUS_CONFIG, "%s: sliding_window: expected an integer from 1 to %d, found %g",
                            h->path, INT_MAX, sw->valuedouble);
        h->sliding_window = (int)sw->valuedouble;
    } else if (applies && cJSON_IsTrue(use))
        return dt_error(DT_STATUS_CONFIG, "%s: use_sliding_window: dtrun's attention is not windowed", h->path);
    return DT_STATUS_OK;
}

/* ---- the file ---------------------------------------------------------------------------- */

/* transformers >= 5 writes rope_theta and rope_scaling as one object,
 * rope_parameters {rope_theta, rope_type, factor, ...}; published checkpoints keep
 * them at the top level. The top-level form is made from it when absent. */
static void rope_parameters_to_top_level(cJSON *root) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (!cJSON_IsObject(rp)) return;
    const cJSON *theta = cJSON_GetObjectItemCaseSensitive(rp, "rope_theta");
    if (cJSON_IsNumber(theta) && !cJSON_GetObjectItemCaseSensitive(root, "rope_theta"))
        cJSON_AddNumberToObject(root, "rope_theta", theta->valuedouble);
    const char *type = str_of(rp, "rope_type");
    if (type && strcmp(type, "default") && !at_path(root, "rope_scaling")) {
        cJSON *rs = cJSON_Duplicate(rp, 1);
        cJSON_DeleteItemFromObjectCaseSensitive(rs, "rope_theta");
        cJSON_DeleteItemFromObjectCaseSensitive(root, "rope_scaling"); /* a null one */
        cJSON_AddItemToObject(root, "rope_scaling", rs);
    }
}

dt_status_t dt_hf_config_read(const char *dir, dt_hf_config *h) {
    memset(h, 0, sizeof *h);
    snprintf(h->path, sizeof h->path, "%s/config.json", dir);
    char *text;
    dt_status_t st = dt_fs_read_file(h->path, HF_CONFIG_MAX, &text, NULL);
    if (st != DT_STATUS_OK) return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dt_error(DT_STATUS_CONFIG, "%s: expected a JSON object", h->path);
    }
    rope_parameters_to_top_level(root);
    const char *mt = str_of(root, "model_type");
    snprintf(h->model_type, sizeof h->model_type, "%s", mt ? mt : "");
    const char *dt = str_of(root, "torch_dtype");
    if (!dt) dt = str_of(root, "dtype");
    snprintf(h->dtype, sizeof h->dtype, "%s", dt ? dt : "");
    int gpt = mt && !strcmp(mt, "gpt2");
    int llama = mt && (!strcmp(mt, "llama") || !strcmp(mt, "mistral") || !strcmp(mt, "qwen2"));
    const char *ours = gpt ? "gpt" : "llama";
    if (!gpt && !llama) {
        st = dt_error(DT_STATUS_CONFIG, "%s: model_type %s%s%s: expected one of %s", h->path, mt ? "\"" : "",
                      mt ? mt : "(none)", mt ? "\"" : "", dt_hf_config_types());
        goto out_free;
    }
    h->spec.ops = dt_model_lookup(ours);
    if (!h->spec.ops) {
        st = dt_error(DT_STATUS_CONFIG, "%s: model_type %s needs dtrun's model %s, which this build does not have",
                      h->path, mt, ours);
        goto out_free;
    }
    set_defaults(&h->spec);
    st = gpt ? read_gpt2(h, root) : read_llama(h, root);
out_free:
    cJSON_Delete(root);
    return st;
}

/* ---- writing ------------------------------------------------------------------------------ */

/* Sets root's dotted path (nested objects made as needed) to v. */
static void put_path(cJSON *root, const char *path, cJSON *v) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    cJSON *o = root;
    char *save = NULL, *p = strtok_r(buf, ".", &save);
    for (char *next; (next = strtok_r(NULL, ".", &save)); p = next) {
        cJSON *c = cJSON_GetObjectItemCaseSensitive(o, p);
        if (!cJSON_IsObject(c)) {
            cJSON_DeleteItemFromObjectCaseSensitive(o, p);
            c = cJSON_AddObjectToObject(o, p);
        }
        o = c;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(o, p);
    cJSON_AddItemToObject(o, p, v);
}

static int key_int(const dt_model_spec *s, const char *path) {
    int k = key_index(s->ops, path);
    return k < 0 ? 0 : (int)dt_model_key_get(s, &s->ops->keys[k]);
}

static void gpt2_json(const dt_model_layout *l, cJSON *o) {
    const dt_model_spec *s = &l->spec;
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddStringToObject(o, "model_type", "gpt2");
    cJSON_AddNumberToObject(o, "vocab_size", s->vocab_size);
    cJSON_AddNumberToObject(o, "n_positions", s->seq_len);
    cJSON_AddNumberToObject(o, "n_ctx", s->seq_len);
    cJSON_AddNumberToObject(o, "n_embd", s->n_embd);
    cJSON_AddNumberToObject(o, "n_layer", s->n_layer);
    cJSON_AddNumberToObject(o, "n_head", s->n_head);
    cJSON_AddNullToObject(o, "n_inner");
    cJSON_AddStringToObject(o, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(o, "layer_norm_epsilon", 1e-5);
    /* dtrun trains without dropout: the same model in transformers */
    cJSON_AddNumberToObject(o, "resid_pdrop", 0.0);
    cJSON_AddNumberToObject(o, "embd_pdrop", 0.0);
    cJSON_AddNumberToObject(o, "attn_pdrop", 0.0);
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddTrueToObject(o, "tie_word_embeddings");
}

/* Every key model.X.Y as X.Y, then what transformers needs beside them. */
static void llama_json(const dt_model_layout *l, cJSON *o) {
    const dt_model_spec *s = &l->spec;
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(o, "model_type", "llama");
    for (int k = 0; k < s->ops->n_keys; k++) {
        const char *p = s->ops->keys[k].path;
        if (strncmp(p, "model.", 6) || !strcmp(p, "model.seq_len") || !strcmp(p, "model.vocab_pad_multiple"))
            continue;
        const dt_model_key *mk = &s->ops->keys[k];
        double v = dt_model_key_get(s, mk);
        put_path(o, p + 6, mk->kind == DT_MODEL_KEY_BOOL ? cJSON_CreateBool(v != 0) : cJSON_CreateNumber(v));
    }
    int heads = key_int(s, "model.num_attention_heads");
    if (key_int(s, "model.num_key_value_heads") == 0) put_path(o, "num_key_value_heads", cJSON_CreateNumber(heads));
    if (key_int(s, "model.head_dim") == 0 && heads > 0)
        put_path(o, "head_dim", cJSON_CreateNumber(key_int(s, "model.hidden_size") / heads));
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (rs && cJSON_GetObjectItem(rs, "factor") && cJSON_GetObjectItem(rs, "factor")->valuedouble > 0)
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
    else
        put_path(o, "rope_scaling", cJSON_CreateNull());
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddFalseToObject(o, "mlp_bias");
    cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
}

char *dt_hf_config_json(const dt_model_layout *l, const char *torch_dtype) {
    const char *name = l->spec.ops->name;
    int gpt = !strcmp(name, "gpt"), llama = !strcmp(name, "llama");
    if (!gpt && !llama) {
        dt_error(DT_STATUS_UNSUPPORTED, "model %s has no Hugging Face form (gpt and llama have)", name);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    if (gpt) gpt2_json(l, o);
    else llama_json(l, o);
    cJSON_AddStringToObject(o, "torch_dtype", torch_dtype);
    /* dtrun knows no special tokens: null, not transformers' defaults (50256; 1, 2) */
    cJSON_AddNullToObject(o, "bos_token_id");
    cJSON_AddNullToObject(o, "eos_token_id");
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}
