/*
 * tok_load.c - reads tokenizer.json (and tokenizer_config.json beside it) into a
 * dt_tok_t: the BPE model, added tokens, normalizers, pre-tokenizer, decoders.
 * Every error names the file and the JSON key path; what is valid but not
 * implemented is DT_STATUS_UNSUPPORTED naming the type and where it sits.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fs.h"  /* defines: dt_fs_read_file */
#include "common/mem.h" /* defines: dt_xmalloc, dt_xcalloc, dt_xstrdup */
#include "runtime/tokenize/tok_internal.h"

#define TOK_MAX_FILE (1u << 30)

static const char PAT_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char PAT_LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char PAT_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ---- small JSON accessors that name the key path on error ---- */

static dt_status_t bad(const dt_tok_t *t, const char *key, const char *what) {
    return dt_error(DT_STATUS_FORMAT, "%s: %s: %s", t->path, key, what);
}

static dt_status_t get_str(const dt_tok_t *t, const cJSON *o, const char *name, const char *at, int required,
                           const char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return dt_error(DT_STATUS_FORMAT, "%s: %s.%s: missing (expected a string)", t->path, at, name);
        return DT_STATUS_OK;
    }
    if (!cJSON_IsString(v))
        return dt_error(DT_STATUS_FORMAT, "%s: %s.%s: expected a string", t->path, at, name);
    *out = v->valuestring;
    return DT_STATUS_OK;
}

static dt_status_t get_bool(const dt_tok_t *t, const cJSON *o, const char *name, const char *at, int dflt,
                            int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = dflt;
    if (!v || cJSON_IsNull(v))
        return DT_STATUS_OK;
    if (!cJSON_IsBool(v))
        return dt_error(DT_STATUS_FORMAT, "%s: %s.%s: expected true or false", t->path, at, name);
    *out = cJSON_IsTrue(v);
    return DT_STATUS_OK;
}

static dt_status_t get_type(const dt_tok_t *t, const cJSON *o, const char *at, const char **type) {
    if (!cJSON_IsObject(o))
        return dt_error(DT_STATUS_FORMAT, "%s: %s: expected an object", t->path, at);
    return get_str(t, o, "type", at, 1, type);
}

/* A {"String": s} or {"Regex": r} pattern. */
static dt_status_t get_pattern(const dt_tok_t *t, const cJSON *o, const char *at, const char **s, int *regex) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    if (!cJSON_IsObject(p))
        return dt_error(DT_STATUS_FORMAT, "%s: %s.pattern: expected {\"String\": ...} or {\"Regex\": ...}", t->path, at);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(p, "String");
    *regex = 0;
    if (!v) {
        v = cJSON_GetObjectItemCaseSensitive(p, "Regex");
        *regex = 1;
    }
    if (!cJSON_IsString(v))
        return dt_error(DT_STATUS_FORMAT, "%s: %s.pattern: expected {\"String\": ...} or {\"Regex\": ...}", t->path, at);
    *s = v->valuestring;
    return DT_STATUS_OK;
}

/* ---- model ---- */

static dt_status_t load_merge(dt_tok_t *t, const cJSON *m, int i, uint32_t rank) {
    char key[64];
    snprintf(key, sizeof key, "model.merges[%d]", i);
    const char *a, *b;
    size_t an, bn;
    char *split = NULL;
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring;
        const char *sp = strchr(s + (s[0] == ' ' ? 1 : 0), ' ');
        if (!sp || !sp[1])
            return bad(t, key, "expected \"left right\" (two tokens separated by one space)");
        a = s, an = (size_t)(sp - s), b = sp + 1, bn = strlen(sp + 1);
    } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
        a = cJSON_GetArrayItem(m, 0)->valuestring, an = strlen(a);
        b = cJSON_GetArrayItem(m, 1)->valuestring, bn = strlen(b);
    } else {
        return bad(t, key, "expected a string or a pair");
    }
    int64_t ia = dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, a, an);
    int64_t ib = dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, b, bn);
    split = dt_xmalloc(an + bn + 1);
    memcpy(split, a, an);
    memcpy(split + an, b, bn);
    split[an + bn] = 0;
    int64_t im = dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, split, an + bn);
    dt_status_t st = DT_STATUS_OK;
    if (ia < 0 || ib < 0 || im < 0)
        st = dt_error(DT_STATUS_FORMAT, "%s: %s: token \"%.*s\" is not in model.vocab", t->path, key,
                      (int)(ia < 0 ? an : ib < 0 ? bn : an + bn), ia < 0 ? a : ib < 0 ? b : split);
    else
        dt_tok_mergemap_put(&t->merges, (uint32_t)ia, (uint32_t)ib, rank, (uint32_t)im);
    free(split);
    return st;
}

/* Ids are dense: each below the number of entries (vocab and added tokens) plus
 * DT_TOK_ID_SLACK, so that a stray huge id is an error, not gigabytes of table. */
static dt_status_t check_id(const dt_tok_t *t, double id, const char *key, const char *token) {
    if (!(id >= 0 && id <= 0x7fffffff && id == (double)(uint32_t)id))
        return dt_error(DT_STATUS_FORMAT, "%s: %s: expected a non-negative integer id for \"%s\"", t->path, key, token);
    if ((uint64_t)id >= t->id_limit)
        return dt_error(DT_STATUS_FORMAT, "%s: %s: the id %.0f of \"%s\" is too large: ids must be below %llu (the "
                        "%llu vocab and added tokens + %u)", t->path, key, id, token, (unsigned long long)t->id_limit,
                        (unsigned long long)(t->id_limit - DT_TOK_ID_SLACK), DT_TOK_ID_SLACK);
    return DT_STATUS_OK;
}

static void set_token(dt_tok_t *t, uint32_t id, const char *s) {
    if (id >= t->nvocab) {
        uint32_t n = id + 1;
        t->tokens = dt_xrealloc(t->tokens, n * sizeof *t->tokens);
        t->tok_len = dt_xrealloc(t->tok_len, n * sizeof *t->tok_len);
        for (uint32_t i = t->nvocab; i < n; i++)
            t->tokens[i] = NULL, t->tok_len[i] = 0;
        t->nvocab = n;
    }
    if (!t->tokens[id]) {
        t->tokens[id] = dt_xstrdup(s);
        t->tok_len[id] = (uint32_t)strlen(s);
    }
}

static dt_status_t load_model(dt_tok_t *t, const cJSON *model) {
    if (!model)
        return bad(t, "model", "missing");
    const char *type;
    if (!cJSON_IsObject(model))
        return bad(t, "model", "expected an object");
    DT_CHECK(get_str(t, model, "type", "model", 0, &type));
    if (type && strcmp(type, "BPE") != 0)
        return dt_error(DT_STATUS_UNSUPPORTED, "%s: model.type: \"%s\" is not supported (only BPE is)", t->path, type);
    const char *s;
    DT_CHECK(get_str(t, model, "continuing_subword_prefix", "model", 0, &s));
    if (s && *s)
        return dt_error(DT_STATUS_UNSUPPORTED, "%s: model.continuing_subword_prefix \"%s\" is not supported", t->path, s);
    DT_CHECK(get_str(t, model, "end_of_word_suffix", "model", 0, &s));
    if (s && *s)
        return dt_error(DT_STATUS_UNSUPPORTED, "%s: model.end_of_word_suffix \"%s\" is not supported", t->path, s);
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (drop && !cJSON_IsNull(drop) && !(cJSON_IsNumber(drop) && drop->valuedouble == 0))
        return dt_error(DT_STATUS_UNSUPPORTED, "%s: model.dropout: BPE dropout is not supported", t->path);
    DT_CHECK(get_bool(t, model, "byte_fallback", "model", 0, &t->byte_fallback));
    DT_CHECK(get_bool(t, model, "ignore_merges", "model", 0, &t->ignore_merges));
    DT_CHECK(get_bool(t, model, "fuse_unk", "model", 0, &t->fuse_unk));
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!vocab)
        return bad(t, "model.vocab", "missing");
    if (!cJSON_IsObject(vocab))
        return bad(t, "model.vocab", "expected an object of token: id");
    int nv = cJSON_GetArraySize(vocab);
    dt_tok_strmap_init(&t->vocab, (size_t)nv + 1024);
    for (const cJSON *v = vocab->child; v; v = v->next) {
        if (!cJSON_IsNumber(v))
            return dt_error(DT_STATUS_FORMAT, "%s: model.vocab[\"%s\"]: expected a non-negative integer id", t->path,
                            v->string);
        DT_CHECK(check_id(t, v->valuedouble, "model.vocab", v->string));
        uint32_t id = (uint32_t)v->valuedouble;
        set_token(t, id, v->string);
        dt_tok_strmap_put(&t->vocab, t->tokens, t->tok_len, id);
    }
    const char *unk;
    DT_CHECK(get_str(t, model, "unk_token", "model", 0, &unk));
    t->unk_id = unk ? dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, unk, strlen(unk)) : -1;
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!merges)
        return bad(t, "model.merges", "missing");
    if (!cJSON_IsArray(merges))
        return bad(t, "model.merges", "expected an array");
    dt_tok_mergemap_init(&t->merges, (size_t)cJSON_GetArraySize(merges) + 16);
    int i = 0;
    for (const cJSON *m = merges->child; m; m = m->next, i++)
        DT_CHECK(load_merge(t, m, i, (uint32_t)i));
    for (uint32_t id = 0; id < t->nvocab; id++) {
        const char *s = t->tokens[id];
        for (uint32_t k = 0; s && k + 1 < t->tok_len[id]; k++)
            if (s[k] == '\n' && (unsigned char)s[k + 1] < 128)
                t->nl_then[(unsigned char)s[k + 1]] = 1;
    }
    for (int b = 0; b < 256; b++) {
        char name[8], ch[4];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, name, 6);
        memcpy(ch, dt_tok_byte_chars[b], dt_tok_byte_char_len[b]);
        t->bytelevel_id[b] = dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, ch, dt_tok_byte_char_len[b]);
        if (b < 128) {
            char c = (char)b;
            t->ascii_id[b] = dt_tok_strmap_get(&t->vocab, t->tokens, t->tok_len, &c, 1);
        }
    }
    return DT_STATUS_OK;
}

/* ---- added tokens ---- */

static int added_cmp(const void *a, const void *b) {
    const dt_tok_added *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static dt_status_t load_added(dt_tok_t *t, const cJSON *arr) {
    if (!arr || cJSON_IsNull(arr))
        return DT_STATUS_OK;
    if (!cJSON_IsArray(arr))
        return bad(t, "added_tokens", "expected an array");
    int n = cJSON_GetArraySize(arr);
    t->added = dt_xcalloc((size_t)n + 1, sizeof *t->added);
    int i = 0;
    for (const cJSON *a = arr->child; a; a = a->next, i++) {
        char at[48];
        snprintf(at, sizeof at, "added_tokens[%d]", i);
        if (!cJSON_IsObject(a))
            return bad(t, at, "expected an object");
        const char *content;
        DT_CHECK(get_str(t, a, "content", at, 1, &content));
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (!cJSON_IsNumber(id))
            return dt_error(DT_STATUS_FORMAT, "%s: %s.id: expected a non-negative integer", t->path, at);
        if (!*content)
            return dt_error(DT_STATUS_FORMAT, "%s: %s.content: empty", t->path, at);
        char idkey[64];
        snprintf(idkey, sizeof idkey, "%s.id", at);
        DT_CHECK(check_id(t, id->valuedouble, idkey, content));
        dt_tok_added *d = &t->added[t->nadded++];
        d->content = dt_xstrdup(content);
        d->len = strlen(content);
        d->id = (uint32_t)id->valuedouble;
        DT_CHECK(get_bool(t, a, "special", at, 0, &d->special));
        DT_CHECK(get_bool(t, a, "lstrip", at, 0, &d->lstrip));
        DT_CHECK(get_bool(t, a, "rstrip", at, 0, &d->rstrip));
        DT_CHECK(get_bool(t, a, "single_word", at, 0, &d->single_word));
        DT_CHECK(get_bool(t, a, "normalized", at, !d->special, &d->normalized));
        set_token(t, d->id, content);
        if (d->lstrip || strchr(content, '\n'))
            t->added_newline_or_lstrip = 1;
    }
    qsort(t->added, (size_t)t->nadded, sizeof *t->added, added_cmp);
    t->added_idx = dt_xcalloc((size_t)t->nadded + 1, sizeof *t->added_idx);
    for (int k = 0; k < t->nadded; k++)
        t->added_first[(unsigned char)t->added[k].content[0] + 1]++;
    for (int c = 0; c < 256; c++)
        t->added_first[c + 1] += t->added_first[c];
    int fill[256];
    memcpy(fill, t->added_first, sizeof fill);
    for (int k = 0; k < t->nadded; k++) /* stable: longest first within each byte */
        t->added_idx[fill[(unsigned char)t->added[k].content[0]]++] = k;
    return DT_STATUS_OK;
}

/* ---- normalizer ---- */

static dt_status_t load_norm(dt_tok_t *t, const cJSON *o, const char *at) {
    if (!o || cJSON_IsNull(o))
        return DT_STATUS_OK;
    const char *type;
    DT_CHECK(get_type(t, o, at, &type));
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "normalizers");
        if (!cJSON_IsArray(list))
            return dt_error(DT_STATUS_FORMAT, "%s: %s.normalizers: expected an array", t->path, at);
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.normalizers[%d]", at, i);
            DT_CHECK(load_norm(t, c, sub));
        }
        return DT_STATUS_OK;
    }
    dt_tok_norm n = {0};
    if (!strcmp(type, "NFC")) {
        n.kind = DT_NORM_NFC;
    } else if (!strcmp(type, "Prepend")) {
        const char *p;
        DT_CHECK(get_str(t, o, "prepend", at, 1, &p));
        n.kind = DT_NORM_PREPEND, n.a = dt_xstrdup(p);
    } else if (!strcmp(type, "Replace")) {
        const char *pat, *content;
        int regex;
        DT_CHECK(get_pattern(t, o, at, &pat, &regex));
        if (regex)
            return dt_error(DT_STATUS_UNSUPPORTED, "%s: %s.pattern: a Replace on the regex \"%s\" is not supported "
                            "(only a plain String pattern is)", t->path, at, pat);
        if (!*pat)
            return dt_error(DT_STATUS_FORMAT, "%s: %s.pattern: empty", t->path, at);
        DT_CHECK(get_str(t, o, "content", at, 1, &content));
        n.kind = DT_NORM_REPLACE, n.a = dt_xstrdup(pat), n.b = dt_xstrdup(content);
    } else {
        return dt_error(DT_STATUS_UNSUPPORTED, "%s: %s: normalizer type \"%s\" is not supported", t->path, at, type);
    }
    t->norms = dt_xrealloc(t->norms, (size_t)(t->nnorms + 1) * sizeof *t->norms);
    t->norms[t->nnorms++] = n;
    return DT_STATUS_OK;
}

/* How much the normalizers can grow a text: each Replace turns every len(pattern)
 * bytes into len(content) at worst, and a chain multiplies (a Replace of " " by a
 * content holding 100 spaces, twice: 10^4 times the spaces). Real tokenizers grow
 * text by at most 3x (" " -> "\u2581"); past DT_TOK_MAX_NORM_GROWTH the tokenizer
 * is refused at load, naming the step, instead of exhausting memory on the first
 * document (found by `make fuzz`: 40 bytes became half a million tokens). */
#define DT_TOK_MAX_NORM_GROWTH 64.0

static dt_status_t check_norm_growth(const dt_tok_t *t) {
    double growth = 1.0;
    for (int k = 0; k < t->nnorms; k++) {
        const dt_tok_norm *nm = &t->norms[k];
        if (nm->kind != DT_NORM_REPLACE) continue;
        double r = (double)strlen(nm->b) / (double)strlen(nm->a);
        if (r > 1.0) growth *= r;
        if (growth > DT_TOK_MAX_NORM_GROWTH) {
            char shown[96];
            return dt_error(DT_STATUS_FORMAT,
                            "%s: normalizer: its Replace steps can grow a text %.0fx (step %d of the normalizer replaces "
                            "\"%s\" by %zu bytes); more than %.0fx is refused (real tokenizers grow text by at most 3x)",
                            t->path, growth, k + 1, dt_fs_printable(nm->a, shown, sizeof shown), strlen(nm->b),
                            DT_TOK_MAX_NORM_GROWTH);
        }
    }
    return DT_STATUS_OK;
}

/* ---- pre-tokenizer ---- */

static dt_status_t set_split(dt_tok_t *t, dt_tok_split_kind k, const char *at) {
    if (t->split != DT_SPLIT_NONE && t->split != k)
        return dt_error(DT_STATUS_UNSUPPORTED, "%s: %s: a second, different regex split is not supported", t->path, at);
    t->split = k;
    return DT_STATUS_OK;
}

static dt_status_t load_pretok(dt_tok_t *t, const cJSON *o, const char *at) {
    if (!o || cJSON_IsNull(o))
        return DT_STATUS_OK;
    const char *type;
    DT_CHECK(get_type(t, o, at, &type));
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "pretokenizers");
        if (!cJSON_IsArray(list))
            return dt_error(DT_STATUS_FORMAT, "%s: %s.pretokenizers: expected an array", t->path, at);
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", at, i);
            DT_CHECK(load_pretok(t, c, sub));
        }
        return DT_STATUS_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        int regex;
        DT_CHECK(get_bool(t, o, "add_prefix_space", at, 1, &t->add_prefix_space));
        DT_CHECK(get_bool(t, o, "use_regex", at, 1, &regex));
        t->byte_level = 1;
        if (regex)
            DT_CHECK(set_split(t, DT_SPLIT_GPT2, at));
        return DT_STATUS_OK;
    }
    if (!strcmp(type, "Split")) {
        const char *pat, *behavior;
        int regex, invert;
        DT_CHECK(get_pattern(t, o, at, &pat, &regex));
        DT_CHECK(get_str(t, o, "behavior", at, 1, &behavior));
        DT_CHECK(get_bool(t, o, "invert", at, 0, &invert));
        if (strcmp(behavior, "Isolated") != 0 || invert)
            return dt_error(DT_STATUS_UNSUPPORTED, "%s: %s.behavior: Split \"%s\"%s is not supported (only Isolated)",
                            t->path, at, behavior, invert ? " inverted" : "");
        dt_tok_split_kind k = !regex ? DT_SPLIT_NONE
                              : !strcmp(pat, PAT_GPT2) ? DT_SPLIT_GPT2
                              : !strcmp(pat, PAT_LLAMA3) ? DT_SPLIT_LLAMA3
                              : !strcmp(pat, PAT_QWEN2) ? DT_SPLIT_QWEN2 : DT_SPLIT_NONE;
        if (k == DT_SPLIT_NONE)
            return dt_error(DT_STATUS_UNSUPPORTED, "%s: %s.pattern: the %s \"%s\" is not supported (only GPT-2's, "
                            "Llama 3's and Qwen2's regexes are)", t->path, at, regex ? "regex" : "string", pat);
        return set_split(t, k, at);
    }
    if (!strcmp(type, "Metaspace")) {
        const char *repl, *scheme;
        DT_CHECK(get_str(t, o, "replacement", at, 1, &repl));
        if (!*repl)
            return dt_error(DT_STATUS_FORMAT, "%s: %s.replacement: empty", t->path, at);
        DT_CHECK(get_str(t, o, "prepend_scheme", at, 0, &scheme));
        DT_CHECK(get_bool(t, o, "split", at, 1, &t->meta_split));
        if (!scheme) {
            int aps;
            DT_CHECK(get_bool(t, o, "add_prefix_space", at, 1, &aps));
            scheme = aps ? "always" : "never";
        }
        if (!strcmp(scheme, "never"))
            t->meta_scheme = 0;
        else if (!strcmp(scheme, "first"))
            t->meta_scheme = 1;
        else if (!strcmp(scheme, "always"))
            t->meta_scheme = 2;
        else
            return dt_error(DT_STATUS_FORMAT, "%s: %s.prepend_scheme: \"%s\" (expected first, always or never)",
                            t->path, at, scheme);
        t->metaspace = 1;
        t->meta_repl = dt_xstrdup(repl);
        return DT_STATUS_OK;
    }
    return dt_error(DT_STATUS_UNSUPPORTED, "%s: %s: pre-tokenizer type \"%s\" is not supported", t->path, at, type);
}

/* ---- decoder ---- */

static dt_status_t load_dec(dt_tok_t *t, const cJSON *o, const char *at) {
    if (!o || cJSON_IsNull(o))
        return DT_STATUS_OK;
    const char *type;
    DT_CHECK(get_type(t, o, at, &type));
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "decoders");
        if (!cJSON_IsArray(list))
            return dt_error(DT_STATUS_FORMAT, "%s: %s.decoders: expected an array", t->path, at);
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.decoders[%d]", at, i);
            DT_CHECK(load_dec(t, c, sub));
        }
        return DT_STATUS_OK;
    }
    dt_tok_dec d = {0};
    if (!strcmp(type, "ByteLevel")) {
        d.kind = DT_DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        d.kind = DT_DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d.kind = DT_DEC_FUSE;
    } else if (!strcmp(type, "Metaspace")) {
        const char *repl, *scheme;
        DT_CHECK(get_str(t, o, "replacement", at, 1, &repl));
        if (!*repl)
            return dt_error(DT_STATUS_FORMAT, "%s: %s.replacement: empty", t->path, at);
        DT_CHECK(get_str(t, o, "prepend_scheme", at, 0, &scheme));
        int aps = 1;
        if (!scheme)
            DT_CHECK(get_bool(t, o, "add_prefix_space", at, 1, &aps));
        d.kind = DT_DEC_METASPACE, d.a = dt_xstrdup(repl);
        d.start = scheme ? strcmp(scheme, "never") != 0 : aps;
    } else if (!strcmp(type, "Replace")) {
        const char *pat, *content;
        int regex;
        DT_CHECK(get_pattern(t, o, at, &pat, &regex));
        if (regex)
            return dt_error(DT_STATUS_UNSUPPORTED, "%s: %s.pattern: a Replace decoder on a regex is not supported",
                            t->path, at);
        if (!*pat)
            return dt_error(DT_STATUS_FORMAT, "%s: %s.pattern: empty", t->path, at);
        DT_CHECK(get_str(t, o, "content", at, 1, &content));
        d.kind = DT_DEC_REPLACE, d.a = dt_xstrdup(pat), d.b = dt_xstrdup(content);
    } else if (!strcmp(type, "Strip")) {
        const char *content;
        DT_CHECK(get_str(t, o, "content", at, 1, &content));
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "start"), *b = cJSON_GetObjectItemCaseSensitive(o, "stop");
        if (!cJSON_IsNumber(a) || !cJSON_IsNumber(b))
            return dt_error(DT_STATUS_FORMAT, "%s: %s: Strip needs numbers start and stop", t->path, at);
        d.kind = DT_DEC_STRIP, d.a = dt_xstrdup(content), d.start = a->valueint, d.stop = b->valueint;
    } else {
        return dt_error(DT_STATUS_UNSUPPORTED, "%s: %s: decoder type \"%s\" is not supported", t->path, at, type);
    }
    t->decs = dt_xrealloc(t->decs, (size_t)(t->ndecs + 1) * sizeof *t->decs);
    t->decs[t->ndecs++] = d;
    return DT_STATUS_OK;
}

/* ---- the document token ---- */

/* The number of entries of o[name] (an object or array), 0 for anything else. */
static int entries(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
    return cJSON_IsObject(v) || cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
}

static int64_t find_token(const dt_tok_t *t, const char *s) {
    return s ? dt_tok_token_id(t, s) : -1;
}

static void pick_doc_token(dt_tok_t *t, const cJSON *root, const char *dir) {
    t->doc_token = find_token(t, "<|endoftext|>");
    if (t->doc_token >= 0)
        return;
    if (dir) {
        char path[4200];
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        char *text = NULL;
        if (dt_fs_read_file(path, 64u << 20, &text, NULL) == DT_STATUS_OK) {
            cJSON *cfg = cJSON_Parse(text);
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(cfg, "bos_token");
            if (cJSON_IsObject(b))
                b = cJSON_GetObjectItemCaseSensitive(b, "content");
            if (cJSON_IsString(b))
                t->doc_token = find_token(t, b->valuestring);
            cJSON_Delete(cfg);
            free(text);
        }
        dt_error_clear();
        if (t->doc_token >= 0)
            return;
    }
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    for (const cJSON *p = cJSON_IsArray(single) ? single->child : NULL; p; p = p->next) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(p, "SpecialToken");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(sp, "id");
        if (cJSON_IsString(id) && (t->doc_token = find_token(t, id->valuestring)) >= 0)
            return;
    }
    t->doc_token = find_token(t, "<|begin_of_text|>");
    if (t->doc_token < 0)
        t->doc_token = find_token(t, "<s>");
}

static void describe(dt_tok_t *t) {
    const char *split = t->split == DT_SPLIT_GPT2 ? ", GPT-2 split" : t->split == DT_SPLIT_LLAMA3 ? ", Llama 3 split"
                        : t->split == DT_SPLIT_QWEN2 ? ", Qwen2 split" : "";
    snprintf(t->describe, sizeof t->describe, "BPE (%s%s%s%s)", t->byte_level ? "byte-level" : "characters",
             t->byte_fallback ? ", byte fallback" : "", split, t->metaspace ? ", Metaspace" : "");
}

dt_status_t dt_tok_load(const char *path, dt_tok_t **out) {
    *out = NULL;
    dt_tok_bytes_init();
    struct stat sb;
    char file[4096];
    const char *dir = NULL;
    char dirbuf[4096];
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        snprintf(dirbuf, sizeof dirbuf, "%s", path);
        dir = dirbuf;
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dirbuf, sizeof dirbuf, "%s", path);
        char *slash = strrchr(dirbuf, '/');
        if (slash) {
            *slash = 0;
            dir = dirbuf;
        } else {
            dir = ".";
        }
    }
    char *text = NULL;
    size_t len = 0;
    dt_status_t st = dt_fs_read_file(file, TOK_MAX_FILE, &text, &len);
    if (st != DT_STATUS_OK)
        return dt_error_prefix(st, "tokenizer %s", file);
    dt_tok_t *t = dt_xcalloc(1, sizeof *t);
    t->path = dt_xstrdup(file);
    t->unk_id = -1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        int line = 1;
        for (const char *p = text; end && p < end; p++)
            line += *p == '\n';
        st = dt_error(DT_STATUS_FORMAT, "%s: line %d: JSON syntax error", file, line);
        goto out_free_text;
    }
    if (!cJSON_IsObject(root)) {
        st = dt_error(DT_STATUS_FORMAT, "%s: expected a JSON object at the top", file);
        goto out_free_json;
    }
    t->id_limit = DT_TOK_ID_SLACK + (uint64_t)entries(cJSON_GetObjectItemCaseSensitive(root, "model"), "vocab") +
                  (uint64_t)entries(root, "added_tokens");
    if ((st = load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"))) != DT_STATUS_OK ||
        (st = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))) != DT_STATUS_OK ||
        (st = load_norm(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer")) != DT_STATUS_OK ||
        (st = load_pretok(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pre_tokenizer")) !=
            DT_STATUS_OK ||
        (st = load_dec(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), "decoder")) != DT_STATUS_OK)
        goto out_free_json;
    if ((st = check_norm_growth(t)) != DT_STATUS_OK) goto out_free_json;
    if (t->metaspace && (t->byte_level || t->split != DT_SPLIT_NONE)) {
        st = dt_error(DT_STATUS_UNSUPPORTED, "%s: pre_tokenizer: Metaspace together with ByteLevel or Split is not "
                      "supported", file);
        goto out_free_json;
    }
    pick_doc_token(t, root, dir);
    describe(t);
    dt_tok_chunk_init(t);
    dt_tok_cut_init(t);
out_free_json:
    cJSON_Delete(root);
out_free_text:
    free(text);
    if (st != DT_STATUS_OK)
        dt_tok_free(t);
    else
        *out = t;
    return st;
}

void dt_tok_free(dt_tok_t *t) {
    if (!t)
        return;
    for (uint32_t i = 0; i < t->nvocab; i++)
        free(t->tokens[i]);
    free(t->tokens);
    free(t->tok_len);
    free(t->vocab.slot);
    free(t->merges.key);
    free(t->merges.rank);
    free(t->merges.merged);
    for (int i = 0; i < t->nnorms; i++)
        free(t->norms[i].a), free(t->norms[i].b);
    free(t->norms);
    for (int i = 0; i < t->nadded; i++)
        free(t->added[i].content);
    free(t->added);
    free(t->added_idx);
    dt_tok_chunk_free(t);
    dt_tok_cut_free(t);
    for (int i = 0; i < t->ndecs; i++)
        free(t->decs[i].a), free(t->decs[i].b);
    free(t->decs);
    free(t->meta_repl);
    free(t->path);
    free(t);
}
