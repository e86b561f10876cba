/*
 * cuemu.cc - the CUDA emulator's runtime (see cuemu.h for what it offers): fibers
 * and the block scheduler, barriers and shuffles, launch validation, device memory
 * with poison and guard pages, streams and events, the error state.
 *
 * Execution model: a launch runs its blocks in order (x fastest, then y, z); within
 * a block every thread is a fiber with its own 64 KiB stack (a PROT_NONE page below
 * it), run round-robin by a scheduler on the launching OS thread. A fiber runs until
 * it waits at a barrier or returns; __syncthreads releases when every thread of the
 * block has arrived at the same barrier, a warp-level call when every lane its mask
 * names has arrived with the same mask. Anything CUDA leaves undefined that we can
 * see (a barrier after some threads exited, different barriers, a mask naming an
 * exited lane, a pass over the block where nothing can run) aborts with the kernel,
 * block and thread named. A global lock serialises launches and memory calls.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "tests/cuemu/cuemu_internal.h"

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

/* ---- context switch ---------------------------------------------------------------- */
#if defined(__x86_64__)
/* cuemu_switch(save, load): saves the callee-saved registers on the current stack,
 * stores the stack pointer in *save, and resumes the context whose stack pointer is
 * `load`. (MXCSR and the x87 control word are not switched: kernels do not change
 * them, and every fiber of a thread shares the thread's.) */
__asm__(".text\n"
        ".globl cuemu_switch\n"
        ".type cuemu_switch,@function\n"
        "cuemu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size cuemu_switch, .-cuemu_switch\n");
extern "C" void cuemu_switch(void **save, void *load);
#define CUEMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

namespace cuemu {

std::recursive_mutex g_lock;
thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess) t_last_error = e;
    return e;
}

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("cuemu: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    abort();
}

/* ---- fibers and the scheduler ---------------------------------------------------------- */
enum fiber_state { F_RUNNABLE, F_WAIT_BLOCK, F_WAIT_WARP, F_DONE };
enum warp_kind { W_NONE, W_SHFL, W_SYNCWARP, W_VOTE };

struct fiber {
    void *sp;
    char *map;            /* guard page + stack */
    size_t map_len;
#ifndef CUEMU_ASM_SWITCH
    ucontext_t uc;
#endif
    uint3 tid;
    int linear;
    fiber_state state;
    const char *file;     /* where it waits */
    int line;
    /* warp-level call in progress */
    warp_kind wkind;
    const char *wwhat;
    unsigned wmask;
    unsigned long long wbits, wresult;
    int wsrc;             /* lane to read, -1: own value */
};

struct warp_t {
    unsigned exists;  /* lanes the block has */
    unsigned exited;  /* lanes that returned */
    unsigned waiting; /* lanes waiting at a warp-level call */
};

struct sched_t {
    bool in_kernel = false;
    const launch_cfg *cfg = nullptr;
    void (*thunk)(void *) = nullptr;
    void *ctx = nullptr;
    std::vector<fiber *> fibers; /* pool; the first nthreads are the block's threads */
    int nthreads = 0;
    std::vector<warp_t> warps;
    fiber *cur = nullptr;
    void *sched_sp = nullptr;
#ifndef CUEMU_ASM_SWITCH
    ucontext_t sched_uc;
#endif
    int bar_waiting = 0, exited = 0;
    const char *bar_file = nullptr;
    int bar_line = 0;
    /* dynamic shared memory: one region, the block's bytes end at a PROT_NONE page */
    char *smem_map = nullptr;
    size_t smem_cap = 0; /* usable bytes before the guard page */
    unsigned char *smem = nullptr;
    size_t smem_bytes = 0;
    size_t stack_bytes = 0;
    pthread_t thread;
};
static sched_t S;

static size_t page_size(void) {
    static size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

static size_t stack_bytes(void) {
    if (!S.stack_bytes) {
        size_t kb = 64;
        const char *e = getenv("DTRUN_CUEMU_STACK_KB");
        if (e && atoi(e) >= 16) kb = (size_t)atoi(e);
        S.stack_bytes = kb * 1024;
    }
    return S.stack_bytes;
}

static fiber *fiber_new(void) {
    fiber *f = new fiber();
    f->map_len = stack_bytes() + page_size();
    void *m = mmap(nullptr, f->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) die("mmap of a %zu-byte fiber stack failed: %s", f->map_len, strerror(errno));
    f->map = (char *)m;
    if (mprotect(f->map, page_size(), PROT_NONE) != 0) die("mprotect of a stack guard failed: %s", strerror(errno));
    return f;
}

static void fiber_entry(void);

#ifndef CUEMU_ASM_SWITCH
static void fiber_entry_uc(void) { fiber_entry(); }
#endif

static void fiber_prepare(fiber *f) {
#ifdef CUEMU_ASM_SWITCH
    /* Stack tops staggered by the thread index: with every top at the same offset in its
     * page, the hot ends of a thousand stacks would fight over the same cache sets. */
    uintptr_t top = ((uintptr_t)(f->map + f->map_len) - (uintptr_t)(f->linear % 61) * 64) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                         /* fake return address: entry sees rsp % 16 == 8 */
    *--sp = (uint64_t)(uintptr_t)&fiber_entry;
    for (int i = 0; i < 6; i++) *--sp = 0; /* rbp rbx r12 r13 r14 r15 */
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->map + page_size();
    f->uc.uc_stack.ss_size = stack_bytes();
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, fiber_entry_uc, 0);
#endif
}

static inline void switch_to_fiber(fiber *f) {
    S.cur = f;
    threadIdx = f->tid;
#ifdef CUEMU_ASM_SWITCH
    cuemu_switch(&S.sched_sp, f->sp);
#else
    swapcontext(&S.sched_uc, &f->uc);
#endif
}

static inline void yield_to_scheduler(fiber *f) {
#ifdef CUEMU_ASM_SWITCH
    cuemu_switch(&f->sp, S.sched_sp);
#else
    swapcontext(&f->uc, &S.sched_uc);
#endif
}

/* "kernel 'k' grid (..) block (..) thread (..)" for messages. */
static const char *where(const fiber *f) {
    static char buf[512];
    const launch_cfg *c = S.cfg;
    if (!c) return "(outside a kernel)";
    int n = snprintf(buf, sizeof buf, "kernel '%s' <<<(%u,%u,%u), (%u,%u,%u)>>> block (%u,%u,%u)", c->name,
                     c->grid.x, c->grid.y, c->grid.z, c->block.x, c->block.y, c->block.z, blockIdx.x, blockIdx.y,
                     blockIdx.z);
    if (f && n > 0 && (size_t)n < sizeof buf)
        snprintf(buf + n, sizeof buf - (size_t)n, " thread (%u,%u,%u)", f->tid.x, f->tid.y, f->tid.z);
    return buf;
}

static void describe_wait(const fiber *f, char *out, size_t len) {
    switch (f->state) {
    case F_RUNNABLE: snprintf(out, len, "runnable"); break;
    case F_DONE: snprintf(out, len, "exited"); break;
    case F_WAIT_BLOCK: snprintf(out, len, "waits at __syncthreads() %s:%d", f->file, f->line); break;
    case F_WAIT_WARP:
        snprintf(out, len, "waits at %s(mask 0x%08x) %s:%d", f->wwhat, f->wmask, f->file, f->line);
        break;
    }
}

[[noreturn]] static void deadlock(const char *why) {
    fprintf(stderr, "cuemu: %s: %s; the threads of the block:\n", where(nullptr), why);
    int shown = 0;
    for (int i = 0; i < S.nthreads && shown < 40; i++) {
        fiber *f = S.fibers[(size_t)i];
        char d[300];
        describe_wait(f, d, sizeof d);
        /* Collapse runs of threads in the same state. */
        int j = i;
        while (j + 1 < S.nthreads) {
            char e[300];
            describe_wait(S.fibers[(size_t)j + 1], e, sizeof e);
            if (strcmp(d, e) != 0) break;
            j++;
        }
        if (j > i)
            fprintf(stderr, "  threads %d..%d: %s\n", i, j, d);
        else
            fprintf(stderr, "  thread %d (%u,%u,%u): %s\n", i, f->tid.x, f->tid.y, f->tid.z, d);
        shown++;
        i = j;
    }
    fflush(stderr);
    abort();
}

static void fiber_exit_checks(fiber *f) {
    if (S.bar_waiting > 0)
        die("%s returned while %d threads of its block wait at __syncthreads() %s:%d (a barrier in divergent "
            "code: undefined behaviour in CUDA)",
            where(f), S.bar_waiting, S.bar_file, S.bar_line);
    int warp = f->linear / 32, lane = f->linear % 32;
    warp_t &w = S.warps[(size_t)warp];
    for (unsigned m = w.waiting; m; m &= m - 1) {
        fiber *o = S.fibers[(size_t)(warp * 32 + __builtin_ctz(m))];
        if (o->wmask >> lane & 1u)
            die("%s returned while lane %d waits for it at %s(mask 0x%08x) %s:%d", where(f), __builtin_ctz(m), o->wwhat,
                o->wmask, o->file, o->line);
    }
    w.exited |= 1u << lane;
}

static void fiber_entry(void) {
    fiber *f = S.cur;
    S.thunk(S.ctx);
    fiber_exit_checks(f);
    f->state = F_DONE;
    S.exited++;
    yield_to_scheduler(f);
    die("a finished fiber was resumed");
}

static bool same_site(const char *fa, int la, const char *fb, int lb) {
    return la == lb && (fa == fb || strcmp(fa, fb) == 0);
}

static fiber *current(const char *what) {
    if (!S.in_kernel || !S.cur || !pthread_equal(S.thread, pthread_self()))
        die("%s called outside a kernel", what);
    return S.cur;
}

void syncthreads(const char *file, int line) {
    fiber *f = current("__syncthreads()");
    if (S.exited > 0) {
        const fiber *gone = nullptr;
        for (int i = 0; i < S.nthreads && !gone; i++)
            if (S.fibers[(size_t)i]->state == F_DONE) gone = S.fibers[(size_t)i];
        die("%s reached __syncthreads() at %s:%d after %d threads of its block returned (first: thread "
            "(%u,%u,%u)): a barrier in divergent code is undefined behaviour in CUDA",
            where(f), file, line, S.exited, gone->tid.x, gone->tid.y, gone->tid.z);
    }
    if (S.bar_waiting > 0 && !same_site(file, line, S.bar_file, S.bar_line))
        die("%s reached __syncthreads() at %s:%d while %d threads wait at a different __syncthreads() %s:%d",
            where(f), file, line, S.bar_waiting, S.bar_file, S.bar_line);
    S.bar_file = file;
    S.bar_line = line;
    if (++S.bar_waiting == S.nthreads) {
        S.bar_waiting = 0;
        for (int i = 0; i < S.nthreads; i++) {
            fiber *o = S.fibers[(size_t)i];
            if (o->state == F_WAIT_BLOCK) o->state = F_RUNNABLE;
        }
        return;
    }
    f->state = F_WAIT_BLOCK;
    f->file = file;
    f->line = line;
    yield_to_scheduler(f);
}

/* A warp-level call: returns the value read from the source lane (shuffles). The
 * call completes when every lane its mask names waits at a warp call; the completing
 * lane checks that they all wait with the same mask (and, for shuffles, at the same
 * call), computes every lane's result and releases them. */
static unsigned long long warp_call(fiber *f, warp_kind kind, const char *what, unsigned mask,
                                    unsigned long long bits, int src, const char *file, int line) {
    int warp = f->linear / 32, lane = f->linear % 32;
    warp_t &w = S.warps[(size_t)warp];
    if (!(mask >> lane & 1u))
        die("%s calls %s at %s:%d with mask 0x%08x that does not include its own lane %d", where(f), what, file, line,
            mask, lane);
    if (mask & ~w.exists) {
        int l = __builtin_ctz(mask & ~w.exists);
        die("%s calls %s at %s:%d with mask 0x%08x naming lane %d, which does not exist (the block has %d threads)",
            where(f), what, file, line, mask, l, S.nthreads);
    }
    if (mask & w.exited)
        die("%s calls %s at %s:%d with mask 0x%08x naming lane %d, which has returned", where(f), what, file, line,
            mask, __builtin_ctz(mask & w.exited));
    f->wkind = kind;
    f->wwhat = what;
    f->wmask = mask;
    f->wbits = bits;
    f->wsrc = src;
    f->file = file;
    f->line = line;
    unsigned bit = 1u << lane;
    if (((w.waiting | bit) & mask) != mask) {
        w.waiting |= bit;
        f->state = F_WAIT_WARP;
        yield_to_scheduler(f);
        f->wkind = W_NONE;
        return f->wresult;
    }
    /* Everyone is here: check they agree, compute each lane's result, release the others. */
    fiber **lanes = &S.fibers[(size_t)warp * 32];
    for (unsigned m = mask; m; m &= m - 1) {
        fiber *o = lanes[__builtin_ctz(m)];
        if (o->wmask != mask)
            die("%s calls %s at %s:%d with mask 0x%08x while lane %d waits at %s(mask 0x%08x) %s:%d", where(f), what,
                file, line, mask, __builtin_ctz(m), o->wwhat, o->wmask, o->file, o->line);
        if (o->wkind != kind || (kind != W_SYNCWARP && !same_site(file, line, o->file, o->line)))
            die("%s calls %s at %s:%d while lane %d waits at a different warp call %s %s:%d", where(f), what, file,
                line, __builtin_ctz(m), o->wwhat, o->file, o->line);
    }
    unsigned ballot = 0;
    if (kind == W_VOTE)
        for (unsigned m = mask; m; m &= m - 1)
            if (lanes[__builtin_ctz(m)]->wbits) ballot |= 1u << __builtin_ctz(m);
    for (unsigned m = mask; m; m &= m - 1) {
        int l = __builtin_ctz(m);
        fiber *o = lanes[l];
        if (kind == W_VOTE) {
            o->wresult = o->wsrc == VOTE_BALLOT ? ballot : o->wsrc == VOTE_ANY ? ballot != 0 : ballot == mask;
        } else if (o->wsrc < 0) {
            o->wresult = o->wbits;
        } else if (!(mask >> o->wsrc & 1u)) {
            die("%s: lane %d's %s at %s:%d reads lane %d, which is not in the mask 0x%08x (undefined in CUDA)",
                where(o), l, o->wwhat, o->file, o->line, o->wsrc, mask);
        } else {
            o->wresult = lanes[o->wsrc]->wbits;
        }
        if (o != f) o->state = F_RUNNABLE;
    }
    w.waiting &= ~mask;
    f->wkind = W_NONE;
    return f->wresult;
}

void syncwarp(unsigned mask, const char *file, int line) {
    fiber *f = current("__syncwarp()");
    warp_call(f, W_SYNCWARP, "__syncwarp", mask, 0, -1, file, line);
}

unsigned long long shfl(unsigned mask, unsigned long long bits, int mode, int arg, int width, const char *what,
                        const char *file, int line) {
    fiber *f = current(what);
    if (width < 1 || width > 32 || (width & (width - 1)))
        die("%s calls %s at %s:%d with width %d: it must be a power of 2 from 1 to 32", where(f), what, file, line,
            width);
    /* As PTX's shfl.sync: the lane offset / source lane is taken modulo 32. */
    arg &= 31;
    int lane = f->linear % 32, base = lane & ~(width - 1), src = -1;
    switch (mode) {
    case SHFL_IDX: src = base + (arg & (width - 1)); break;
    case SHFL_UP: src = lane - arg >= base ? lane - arg : -1; break;
    case SHFL_DOWN: src = (unsigned)lane + (unsigned)arg < (unsigned)(base + width) ? lane + arg : -1; break;
    case SHFL_XOR: {
        unsigned s = (unsigned)lane ^ (unsigned)arg;
        src = s < (unsigned)(base + width) ? (int)s : -1;
        break;
    }
    default: die("bad shuffle mode %d", mode);
    }
    if (src == lane) src = -1;
    return warp_call(f, W_SHFL, what, mask, bits, src, file, line);
}

unsigned vote(unsigned mask, bool pred, int mode, const char *what, const char *file, int line) {
    fiber *f = current(what);
    return (unsigned)warp_call(f, W_VOTE, what, mask, pred ? 1 : 0, mode, file, line);
}

void misaligned(const char *what, const void *p, size_t align) {
    die("%s: %s(%p) is not aligned to %zu bytes (a misaligned address fault on a GPU)", where(S.in_kernel ? S.cur : nullptr),
        what, p, align);
}

unsigned char *dyn_smem(void) {
    current("DT_DYN_SMEM");
    return S.smem;
}

/* ---- faults inside kernels: say where ------------------------------------------------------ */
static struct sigaction g_old_segv, g_old_bus;

static void fault_handler(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    if (S.in_kernel && pthread_equal(S.thread, pthread_self())) {
        uintptr_t a = (uintptr_t)si->si_addr;
        char what[400];
        describe_address(a, what, sizeof what);
        fprintf(stderr, "cuemu: %s: %s at address %p: %s\n", where(S.cur), sig == SIGSEGV ? "segmentation fault" : "bus error",
                si->si_addr, what);
        fflush(stderr);
    }
    /* Let the fault happen again under the previous handler (the default: die). */
    sigaction(sig, sig == SIGSEGV ? &g_old_segv : &g_old_bus, nullptr);
}

void describe_address(uintptr_t a, char *out, size_t len) {
    if (S.smem_map && a >= (uintptr_t)S.smem_map && a < (uintptr_t)(S.smem_map + S.smem_cap + page_size())) {
        long off = (long)(a - (uintptr_t)S.smem);
        snprintf(out, len, "byte %ld of dynamic shared memory, which has %zu bytes (launch's smem argument)", off,
                 S.smem_bytes);
        return;
    }
    for (int i = 0; i < S.nthreads; i++) {
        fiber *f = S.fibers[(size_t)i];
        if (a >= (uintptr_t)f->map && a < (uintptr_t)(f->map + page_size())) {
            snprintf(out, len, "stack overflow of thread (%u,%u,%u) (stacks are %zu KiB: DTRUN_CUEMU_STACK_KB)",
                     f->tid.x, f->tid.y, f->tid.z, stack_bytes() / 1024);
            return;
        }
    }
    describe_alloc_address(a, out, len);
}

static void install_fault_handler(void) {
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = fault_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &g_old_segv);
        sigaction(SIGBUS, &sa, &g_old_bus);
    });
    /* The handler must run on its own stack: a fiber's stack may be the thing that overflowed. */
    static thread_local bool have_altstack = false;
    if (!have_altstack) {
        stack_t ss;
        memset(&ss, 0, sizeof ss);
        ss.ss_size = 64 * 1024;
        ss.ss_sp = malloc(ss.ss_size);
        if (ss.ss_sp && sigaltstack(&ss, nullptr) == 0) have_altstack = true;
    }
}

/* ---- launches ------------------------------------------------------------------------------- */
static std::map<const void *, int> g_func_smem_max; /* cudaFuncAttributeMaxDynamicSharedMemorySize */

int func_smem_max(const void *fn) {
    auto it = g_func_smem_max.find(fn);
    return it == g_func_smem_max.end() ? DEV_SMEM_PER_BLOCK : it->second;
}

void set_func_smem_max(const void *fn, int v) { g_func_smem_max[fn] = v; }

static void ensure_smem(size_t bytes) {
    size_t need = (bytes + 15) & ~(size_t)15;
    if (S.smem_map && need <= S.smem_cap) return;
    if (S.smem_map) munmap(S.smem_map, S.smem_cap + page_size());
    size_t cap = (need + page_size() - 1) / page_size() * page_size();
    if (cap < 64 * 1024) cap = 64 * 1024;
    void *m = mmap(nullptr, cap + page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("mmap of %zu bytes of shared memory failed", cap);
    S.smem_map = (char *)m;
    S.smem_cap = cap;
    if (mprotect(S.smem_map + cap, page_size(), PROT_NONE) != 0) die("mprotect of the shared memory guard failed");
}

static cudaError_t validate_launch(const launch_cfg &c) {
    const dim3 &b = c.block, &g = c.grid;
    if (b.x == 0 || b.y == 0 || b.z == 0 || g.x == 0 || g.y == 0 || g.z == 0) return cudaErrorInvalidConfiguration;
    if (b.x > 1024 || b.y > 1024 || b.z > 64) return cudaErrorInvalidConfiguration;
    if ((unsigned long long)b.x * b.y * b.z > 1024) return cudaErrorInvalidConfiguration;
    if (g.x > 2147483647u || g.y > 65535 || g.z > 65535) return cudaErrorInvalidConfiguration;
    if (c.smem > (size_t)func_smem_max(c.fn)) return cudaErrorInvalidValue;
    if (!stream_valid(c.stream)) return cudaErrorInvalidResourceHandle;
    return cudaSuccess;
}

static void run_block(void) {
    for (int i = 0; i < S.nthreads; i++) {
        fiber *f = S.fibers[(size_t)i];
        f->state = F_RUNNABLE;
        f->wkind = W_NONE;
        fiber_prepare(f);
    }
    S.bar_waiting = 0;
    S.exited = 0;
    S.warps.assign((size_t)(S.nthreads + 31) / 32, warp_t{0xffffffffu, 0, 0});
    if (S.nthreads % 32) S.warps.back().exists = (1u << (S.nthreads % 32)) - 1;
    if (S.smem_bytes) memset(S.smem, 0xff, S.smem_bytes);
    int remaining = S.nthreads;
    while (remaining > 0) {
        bool ran = false;
        for (int i = 0; i < S.nthreads; i++) {
            fiber *f = S.fibers[(size_t)i];
            if (f->state != F_RUNNABLE) continue;
            switch_to_fiber(f);
            ran = true;
            if (f->state == F_DONE) remaining--;
        }
        if (!ran && remaining > 0) deadlock("deadlock: no thread of the block can run");
    }
}

void run_kernel(const launch_cfg &cfg, void (*thunk)(void *), void *ctx) {
    std::lock_guard<std::recursive_mutex> lock(g_lock);
    if (!device_present()) {
        fail(cudaErrorNoDevice);
        return;
    }
    if (S.in_kernel) die("kernel '%s' launched from inside kernel '%s'", cfg.name, S.cfg->name);
    cudaError_t e = validate_launch(cfg);
    if (e != cudaSuccess) {
        fail(e);
        return;
    }
    install_fault_handler();
    int n = (int)(cfg.block.x * cfg.block.y * cfg.block.z);
    while ((int)S.fibers.size() < n) S.fibers.push_back(fiber_new());
    for (int i = 0; i < n; i++) {
        fiber *f = S.fibers[(size_t)i];
        f->linear = i;
        f->tid.x = (unsigned)i % cfg.block.x;
        f->tid.y = (unsigned)i / cfg.block.x % cfg.block.y;
        f->tid.z = (unsigned)i / (cfg.block.x * cfg.block.y);
    }
    ensure_smem(cfg.smem);
    S.smem_bytes = cfg.smem;
    S.smem = (unsigned char *)(S.smem_map + S.smem_cap - ((cfg.smem + 15) & ~(size_t)15));
    S.cfg = &cfg;
    S.thunk = thunk;
    S.ctx = ctx;
    S.nthreads = n;
    S.thread = pthread_self();
    S.in_kernel = true;
    gridDim = cfg.grid;
    blockDim = cfg.block;
    for (unsigned z = 0; z < cfg.grid.z; z++)
        for (unsigned y = 0; y < cfg.grid.y; y++)
            for (unsigned x = 0; x < cfg.grid.x; x++) {
                blockIdx = uint3{x, y, z};
                run_block();
            }
    S.in_kernel = false;
    S.cur = nullptr;
    check_canaries(cfg.name);
    S.cfg = nullptr;
}

} /* namespace cuemu */
