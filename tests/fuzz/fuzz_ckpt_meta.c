/*
 * fuzz_ckpt_meta.c - libFuzzer target for a checkpoint's meta.json
 * (runtime/ckpt/ckpt_load.c, ckpt_meta.c), built by `make fuzz`.
 *
 * The folder is a step directory, step_00000005, holding a 64-byte
 * shard_00000.bin made once; the input is written as its meta.json and the
 * checkpoint opened. One that opens is asked for its model spec, a config key and
 * the first elements of "params" (checksums are checked: a mismatch is an error,
 * never a read outside the shard).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "runtime/ckpt/checkpoint.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char step[512];
    if (!step[0]) {
        fuzz_path(step, sizeof step, "step_00000005");
        if (mkdir(step, 0700) != 0) abort();
        uint8_t zeros[64] = {0};
        fuzz_write("step_00000005/shard_00000.bin", zeros, sizeof zeros);
    }
    fuzz_write("step_00000005/meta.json", data, size);
    dt_ckpt_t *c = NULL;
    if (dt_ckpt_open(step, &c) != DT_STATUS_OK) return 0;
    if (dt_ckpt_world_size(c) < 1 || dt_ckpt_step(c) < 0) abort();
    dt_model_spec spec;
    (void)dt_ckpt_model_spec(c, &spec);
    (void)dt_ckpt_meta_config_int(c, "seq_len");
    float out[16];
    uint64_t n = dt_ckpt_n_params(c) < 16 ? dt_ckpt_n_params(c) : 16;
    (void)dt_ckpt_read(c, "params", 0, n, out);
    dt_ckpt_close(c);
    return 0;
}
