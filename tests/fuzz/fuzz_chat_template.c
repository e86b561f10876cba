/*
 * fuzz_chat_template.c - libFuzzer target for the chat template renderer
 * (runtime/tokenize/jinja_*.c), built by `make fuzz`.
 *
 * The input is a template: parsed, then rendered with a short conversation under
 * small limits (so that each input stays fast); any status is fine, a crash, a
 * sanitizer report or a hang is a finding. A successful render must hold its
 * generation spans inside the text.
 */
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/tokenize/jinja.h"

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \" sys \"}, {\"role\": \"user\", \"content\": \"héllo\\n\"},"
    " {\"role\": \"assistant\", \"content\": \"ok\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\":"
    " {\"a\": 1, \"b\": [2.5, null]}}}]}, {\"role\": \"tool\", \"content\": \"42\"}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"tools\": null}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static cJSON *vars;
    if (!vars) vars = cJSON_Parse(VARS);
    dt_jinja_t *t;
    if (dt_jinja_parse((const char *)data, size, "fuzz", &t) != DT_STATUS_OK) return 0;
    dt_jinja_limits lim = {.max_output = 1 << 20, .max_memory = 64 << 20, .max_steps = 20000, .max_depth = 16};
    dt_jinja_result res;
    if (dt_jinja_render(t, vars, &lim, &res) == DT_STATUS_OK) {
        for (size_t i = 0; i < res.nspans; i++)
            if (res.spans[i].start > res.spans[i].end || res.spans[i].end > res.len) abort();
        dt_jinja_result_free(&res);
    }
    dt_jinja_free(t);
    return 0;
}
