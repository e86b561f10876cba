/*
 * cuemu_internal.h - shared between the emulator's own files (cuemu.cc: fibers and
 * launches; cuemu_runtime.cc: memory, streams, events, errors; cuemu_blas.cc:
 * cuBLASLt and cuBLAS; cuemu_wmma.cc: tensor cores). Not for kernels.
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

/* With DTRUN_CUEMU_HOST_GUARD=1, device memory is PROT_NONE to the host, so host code
 * that dereferences a device pointer faults as it would on a GPU. The emulator opens
 * it while it works (device_access: the lock plus access, for kernels, copies and
 * cuBLAS). Off by default: two mprotect calls per buffer per call cost more system
 * time than the rest of the emulator when other threads (OpenBLAS) share the mm. */
void device_mem_open(void);
void device_mem_close(void);
bool device_mem_guarded(uintptr_t a); /* a is in a device buffer closed to the host now */
/* SIGSEGV/SIGBUS handler that names the kernel, thread and buffer (installed on first use). */
void install_fault_handler(void);
struct device_access {
    std::lock_guard<std::recursive_mutex> lock;
    device_access() : lock(g_lock) { device_mem_open(); }
    ~device_access() { device_mem_close(); }
    device_access(const device_access &) = delete;
    device_access &operator=(const device_access &) = delete;
};

/* WMMA (cuemu_wmma.cc): one lane's arguments checked against CUDA's rules (false and a
 * reason in why when broken); the lane whose arguments differ from lane 0's (-1: none);
 * the collective itself, run once with every lane's arguments. */
bool wmma_check_lane(const wmma_args *a, char *why, size_t len);
int wmma_mismatch(wmma_args *const lanes[32], char *why, size_t len);
void wmma_run(wmma_args *const lanes[32]);

/* Call counters a test reads through cuemu_counter() (cuemu.h). */
enum counter { COUNT_STREAM_SYNC, COUNT_EVENT_SYNC, COUNT_BLAS_CALL, COUNT_N_ };
void count(counter c);

} /* namespace cuemu */

#endif /* DT_TESTS_CUEMU_INTERNAL_H */
