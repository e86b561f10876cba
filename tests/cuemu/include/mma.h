/*
 * mma.h - what `#include <mma.h>` finds in the emulator build (cuemu.mk puts
 * tests/cuemu/include first on the .cu files' include path): nothing of its own.
 * nvcuda::wmma is declared by tests/cuemu/cuemu.h, which is force-included before
 * every .cu file; see the WMMA entry of its list for what exists.
 */
#ifndef DT_TESTS_CUEMU_MMA_H
#define DT_TESTS_CUEMU_MMA_H
#ifndef DT_TESTS_CUEMU_H
#error "tests/cuemu/include/mma.h: only for .cu files built against tests/cuemu/cuemu.h"
#endif
#endif /* DT_TESTS_CUEMU_MMA_H */
