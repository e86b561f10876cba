/*
 * cudalib.h - the CUDA library (libdtrun_cuda.so: the CUDA device ops and the
 * NCCL communicator), loaded on demand by the workers that use a GPU. dtrun
 * itself links no CUDA library, so the agent, `config`, `plan` and CPU workers
 * start without mapping one; this loader knows no CUDA types, only symbol names.
 *
 * Where the library's symbols come from, in this order:
 *   1. the process itself (test binaries that link the CUDA objects statically);
 *   2. DT_CUDALIB_NAME beside the running binary (/proc/self/exe's folder);
 *   3. the dynamic loader's search path (LD_LIBRARY_PATH, ld.so.cache, ...).
 * Before 2 or 3 the library's own CUDA dependencies (DT_CUDALIB_DEPS, sonames)
 * are loaded RTLD_GLOBAL: from the system's search path, else from the
 * nvidia/<pkg>/lib folders of an installed PyTorch, as torch finds them.
 */
#ifndef DT_COMMON_CUDALIB_H
#define DT_COMMON_CUDALIB_H

#include <stddef.h>

#include "common/status.h"

/* The library and the binary agree on this number (the layout of dt_device_t,
 * dt_ops_t and the communicator's backend table); bump it when those change,
 * the arguments of an op included (the sizes DT_KERNELS_LAYOUT checks do not show
 * those; 2: the positions of packed sequences; 3: copy_2d in the op table). The
 * library exports it as `const int dt_cudalib_abi`. */
#define DT_CUDALIB_ABI 3

/* The file name of the library this binary loads ("libdtrun_cuda.so"; the CPU
 * emulator's build has its own). */
const char *dt_cudalib_name(void);

/* Whether the library can be had, found WITHOUT loading it (safe in the agent):
 * its symbols are in the process, or the file exists beside the binary or in a
 * folder of LD_LIBRARY_PATH. Writes where (or "(linked in)") to path when found.
 * Returns 1 or 0. Its CUDA dependencies are not checked (dt_cudalib_load does). */
int dt_cudalib_present(char *path, size_t len);

/* Loads the library once (thread-safe; later calls return the first answer).
 * UNSUPPORTED, with one message naming the missing library and every place
 * looked, when it or a dependency cannot be loaded; also when its ABI differs. */
dt_status_t dt_cudalib_load(void);

/* A symbol of the library (loading it first). UNSUPPORTED when the library is
 * not loadable or lacks the symbol (e.g. no NCCL in the emulator's build). */
dt_status_t dt_cudalib_sym(const char *name, void **out);

/* A symbol of the library that relies on a header the binary shares with it:
 * the library exports `layout_sym`, an unsigned long holding what the header's
 * layout value (`layout`: struct sizes, e.g. DT_KERNELS_LAYOUT) was when it was
 * compiled. A stale library (another value) is UNSUPPORTED naming `header` and
 * both values, so its code is never called through the wrong offsets. */
dt_status_t dt_cudalib_sym_checked(const char *name, const char *layout_sym, unsigned long layout,
                                   const char *header, void **out);

/* Where the loaded library came from ("(linked in)" or its path); NULL when it
 * has not been loaded. */
const char *dt_cudalib_path(void);

#endif /* DT_COMMON_CUDALIB_H */
