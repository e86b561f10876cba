/*
 * fuzz_hf_config.c - libFuzzer target for a Hugging Face config.json
 * (runtime/model/hf_config.c), built by `make fuzz`.
 *
 * The input is written as a folder's config.json and read as a model spec; a spec
 * that reads must hold every key inside the bounds the model's key table gives.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/model/hf_config.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("config.json", data, size);
    static dt_hf_config c;
    if (dt_hf_config_read(fuzz_dir(), &c) != DT_STATUS_OK) return 0;
    if (c.max_seq_len < 0 || c.sliding_window < 0 || c.seq_len_default < 0) abort();
    return 0;
}
