/*
 * shard.c - llm.c token shard headers: parse (with errors naming the file) and make.
 */
#include "runtime/tokenize/shard.h"

#include <stdint.h>
#include <string.h>

int dt_shard_is_magic(int32_t magic) {
    return magic == DT_SHARD_MAGIC_U16 || magic == DT_SHARD_MAGIC_U32;
}

dt_status_t dt_shard_parse(const char *path, const void *map, size_t len, int *token_bytes,
                           uint64_t *ntok) {
    if (len < DT_SHARD_HEADER_BYTES)
        return dt_error(DT_STATUS_FORMAT, "%s: truncated: %zu bytes, shorter than the %d-byte header",
                        path, len, DT_SHARD_HEADER_BYTES);
    int32_t hdr[3];
    memcpy(hdr, map, sizeof hdr);
    int width, want_version;
    if (hdr[0] == DT_SHARD_MAGIC_U16) {
        width = 2;
        want_version = DT_SHARD_VERSION_U16;
    } else if (hdr[0] == DT_SHARD_MAGIC_U32) {
        width = 4;
        want_version = DT_SHARD_VERSION_U32;
    } else {
        return dt_error(DT_STATUS_FORMAT, "%s: not a token shard: magic is %d, expected %d (uint16) or %d (uint32)",
                        path, hdr[0], DT_SHARD_MAGIC_U16, DT_SHARD_MAGIC_U32);
    }
    if (hdr[1] != want_version)
        return dt_error(DT_STATUS_FORMAT, "%s: unsupported shard version %d for magic %d (expected %d)", path,
                        hdr[1], hdr[0], want_version);
    if (hdr[2] < 0)
        return dt_error(DT_STATUS_FORMAT, "%s: negative token count %d in the header", path, hdr[2]);
    uint64_t want = DT_SHARD_HEADER_BYTES + (uint64_t)width * (uint64_t)hdr[2];
    if ((uint64_t)len != want)
        return dt_error(DT_STATUS_FORMAT, "%s: %s: the header says %d tokens (%llu bytes) but the file has %zu bytes",
                        path, len < want ? "truncated" : "trailing bytes", hdr[2], (unsigned long long)want, len);
    *token_bytes = width;
    *ntok = (uint64_t)hdr[2];
    return DT_STATUS_OK;
}

dt_status_t dt_shard_header(int token_bytes, uint64_t ntok, int32_t header[256]) {
    if (token_bytes != 2 && token_bytes != 4)
        return dt_error(DT_STATUS_INVALID, "shard token width %d (expected 2 or 4)", token_bytes);
    if (ntok > INT32_MAX)
        return dt_error(DT_STATUS_LIMIT, "%llu tokens exceed a shard's limit of %d (the header count is int32)",
                        (unsigned long long)ntok, INT32_MAX);
    memset(header, 0, 256 * sizeof header[0]);
    header[0] = token_bytes == 2 ? DT_SHARD_MAGIC_U16 : DT_SHARD_MAGIC_U32;
    header[1] = token_bytes == 2 ? DT_SHARD_VERSION_U16 : DT_SHARD_VERSION_U32;
    header[2] = (int32_t)ntok;
    return DT_STATUS_OK;
}

int dt_shard_token_bytes(uint32_t vocab_size) { return vocab_size <= 65536u ? 2 : 4; }

dt_status_t dt_mask_parse(const char *path, const void *map, size_t len, uint64_t ntok) {
    if (len < DT_SHARD_HEADER_BYTES)
        return dt_error(DT_STATUS_FORMAT, "%s: truncated: %zu bytes, shorter than the %d-byte header", path, len,
                        DT_SHARD_HEADER_BYTES);
    int32_t hdr[3];
    memcpy(hdr, map, sizeof hdr);
    if (hdr[0] != DT_MASK_MAGIC)
        return dt_error(DT_STATUS_FORMAT, "%s: not a loss mask: magic is %d, expected %d (`dtrun tokenize --chat`)",
                        path, hdr[0], DT_MASK_MAGIC);
    if (hdr[1] != DT_MASK_VERSION)
        return dt_error(DT_STATUS_FORMAT, "%s: unsupported mask version %d (expected %d)", path, hdr[1],
                        DT_MASK_VERSION);
    if (hdr[2] < 0 || (uint64_t)hdr[2] != ntok)
        return dt_error(DT_STATUS_FORMAT, "%s: the header counts %d tokens but its shard holds %llu", path, hdr[2],
                        (unsigned long long)ntok);
    if ((uint64_t)len != DT_SHARD_HEADER_BYTES + ntok)
        return dt_error(DT_STATUS_FORMAT, "%s: %s: %zu bytes, expected %llu (header + one byte per token)", path,
                        (uint64_t)len < DT_SHARD_HEADER_BYTES + ntok ? "truncated" : "trailing bytes", len,
                        (unsigned long long)(DT_SHARD_HEADER_BYTES + ntok));
    const uint8_t *m = (const uint8_t *)map + DT_SHARD_HEADER_BYTES;
    for (uint64_t i = 0; i < ntok; i++)
        if (m[i] & ~(DT_MASK_TRAIN | DT_MASK_DOC))
            return dt_error(DT_STATUS_FORMAT, "%s: byte %llu is 0x%02x: only bits 0 (trained) and 1 (document start) "
                            "are defined", path, (unsigned long long)i, m[i]);
    return DT_STATUS_OK;
}

dt_status_t dt_mask_header(uint64_t ntok, int32_t header[256]) {
    if (ntok > INT32_MAX)
        return dt_error(DT_STATUS_LIMIT, "%llu tokens exceed a mask's limit of %d (the header count is int32)",
                        (unsigned long long)ntok, INT32_MAX);
    memset(header, 0, 256 * sizeof header[0]);
    header[0] = DT_MASK_MAGIC;
    header[1] = DT_MASK_VERSION;
    header[2] = (int32_t)ntok;
    return DT_STATUS_OK;
}
