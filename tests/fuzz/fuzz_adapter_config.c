/*
 * fuzz_adapter_config.c - libFuzzer target for a PEFT adapter_config.json
 * (runtime/model/lora_config.c), built by `make fuzz`.
 *
 * The input is written as the adapter folder's adapter_config.json, read, and
 * held against a fixed lora section (r 4, alpha 8, q_proj and v_proj) for both
 * model families.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/model/lora_config.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("adapter_config.json", data, size);
    char path[512];
    if (!dt_lora_peft_config_path(fuzz_dir(), path, sizeof path)) abort();
    static dt_lora_peft_config pc;
    if (dt_lora_peft_config_read(path, &pc) != DT_STATUS_OK) return 0;
    if (pc.r < 1 || pc.r > 65536 || !(pc.alpha > 0) || pc.n_targets > DT_LORA_MAX_TARGETS) abort();
    dt_lora_spec spec = {.r = 4, .alpha = 8, .n_targets = 2, .targets = {"q_proj", "v_proj"}};
    (void)dt_lora_peft_config_check(&pc, &spec, "llama");
    (void)dt_lora_peft_config_check(&pc, &spec, "gpt");
    return 0;
}
