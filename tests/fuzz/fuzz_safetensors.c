/*
 * fuzz_safetensors.c - libFuzzer target for a safetensors file's header
 * (runtime/ckpt/st_read.c), built by `make fuzz`.
 *
 * The input is written as a .safetensors file and opened. A file that opens
 * must keep st_read.c's promises (safetensors.h): each tensor's shape holds
 * exactly numel elements (counted without overflow), its bytes are
 * numel * dtype size and lie inside the data area, and every name is found;
 * then the first elements of each tensor are read.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/ckpt/safetensors.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("model.safetensors", data, size);
    char path[512];
    fuzz_path(path, sizeof path, "model.safetensors");
    dt_st_file_t *f = NULL;
    if (dt_st_open(path, &f) != DT_STATUS_OK) return 0;
    uint64_t hlen = 0;
    for (int b = 0; b < 8; b++) hlen |= (uint64_t)data[b] << (8 * b);
    uint64_t data_bytes = size - 8 - hlen;
    for (int i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_at(f, i);
        unsigned __int128 numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (unsigned __int128)t->shape[d];
        if (numel != t->numel) abort(); /* the shape's product wrapped */
        if (t->begin > t->end || t->end > data_bytes) abort();
        if ((unsigned __int128)t->numel * dt_st_dtype_size(t->dtype) != t->end - t->begin) abort();
        if (dt_st_find(f, t->name) != t) abort();
        float buf[16];
        size_t n = t->numel < 16 ? t->numel : 16;
        if (dt_st_copy_f32(f, t, 0, n, buf) != DT_STATUS_OK) abort();
    }
    dt_st_close(f);
    return 0;
}
