/*
 * shard.h - llm.c token shards: the one definition of the format, read by the data
 * loader and written by `dtrun tokenize`.
 *
 * A shard is a 1024-byte header of 256 little-endian int32 (magic, version, token
 * count, then dtrun's own: [3] the vocabulary size the ids come from, the
 * tokenizer's, 0 when not recorded as llm.c writes it; the rest zero) followed by
 * the tokens:
 *   magic 20240520 version 1: uint16 tokens (GPT-2-sized vocabularies)
 *   magic 20240801 version 7: uint32 tokens (llm.c's Llama 3 shards)
 */
#ifndef DT_RUNTIME_TOKENIZE_SHARD_H
#define DT_RUNTIME_TOKENIZE_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define DT_SHARD_HEADER_BYTES 1024
#define DT_SHARD_MAGIC_U16 20240520
#define DT_SHARD_VERSION_U16 1
#define DT_SHARD_MAGIC_U32 20240801
#define DT_SHARD_VERSION_U32 7
#define DT_SHARD_HEADER_VOCAB 3 /* header[3]: the vocabulary size (0: unknown) */

/* The loss mask beside a shard (`dtrun tokenize --chat`): SHARD.mask, a 1024-byte
 * header of 256 int32 (magic, version, token count: the shard's) and then one byte
 * per token of the shard: bit 0 (DT_MASK_TRAIN) the token is trained on as a
 * target (its loss counts), bit 1 (DT_MASK_DOC) the token begins a document. The
 * data loader packs such documents into sequences (runtime/train/data.h). */
#define DT_MASK_MAGIC 20261205
#define DT_MASK_VERSION 1
#define DT_MASK_TRAIN 1
#define DT_MASK_DOC 2
#define DT_MASK_SUFFIX ".mask"

/* Checks a mapped mask (path for errors) against its shard's ntok: header, magic,
 * version, count equal to ntok, size header + ntok, no bit above DT_MASK_DOC set. */
dt_status_t dt_mask_parse(const char *path, const void *map, size_t len, uint64_t ntok);
/* Fills a mask header for ntok tokens (DT_STATUS_LIMIT past INT32_MAX). */
dt_status_t dt_mask_header(uint64_t ntok, int32_t header[256]);

/* 1 when the first 4 bytes are one of the two magics. */
int dt_shard_is_magic(int32_t magic);

/* Checks a mapped shard (path for errors): size at least the header, a known
 * magic with its version, a non-negative count, and a file size equal to header +
 * count * width. Sets *token_bytes (2 or 4) and *ntok. */
dt_status_t dt_shard_parse(const char *path, const void *map, size_t len, int *token_bytes,
                           uint64_t *ntok);

/* Fills a 1024-byte header for ntok tokens of token_bytes (2 or 4) each. ntok
 * must fit the header's int32 count (DT_STATUS_LIMIT otherwise). */
dt_status_t dt_shard_header(int token_bytes, uint64_t ntok, int32_t header[256]);

/* The token width a vocabulary needs: 2 when every id fits 16 bits, else 4. */
int dt_shard_token_bytes(uint32_t vocab_size);

#endif /* DT_RUNTIME_TOKENIZE_SHARD_H */
