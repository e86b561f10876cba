/*
 * plan_msg.c - the expansion of the "{name}" placeholders in plan's messages
 * (plan.h's DT_PLAN_INPUT_MAP): each caller names the inputs in its own words.
 */
#include <string.h>

#include "runtime/tools/plan.h"

static const char *const input_names[DT_PLAN_INPUT_COUNT] = {
#define DT_PLAN_INPUT_NAME_(name) #name,
    DT_PLAN_INPUT_MAP(DT_PLAN_INPUT_NAME_)
#undef DT_PLAN_INPUT_NAME_
};

/* The table's index of the placeholder at p ("{name}"), its length in *n; -1 if none. */
static int placeholder(const char *p, size_t *n) {
    if (*p != '{') return -1;
    const char *end = strchr(p + 1, '}');
    if (!end) return -1;
    size_t k = (size_t)(end - p - 1);
    for (int i = 0; i < DT_PLAN_INPUT_COUNT; i++)
        if (strlen(input_names[i]) == k && !strncmp(p + 1, input_names[i], k)) {
            *n = k + 2;
            return i;
        }
    return -1;
}

char *dt_plan_msg_expand(const char *msg, const char *const words[DT_PLAN_INPUT_COUNT], char *out, size_t len) {
    size_t o = 0;
    for (const char *p = msg; *p && o + 1 < len;) {
        size_t n = 0;
        int i = placeholder(p, &n);
        if (i >= 0 && words[i]) {
            for (const char *w = words[i]; *w && o + 1 < len; w++) out[o++] = *w;
            p += n;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    return out;
}
