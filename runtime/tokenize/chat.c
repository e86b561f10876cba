/*
 * chat.c - loads a model's chat template and special tokens the way transformers'
 * tokenizer does (tokenizer_config.json, chat_template.jinja, special_tokens_map.json),
 * and renders conversations with the variables apply_chat_template gives the
 * template (transformers/tokenization_utils_base.py apply_chat_template and
 * utils/chat_template_utils.py render_jinja_template).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fs.h"  /* defines: dt_fs_read_file */
#include "common/mem.h" /* defines: dt_xcalloc, dt_xstrdup */
#include "runtime/tokenize/chat.h"

#define MAX_CONFIG ((size_t)64 << 20)

struct dt_chat {
    char *source;   /* the file the template came from */
    dt_jinja_t *tpl;
    cJSON *tokens;  /* special token name -> string */
};

static dt_status_t read_json(const char *path, cJSON **out) {
    char *text;
    size_t len;
    *out = NULL;
    DT_CHECK(dt_fs_read_file(path, MAX_CONFIG, &text, &len));
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        int line = 1;
        for (const char *p = text; end && p < end && *p; p++) line += *p == '\n';
        free(text);
        return dt_error(DT_STATUS_FORMAT, "%s: line %d: JSON syntax error", path, line);
    }
    free(text);
    *out = j;
    return DT_STATUS_OK;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A token value: a string, or an AddedToken object {"content": "..."}; NULL otherwise. */
static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

/* The "*_token" keys of a tokenizer config (and its extra_special_tokens mapping);
 * fill_only: keep the tokens already set (special_tokens_map.json). */
static void add_tokens(cJSON *tokens, const cJSON *cfg, int fill_only) {
    for (const cJSON *e = cfg ? cfg->child : NULL; e; e = e->next) {
        if (strcmp(e->string, "extra_special_tokens") == 0 && cJSON_IsObject(e)) {
            add_tokens(tokens, e, fill_only);
            continue;
        }
        const char *text = token_text(e);
        if (!text || !ends_with(e->string, "_token")) continue;
        const cJSON *have = cJSON_GetObjectItemCaseSensitive(tokens, e->string);
        if (have && (fill_only || cJSON_IsString(have))) {
            if (fill_only && have->valuestring[0]) continue;
            cJSON_DeleteItemFromObjectCaseSensitive(tokens, e->string);
        }
        cJSON_AddStringToObject(tokens, e->string, text);
    }
}

static dt_status_t template_of(const char *file, const cJSON *cfg, const char **out) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    *out = NULL;
    if (cJSON_IsString(t)) {
        *out = t->valuestring;
        return DT_STATUS_OK;
    }
    if (cJSON_IsArray(t)) {
        for (const cJSON *e = t->child; e; e = e->next) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0 && cJSON_IsString(tpl)) {
                *out = tpl->valuestring;
                return DT_STATUS_OK;
            }
        }
        return dt_error(DT_STATUS_NOT_FOUND, "%s: chat_template is a list of named templates without one named "
                        "\"default\"", file);
    }
    if (t && !cJSON_IsNull(t))
        return dt_error(DT_STATUS_FORMAT, "%s: chat_template: expected a string or a list of {name, template}", file);
    return dt_error(DT_STATUS_NOT_FOUND, "%s: no chat_template (this tokenizer has no chat template)", file);
}

dt_status_t dt_chat_load(const char *path, dt_chat_t **out) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return dt_error(DT_STATUS_NOT_FOUND, "%s: no such file or folder", path);
    char cfg_path[4096] = "", jinja_path[4096] = "", map_path[4096] = "";
    if (S_ISDIR(st.st_mode)) {
        snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", path);
        snprintf(jinja_path, sizeof jinja_path, "%s/chat_template.jinja", path);
        snprintf(map_path, sizeof map_path, "%s/special_tokens_map.json", path);
        if (!is_file(jinja_path)) jinja_path[0] = 0;
        if (!is_file(cfg_path)) {
            if (!jinja_path[0])
                return dt_error(DT_STATUS_NOT_FOUND, "%s: no tokenizer_config.json or chat_template.jinja in this "
                                "folder", path);
            cfg_path[0] = 0;
        }
    } else if (ends_with(path, ".jinja")) {
        snprintf(jinja_path, sizeof jinja_path, "%s", path);
    } else {
        snprintf(cfg_path, sizeof cfg_path, "%s", path);
        const char *slash = strrchr(path, '/');
        snprintf(map_path, sizeof map_path, "%.*sspecial_tokens_map.json", slash ? (int)(slash + 1 - path) : 0, path);
    }
    dt_chat_t *c = dt_xcalloc(1, sizeof *c);
    c->tokens = cJSON_CreateObject();
    cJSON *cfg = NULL, *map = NULL;
    char *jinja_text = NULL;
    size_t jinja_len = 0;
    const char *text = NULL;
    dt_status_t rc = DT_STATUS_OK;
    if (cfg_path[0]) {
        DT_CHECK_GOTO(read_json(cfg_path, &cfg), rc, out_free);
        add_tokens(c->tokens, cfg, 0);
        if (map_path[0] && is_file(map_path)) {
            DT_CHECK_GOTO(read_json(map_path, &map), rc, out_free);
            add_tokens(c->tokens, map, 1);
        }
    }
    if (jinja_path[0]) {
        DT_CHECK_GOTO(dt_fs_read_file(jinja_path, MAX_CONFIG, &jinja_text, &jinja_len), rc, out_free);
        c->source = dt_xstrdup(jinja_path);
        text = jinja_text;
    } else {
        DT_CHECK_GOTO(template_of(cfg_path, cfg, &text), rc, out_free);
        c->source = dt_xstrdup(cfg_path);
        jinja_len = strlen(text);
    }
    char name[4200];
    snprintf(name, sizeof name, jinja_path[0] ? "%s" : "%s: chat_template", c->source);
    DT_CHECK_GOTO(dt_jinja_parse(text, jinja_len, name, &c->tpl), rc, out_free);
    cJSON_Delete(cfg);
    cJSON_Delete(map);
    free(jinja_text);
    *out = c;
    return DT_STATUS_OK;
out_free:
    cJSON_Delete(cfg);
    cJSON_Delete(map);
    free(jinja_text);
    dt_chat_free(c);
    return rc;
}

void dt_chat_free(dt_chat_t *c) {
    if (!c) return;
    dt_jinja_free(c->tpl);
    cJSON_Delete(c->tokens);
    free(c->source);
    free(c);
}

const char *dt_chat_source(const dt_chat_t *c) { return c->source; }
int dt_chat_has_generation(const dt_chat_t *c) { return dt_jinja_has_generation(c->tpl); }

const char *dt_chat_token(const dt_chat_t *c, const char *key) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c->tokens, key);
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* Sets key on o to v (owned), in place when the key is there. */
static void set_item(cJSON *o, const char *key, cJSON *v) {
    if (cJSON_GetObjectItemCaseSensitive(o, key))
        cJSON_ReplaceItemInObjectCaseSensitive(o, key, v);
    else
        cJSON_AddItemToObject(o, key, v);
}

/* One message as render_jinja_template sees it: keys whose value is None dropped
 * (_normalize_chat_messages), then the reasoning copied under "thinking" (first)
 * and "reasoning_content" (_alias_reasoning_fields). */
static cJSON *normalize_message(const cJSON *m) {
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    const cJSON *reasoning = NULL;
    for (int i = 0; i < 3 && !reasoning; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, fields[i]);
        if (v && !cJSON_IsNull(v)) reasoning = v;
    }
    cJSON *o = cJSON_CreateObject();
    if (reasoning) cJSON_AddItemToObject(o, "thinking", cJSON_Duplicate(reasoning, 1));
    for (const cJSON *e = m->child; e; e = e->next)
        if (!cJSON_IsNull(e)) set_item(o, e->string, cJSON_Duplicate(e, 1));
    if (reasoning) set_item(o, "reasoning_content", cJSON_Duplicate(reasoning, 1));
    return o;
}

dt_status_t dt_chat_render_spans(const dt_chat_t *c, const cJSON *messages, int add_generation_prompt,
                                 const cJSON *extra, char **out, size_t *len, dt_jinja_span **spans,
                                 size_t *nspans) {
    static const char *const reserved[] = {"messages", "conversation", "add_generation_prompt", "chat_template",
                                           "continue_final_message", "tokenize", "return_dict",
                                           "return_assistant_tokens_mask", NULL};
    *out = NULL;
    if (len) *len = 0;
    if (spans) *spans = NULL;
    if (nspans) *nspans = 0;
    if (!cJSON_IsArray(messages))
        return dt_error(DT_STATUS_INVALID, "%s: the messages must be a JSON array of message objects", c->source);
    if (!messages->child)
        return dt_error(DT_STATUS_INVALID, "%s: Cannot apply chat template to an empty conversation. Provide at "
                        "least one message.", c->source);
    if (extra && !cJSON_IsObject(extra))
        return dt_error(DT_STATUS_INVALID, "%s: the extra template variables must be a JSON object", c->source);
    for (const cJSON *e = extra ? extra->child : NULL; e; e = e->next)
        for (const char *const *k = reserved; *k; k++)
            if (strcmp(e->string, *k) == 0)
                return dt_error(DT_STATUS_INVALID, "%s: '%s' is an argument of apply_chat_template, not a template "
                                "variable to pass", c->source, *k);
    int i = 0;
    for (const cJSON *m = messages->child; m; m = m->next, i++)
        if (!cJSON_IsObject(m))
            return dt_error(DT_STATUS_INVALID, "%s: message %d is not an object (Chat messages should be dicts)",
                            c->source, i);
    cJSON *vars = cJSON_Duplicate(c->tokens, 1);
    for (const cJSON *e = extra ? extra->child : NULL; e; e = e->next)
        set_item(vars, e->string, cJSON_Duplicate(e, 1));
    cJSON *msgs = cJSON_CreateArray();
    for (const cJSON *m = messages->child; m; m = m->next) cJSON_AddItemToArray(msgs, normalize_message(m));
    set_item(vars, "messages", msgs);
    set_item(vars, "add_generation_prompt", cJSON_CreateBool(add_generation_prompt != 0));
    if (!cJSON_GetObjectItemCaseSensitive(vars, "tools")) cJSON_AddNullToObject(vars, "tools");
    if (!cJSON_GetObjectItemCaseSensitive(vars, "documents")) cJSON_AddNullToObject(vars, "documents");
    dt_jinja_result res;
    dt_status_t st = dt_jinja_render(c->tpl, vars, NULL, &res);
    cJSON_Delete(vars);
    if (st != DT_STATUS_OK) return st;
    *out = res.text;
    if (len) *len = res.len;
    if (spans) {
        *spans = res.spans;
        if (nspans) *nspans = res.nspans;
    } else {
        free(res.spans);
    }
    return DT_STATUS_OK;
}

dt_status_t dt_chat_render(const dt_chat_t *c, const cJSON *messages, int add_generation_prompt,
                           const cJSON *extra, char **out, size_t *len) {
    return dt_chat_render_spans(c, messages, add_generation_prompt, extra, out, len, NULL, NULL);
}
