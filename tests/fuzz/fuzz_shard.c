/*
 * fuzz_shard.c - libFuzzer target for token shards (runtime/tokenize/shard.c's
 * header reader) and the data loader's open of a shard (runtime/train/data.c),
 * built by `make fuzz`.
 *
 * Byte 0 picks seq_len (1 to 16) and whether the vocabulary is GPT-2's or 2^20;
 * the rest is the file. The header is parsed from memory; then the file is
 * opened as the training data (a shard or, without a magic, text), and the first
 * training and validation batches read: every id read must be below the vocab.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/tokenize/shard.h"
#include "runtime/train/data.h"
#include "tests/fuzz/fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int seq_len = 1 + (data[0] & 15);
    int vocab = data[0] & 16 ? 1 << 20 : DT_DATA_GPT2_VOCAB;
    data++, size--;
    int width;
    uint64_t ntok;
    if (dt_shard_parse("fuzz.bin", data, size, &width, &ntok) == DT_STATUS_OK &&
        DT_SHARD_HEADER_BYTES + ntok * (uint64_t)width != size)
        abort();
    fuzz_write("train.bin", data, size);
    char path[512];
    fuzz_path(path, sizeof path, "train.bin");
    (void)dt_data_check_files("data.train", path, seq_len, vocab, 0.25);
    dt_data_opts o = {.train = path, .val_fraction = 0.25, .seq_len = seq_len, .vocab_size = vocab,
                      .seed = 1, .rank = 0, .world_size = 1, .micro_batch = 2};
    dt_data_t *d = NULL;
    if (dt_data_open(&o, &d) != DT_STATUS_OK) return 0;
    int32_t in[2 * 16], tg[2 * 16];
    int limit = dt_data_kind(d) == DT_DATA_TEXT ? 256 : vocab;
    for (int step = 0; step < 2; step++) {
        if (dt_data_next(d, in, tg) != DT_STATUS_OK) break;
        for (int i = 0; i < 2 * seq_len; i++)
            if (in[i] < 0 || in[i] >= limit || tg[i] < 0 || tg[i] >= limit) abort();
    }
    (void)dt_data_val_batch(d, 0, in, tg);
    dt_data_close(d);
    return 0;
}
