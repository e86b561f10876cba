/*
 * lora_config.c - PEFT's adapter_config.json against the config's lora section
 * (lora_config.h).
 */
#include "runtime/model/lora_config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fs.h" /* defines: dt_fs_read_file, dt_fs_printable */

const char *dt_lora_default_targets(const char *model) {
    if (!strcmp(model, "gpt")) return "c_attn";
    return "q_proj,v_proj";
}

int dt_lora_peft_config_path(const char *init, char *buf, size_t len) {
    struct stat sb;
    if (stat(init, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(buf, len, "%s/adapter_config.json", init);
    } else {
        const char *slash = strrchr(init, '/');
        if (slash) snprintf(buf, len, "%.*s/adapter_config.json", (int)(slash - init), init);
        else snprintf(buf, len, "adapter_config.json");
    }
    return lstat(buf, &sb) == 0;
}

/* A value as the message shows it: its JSON text, cut short and escaped. */
static const char *shown(const cJSON *v, char *buf, size_t len) {
    char *s = cJSON_PrintUnformatted(v);
    char cut[96];
    snprintf(cut, sizeof cut, "%s", s ? s : "?");
    if (s && strlen(s) >= sizeof cut) snprintf(cut + sizeof cut - 4, 4, "...");
    free(s);
    dt_fs_printable(cut, buf, len);
    return buf;
}

/* A JSON value that says "unset" for an optional PEFT field: absent, null, false,
 * an empty object or list. */
static int unset(const cJSON *v) {
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) || ((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child);
}

static dt_status_t read_targets(const char *path, const cJSON *v, dt_lora_peft_config *out) {
    char b[128];
    out->n_targets = -1;
    if (!v || cJSON_IsNull(v)) return DT_STATUS_OK;
    if (cJSON_IsString(v))
        return dt_error(DT_STATUS_CONFIG, "%s: target_modules is the string %s, which PEFT reads as a regular "
                        "expression: dtrun reads a list of module names", path, shown(v, b, sizeof b));
    if (!cJSON_IsArray(v))
        return dt_error(DT_STATUS_CONFIG, "%s: target_modules: expected a list of module names, found %s", path,
                        shown(v, b, sizeof b));
    out->n_targets = 0;
    for (const cJSON *e = v->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strlen(e->valuestring) >= DT_LORA_NAME_LEN)
            return dt_error(DT_STATUS_CONFIG, "%s: target_modules: expected module names of 1 to %d characters, "
                            "found %s", path, DT_LORA_NAME_LEN - 1, shown(e, b, sizeof b));
        int dup = 0;
        for (int i = 0; i < out->n_targets; i++) dup |= !strcmp(out->targets[i], e->valuestring);
        if (dup) continue; /* PEFT keeps them as a set */
        if (out->n_targets == DT_LORA_MAX_TARGETS)
            return dt_error(DT_STATUS_CONFIG, "%s: target_modules: more than %d names", path, DT_LORA_MAX_TARGETS);
        snprintf(out->targets[out->n_targets++], DT_LORA_NAME_LEN, "%s", e->valuestring);
    }
    return DT_STATUS_OK;
}

/* The PEFT options dtrun does not implement, refused when set. */
static dt_status_t refuse_unimplemented(const char *path, const cJSON *root) {
    static const struct {
        const char *key, *why;
    } opts[] = {
        {"use_rslora", "dtrun scales the adapters by lora_alpha / r (rsLoRA's lora_alpha / sqrt(r) is not implemented)"},
        {"use_dora", "DoRA's magnitude vectors are not implemented"},
        {"rank_pattern", "per-module ranks are not implemented (one r for every module)"},
        {"alpha_pattern", "per-module alphas are not implemented (one lora_alpha for every module)"},
        {"layers_to_transform", "dtrun adapts the target modules of every layer"},
        {"modules_to_save", "dtrun would drop the full weights saved for those modules"},
    };
    char b[128];
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, opts[i].key);
        if (!unset(v))
            return dt_error(DT_STATUS_CONFIG, "%s: %s is %s: %s", path, opts[i].key, shown(v, b, sizeof b), opts[i].why);
    }
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "bias");
    if (bias && !cJSON_IsNull(bias) && !(cJSON_IsString(bias) && !strcmp(bias->valuestring, "none")))
        return dt_error(DT_STATUS_CONFIG, "%s: bias is %s: dtrun's LoRA trains no biases (only \"none\")", path,
                        shown(bias, b, sizeof b));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "LORA")))
        return dt_error(DT_STATUS_CONFIG, "%s: peft_type is %s: dtrun reads LoRA adapters (\"LORA\")", path,
                        shown(type, b, sizeof b));
    return DT_STATUS_OK;
}

dt_status_t dt_lora_peft_config_read(const char *path, dt_lora_peft_config *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", path);
    out->r = 8, out->alpha = 8, out->n_targets = -1;
    char *text = NULL, b[128];
    size_t len = 0;
    dt_status_t st = dt_fs_read_file(path, DT_LORA_CONFIG_MAX, &text, &len);
    if (st != DT_STATUS_OK) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        st = dt_error(DT_STATUS_CONFIG, "%s: expected a JSON object (PEFT's adapter_config.json)", path);
        goto out_free;
    }
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
    if (r) {
        if (!cJSON_IsNumber(r) || !(r->valuedouble >= 1 && r->valuedouble <= 65536) ||
            floor(r->valuedouble) != r->valuedouble) {
            st = dt_error(DT_STATUS_CONFIG, "%s: r: expected an integer from 1 to 65536, found %s", path,
                          shown(r, b, sizeof b));
            goto out_free;
        }
        out->r = (int)r->valuedouble;
    }
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    if (a) {
        if (!cJSON_IsNumber(a) || !(a->valuedouble > 0 && a->valuedouble <= 1e9)) {
            st = dt_error(DT_STATUS_CONFIG, "%s: lora_alpha: expected a number in (0, 1e9], found %s", path,
                          shown(a, b, sizeof b));
            goto out_free;
        }
        out->alpha = a->valuedouble;
    }
    const cJSON *ff = cJSON_GetObjectItemCaseSensitive(root, "fan_in_fan_out");
    if (ff && !cJSON_IsBool(ff) && !cJSON_IsNull(ff)) {
        st = dt_error(DT_STATUS_CONFIG, "%s: fan_in_fan_out: expected true or false, found %s", path,
                      shown(ff, b, sizeof b));
        goto out_free;
    }
    out->fan_in_fan_out = cJSON_IsTrue(ff);
    DT_CHECK_GOTO(read_targets(path, cJSON_GetObjectItemCaseSensitive(root, "target_modules"), out), st, out_free);
    st = refuse_unimplemented(path, root);
out_free:
    cJSON_Delete(root);
    return st;
}

/* A list's names as "[a, b]" into buf. */
static const char *list_str(const dt_lora_spec *l, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < l->n_targets && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", l->targets[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

static int has_name(const dt_lora_spec *l, const char *s) {
    for (int i = 0; i < l->n_targets; i++)
        if (!strcmp(l->targets[i], s)) return 1;
    return 0;
}

/* "a,b" (names shorter than DT_LORA_NAME_LEN, at most DT_LORA_MAX_TARGETS) into l. */
static void split_names(const char *list, dt_lora_spec *l) {
    l->n_targets = 0;
    for (const char *p = list; *p && l->n_targets < DT_LORA_MAX_TARGETS;) {
        size_t n = strcspn(p, ",");
        snprintf(l->targets[l->n_targets++], DT_LORA_NAME_LEN, "%.*s", (int)n, p);
        p += n + (p[n] == ',');
    }
}

dt_status_t dt_lora_peft_config_check(const dt_lora_peft_config *pc, const dt_lora_spec *spec, const char *model) {
    const char *p = pc->path;
    if (pc->r != spec->r)
        return dt_error(DT_STATUS_CONFIG, "%s: r is %d, the config's lora.r is %d: the adapter was trained with "
                        "another rank", p, pc->r, spec->r);
    if (fabs(pc->alpha - spec->alpha) > 1e-9 * fmax(1, fabs(spec->alpha)))
        return dt_error(DT_STATUS_CONFIG, "%s: lora_alpha is %g, the config's lora.alpha is %g: the adapter's scale "
                        "(alpha / r) would change", p, pc->alpha, spec->alpha);
    dt_lora_spec theirs; /* the adapter's targets, PEFT's default for the model when null */
    memset(&theirs, 0, sizeof theirs);
    if (pc->n_targets < 0) {
        split_names(dt_lora_default_targets(model), &theirs);
    } else {
        theirs.n_targets = pc->n_targets;
        memcpy(theirs.targets, pc->targets, sizeof pc->targets);
    }
    int same = theirs.n_targets == spec->n_targets; /* both are sets: no name twice */
    for (int i = 0; same && i < theirs.n_targets; i++) same = has_name(spec, theirs.targets[i]);
    if (!same) {
        char a[DT_LORA_MAX_TARGETS * (DT_LORA_NAME_LEN + 2) + 4], c[sizeof a];
        return dt_error(DT_STATUS_CONFIG, "%s: target_modules is %s%s, the config's lora.target_modules is %s: the "
                        "adapter adapts other modules", p, list_str(&theirs, a, sizeof a),
                        pc->n_targets < 0 ? " (null: PEFT's default)" : "", list_str(spec, c, sizeof c));
    }
    if (pc->fan_in_fan_out && strcmp(model, "gpt") != 0)
        return dt_error(DT_STATUS_CONFIG, "%s: fan_in_fan_out is true: dtrun's %s has nn.Linear layers (out, in); "
                        "an (in, out) layout is not implemented for it", p, model);
    return DT_STATUS_OK;
}
