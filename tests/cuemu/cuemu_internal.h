/*
 * cuemu_internal.h - shared between the emulator's own files (cuemu.cc: fibers and
 * launches; cuemu_runtime.cc: memory, streams, events, errors; cuemu_blas.cc:
 * cuBLASLt and cuBLAS). Not for kernels.
 */
#ifndef DT_TESTS_CUEMU_INTERNAL_H
#define DT_TESTS_CUEMU_INTERNAL_H

#include <mutex>

#include "tests/cuemu/cuemu.h"

namespace cuemu {

/* The emulated GPU: an H100-like sm_90 part. */
constexpr int DEV_SMEM_PER_BLOCK = 48 * 1024;
constexpr int DEV_SMEM_PER_BLOCK_OPTIN = 232448;
constexpr int DEV_SM_COUNT = 132;

/* Held by launches, memory calls and cuBLAS(Lt) calls. */
extern std::recursive_mutex g_lock;

/* Records e as the calling thread's last error (when not cudaSuccess); returns e. */
cudaError_t fail(cudaError_t e);
extern thread_local cudaError_t t_last_error;
[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

bool device_present(void);
bool stream_valid(cudaStream_t s);
int func_smem_max(const void *fn);
void set_func_smem_max(const void *fn, int v);

/* Device memory: where a pointer lives. */
enum mem_kind { MEM_HOST, MEM_PINNED, MEM_DEVICE };
/* Kind of the allocation holding [p, p+n); for device/pinned memory the whole range
 * must lie inside one allocation (*inside false otherwise, with a message in why). */
mem_kind mem_classify(const void *p, size_t n, bool *inside, char *why, size_t whylen);
void describe_address(uintptr_t a, char *out, size_t len);
void describe_alloc_address(uintptr_t a, char *out, size_t len);
/* Aborts naming the kernel when a launch wrote past the end of a device buffer. */
void check_canaries(const char *kernel);

} /* namespace cuemu */

#endif /* DT_TESTS_CUEMU_INTERNAL_H */
