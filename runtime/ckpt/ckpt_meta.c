/*
 * ckpt_meta.c - the numbers of a checkpoint's meta.json, read with their bounds
 * (checkpoint.h): every integer the loaders use (world size, step, ranges, the
 * model's keys, data positions) must be a JSON number that is whole, finite and
 * inside the range its use allows, or the load fails with an error naming the
 * meta.json, the field and the value it holds. A value is never cast to a
 * narrower type before it is checked (2^40 ranks would read as 0, 2^31 layers as
 * a negative count) and never cast at all when it is not finite (1e309 parses as
 * infinity; casting that to an integer is undefined).
 */
#include "common/fs.h" /* defines: dt_fs_printable */
#include "runtime/ckpt/ckpt_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* What v holds, for an error message: a number as written back, a string quoted
 * and escaped, else the JSON type. */
static const char *describe(const cJSON *v, char *buf, size_t len) {
    if (cJSON_IsNumber(v)) {
        if (!isfinite(v->valuedouble)) return "a number out of range (not finite)";
        snprintf(buf, len, "%.15g", v->valuedouble); /* 1e+300, not 1.0000000000000001e+300 */
        if (strtod(buf, NULL) != v->valuedouble) snprintf(buf, len, "%.17g", v->valuedouble);
    } else if (cJSON_IsString(v)) {
        char esc[64];
        dt_fs_printable(v->valuestring, esc, sizeof esc);
        snprintf(buf, len, "the string \"%s\"", esc);
    } else if (cJSON_IsBool(v)) {
        snprintf(buf, len, "%s", cJSON_IsTrue(v) ? "true" : "false");
    } else if (cJSON_IsNull(v)) {
        snprintf(buf, len, "null");
    } else {
        snprintf(buf, len, "%s", cJSON_IsArray(v) ? "a list" : "an object");
    }
    return buf;
}

dt_status_t dt_ckpt_meta_uint(const struct cJSON *v, uint64_t min, uint64_t max, const char *mpath,
                              const char *field, uint64_t *out) {
    if (max > DT_CKPT_META_INT_MAX) max = DT_CKPT_META_INT_MAX; /* doubles are exact up to here */
    char want[96], got[96];
    if (min == max) snprintf(want, sizeof want, "expected %llu", (unsigned long long)min);
    else snprintf(want, sizeof want, "expected an integer from %llu to %llu", (unsigned long long)min,
                  (unsigned long long)max);
    if (!v) return dt_error(DT_STATUS_FORMAT, "%s: '%s' is missing (%s)", mpath, field, want);
    double d = v->valuedouble;
    /* Bounds first, on the double: only then is the cast to uint64_t defined. */
    if (!cJSON_IsNumber(v) || !isfinite(d) || d < (double)min || d > (double)max || d != floor(d))
        return dt_error(DT_STATUS_FORMAT, "%s: '%s' is %s, %s", mpath, field, describe(v, got, sizeof got), want);
    *out = (uint64_t)d;
    return DT_STATUS_OK;
}

dt_status_t dt_ckpt_meta_number(const struct cJSON *v, double min, double max, const char *mpath,
                                const char *field, double *out) {
    char got[96];
    if (!v) return dt_error(DT_STATUS_FORMAT, "%s: '%s' is missing (expected a number from %g to %g)", mpath, field, min, max);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < min || v->valuedouble > max)
        return dt_error(DT_STATUS_FORMAT, "%s: '%s' is %s, expected a number from %g to %g", mpath, field,
                        describe(v, got, sizeof got), min, max);
    *out = v->valuedouble;
    return DT_STATUS_OK;
}
