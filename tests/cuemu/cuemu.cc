/*
 * cuemu.cc - the CUDA emulator's runtime (see cuemu.h for what it offers): fibers
 * and the block scheduler, barriers, shuffles and the rendezvous of WMMA calls (their
 * arithmetic is in cuemu_wmma.cc), launch validation, device memory
 * with poison and guard pages, streams and events, the error state.
 *
 * Execution model: a launch runs its blocks in order (x fastest, then y, z); within
 * a block the threads run as cooperative fibers on the launching OS thread (64 KiB
 * stacks with a PROT_NONE page below; a thread that never waits runs on the stack its
 * predecessor just left). A thread runs until it waits at a barrier or returns;
 * __syncthreads releases when every thread of the block has arrived at the same
 * barrier, a warp-level call when every lane its mask names has arrived with the
 * same mask. Anything CUDA leaves undefined that we can see (a barrier after some
 * threads returned, different barriers, a mask naming an exited lane, every live
 * thread waiting for another) aborts with the kernel, block and thread named. A
 * global lock serialises launches and memory calls. DTRUN_CUEMU_STATS=1 prints the
 * launches by kernel at exit.
 */
#include <cxxabi.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
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
/*
 * Threads and fibers are separate: a fiber is a stack, a thread borrows one from the
 * time it starts until it returns. A fiber's entry loop starts the block's threads
 * one after another on the same stack for as long as each runs to completion, so a
 * kernel without barriers costs a function call per thread. A thread that waits
 * (barrier, warp call) keeps its fiber; the next thread starts on another one. A
 * waiting thread switches directly to the next runnable thread (released by a
 * barrier, in thread order), else to a new fiber for the next unstarted thread,
 * else back to the scheduler when the block is done; when none of these exists,
 * every live thread waits for another: a deadlock.
 */
enum thr_state { T_UNSTARTED, T_RUNNING, T_RUNNABLE, T_WAIT_BLOCK, T_WAIT_WARP, T_DONE };
enum warp_kind { W_NONE, W_SHFL, W_SYNCWARP, W_VOTE, W_WMMA };

struct fiber {
    void *sp;
    char *map; /* guard page + stack; NULL for the scheduler's own context */
    size_t map_len;
    int index;
#ifndef CUEMU_ASM_SWITCH
    ucontext_t uc;
#endif
};

struct thr {
    uint3 tid;
    int linear;
    thr_state state;
    fiber *f;
    const char *file; /* where it waits */
    int line;
    /* warp-level call in progress */
    warp_kind wkind;
    const char *wwhat;
    unsigned wmask;
    unsigned long long wbits, wresult;
    int wsrc; /* lane to read, -1: own value (votes: the vote mode) */
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
    int nthreads = 0;
    std::vector<thr> threads;
    std::vector<warp_t> warps;
    std::vector<fiber *> pool;       /* every fiber made */
    std::vector<fiber *> free_fibers;
    std::vector<int> runq;           /* runnable threads, a ring of nthreads slots */
    int rq_head = 0, rq_count = 0;
    int next_unstarted = 0, done = 0;
    bool reverse = false; /* this block runs its threads last to first */
    thr *cur = nullptr;
    fiber *cur_fiber = nullptr;
    fiber sched_fiber{};             /* the launching thread's own context */
    int bar_waiting = 0;
    const char *bar_file = nullptr;
    int bar_line = 0;
    /* dynamic shared memory: one region, the block's bytes end at a PROT_NONE page */
    char *smem_map = nullptr;
    size_t smem_cap = 0; /* usable bytes before the guard page */
    unsigned char *smem = nullptr;
    size_t smem_bytes = 0;
    size_t stack_bytes = 0;
    unsigned long long switches = 0;
};
static sched_t S;
static thread_local bool t_launching = false; /* this OS thread runs the kernel now */

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

static void fiber_entry(void);
#ifndef CUEMU_ASM_SWITCH
static void fiber_entry_uc(void) { fiber_entry(); }
#endif

/* A free fiber, its stack set to start in fiber_entry. */
static fiber *fiber_get(void) {
    fiber *f;
    if (!S.free_fibers.empty()) {
        f = S.free_fibers.back();
        S.free_fibers.pop_back();
    } else {
        f = new fiber();
        f->index = (int)S.pool.size();
        f->map_len = stack_bytes() + page_size();
        void *m = mmap(nullptr, f->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) die("mmap of a %zu-byte fiber stack failed: %s", f->map_len, strerror(errno));
        f->map = (char *)m;
        if (mprotect(f->map, page_size(), PROT_NONE) != 0) die("mprotect of a stack guard failed: %s", strerror(errno));
        S.pool.push_back(f);
    }
#ifdef CUEMU_ASM_SWITCH
    /* Stack tops staggered by the fiber's index: with every top at the same offset in its
     * page, the hot ends of a thousand stacks would fight over the same cache sets. */
    uintptr_t top = ((uintptr_t)(f->map + f->map_len) - (uintptr_t)(f->index % 61) * 64) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0; /* fake return address: the entry sees rsp % 16 == 8, as after a call */
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
    return f;
}

static inline void switch_fiber(fiber *from, fiber *to) {
    S.cur_fiber = to;
    S.switches++;
#ifdef CUEMU_ASM_SWITCH
    cuemu_switch(&from->sp, to->sp);
#else
    swapcontext(&from->uc, &to->uc);
#endif
}

/* The kernel's name for messages: its symbol (demangled) when the dynamic symbol table
 * has it (emulator binaries link with -rdynamic), else DT_LAUNCH's stringised argument
 * (which may be a helper's parameter name). */
static const char *kernel_name(const launch_cfg &c) {
    static std::map<const void *, std::string> names;
    auto it = names.find(c.fn);
    if (it != names.end()) return it->second.c_str();
    std::string name = c.name;
    Dl_info info;
    if (dladdr(c.fn, &info) && info.dli_sname && info.dli_saddr == c.fn) {
        int st = -1;
        char *dm = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &st);
        std::string sym = st == 0 && dm ? dm : info.dli_sname;
        free(dm);
        size_t paren = sym.find('(');
        if (paren != std::string::npos) sym.resize(paren); /* drop the parameter list */
        if (sym.compare(0, 5, "void ") == 0) sym.erase(0, 5);   /* and a template's return type */
        name = sym;
    }
    return names.emplace(c.fn, name).first->second.c_str();
}

/* "kernel 'k' <<<grid, block>>> block (..) thread (..)" for messages. */
static const char *where(const thr *t) {
    static char buf[512];
    const launch_cfg *c = S.cfg;
    if (!c) return "(outside a kernel)";
    int n = snprintf(buf, sizeof buf, "kernel '%s' <<<(%u,%u,%u), (%u,%u,%u)>>> block (%u,%u,%u)", kernel_name(*c),
                     c->grid.x, c->grid.y, c->grid.z, c->block.x, c->block.y, c->block.z, blockIdx.x, blockIdx.y,
                     blockIdx.z);
    if (t && n > 0 && (size_t)n < sizeof buf)
        snprintf(buf + n, sizeof buf - (size_t)n, " thread (%u,%u,%u)", t->tid.x, t->tid.y, t->tid.z);
    return buf;
}

static void describe_wait(const thr *t, char *out, size_t len) {
    switch (t->state) {
    case T_UNSTARTED: snprintf(out, len, "not started"); break;
    case T_RUNNING: snprintf(out, len, "running"); break;
    case T_RUNNABLE: snprintf(out, len, "runnable"); break;
    case T_DONE: snprintf(out, len, "returned"); break;
    case T_WAIT_BLOCK: snprintf(out, len, "waits at __syncthreads() %s:%d", t->file, t->line); break;
    case T_WAIT_WARP: snprintf(out, len, "waits at %s(mask 0x%08x) %s:%d", t->wwhat, t->wmask, t->file, t->line); break;
    }
}

[[noreturn]] static void deadlock(const char *why) {
    fprintf(stderr, "cuemu: %s: %s; the threads of the block:\n", where(nullptr), why);
    int shown = 0;
    for (int i = 0; i < S.nthreads && shown < 40; i++) {
        const thr *t = &S.threads[(size_t)i];
        char d[300];
        describe_wait(t, d, sizeof d);
        int j = i; /* collapse runs of threads in the same state */
        while (j + 1 < S.nthreads) {
            char e[300];
            describe_wait(&S.threads[(size_t)j + 1], e, sizeof e);
            if (strcmp(d, e) != 0) break;
            j++;
        }
        if (j > i)
            fprintf(stderr, "  threads %d..%d: %s\n", i, j, d);
        else
            fprintf(stderr, "  thread %d (%u,%u,%u): %s\n", i, t->tid.x, t->tid.y, t->tid.z, d);
        shown++;
        i = j;
    }
    fflush(stderr);
    abort();
}

/* The current fiber gives up the CPU (its thread waits, or it has no thread left to
 * run): to the next runnable thread, else a new fiber for the next unstarted thread,
 * else the scheduler when the block is done. */
static void switch_away(fiber *from) {
    if (S.rq_count > 0) {
        thr *r = &S.threads[(size_t)S.runq[(size_t)S.rq_head]];
        S.rq_head = (S.rq_head + 1) % S.nthreads;
        S.rq_count--;
        r->state = T_RUNNING;
        S.cur = r;
        threadIdx = r->tid;
        switch_fiber(from, r->f);
    } else if (S.next_unstarted < S.nthreads) {
        switch_fiber(from, fiber_get());
    } else if (S.done == S.nthreads) {
        switch_fiber(from, &S.sched_fiber);
    } else {
        deadlock("deadlock: every thread of the block that has not returned waits for another");
    }
}

static inline void make_runnable(thr *t) {
    t->state = T_RUNNABLE;
    S.runq[(size_t)((S.rq_head + S.rq_count) % S.nthreads)] = t->linear;
    S.rq_count++;
}

/* The calling thread waits until a barrier or warp call releases it. */
static void wait_here(thr *t, thr_state st) {
    t->state = st;
    switch_away(t->f);
    /* resumed: the resumer set S.cur and threadIdx */
}

static void thread_exit_checks(thr *t) {
    if (S.bar_waiting > 0)
        die("%s returned while %d threads of its block wait at __syncthreads() %s:%d (a barrier in divergent "
            "code: undefined behaviour in CUDA)",
            where(t), S.bar_waiting, S.bar_file, S.bar_line);
    int warp = t->linear / 32, lane = t->linear % 32;
    warp_t &w = S.warps[(size_t)warp];
    for (unsigned m = w.waiting; m; m &= m - 1) {
        const thr *o = &S.threads[(size_t)(warp * 32 + __builtin_ctz(m))];
        if (o->wmask >> lane & 1u)
            die("%s returned while lane %d waits for it at %s(mask 0x%08x) %s:%d", where(t), __builtin_ctz(m), o->wwhat,
                o->wmask, o->file, o->line);
    }
    w.exited |= 1u << lane;
}

static void fiber_entry(void) {
    fiber *f = S.cur_fiber;
    for (;;) {
        int k = S.next_unstarted++;
        thr *t = &S.threads[(size_t)(S.reverse ? S.nthreads - 1 - k : k)];
        t->f = f;
        t->state = T_RUNNING;
        S.cur = t;
        threadIdx = t->tid;
        S.thunk(S.ctx);
        thread_exit_checks(t);
        t->state = T_DONE;
        t->f = nullptr;
        S.done++;
        if (S.next_unstarted < S.nthreads) continue; /* the next thread, on the same stack */
        S.free_fibers.push_back(f); /* never resumed: a reuse starts it afresh */
        switch_away(f);
        die("a free fiber was resumed");
    }
}

static bool same_site(const char *fa, int la, const char *fb, int lb) {
    return la == lb && (fa == fb || strcmp(fa, fb) == 0);
}

static inline thr *current(const char *what) {
    if (!t_launching || !S.cur) die("%s called outside a kernel", what);
    return S.cur;
}

void syncthreads(const char *file, int line) {
    thr *t = current("__syncthreads()");
    if (S.done > 0) {
        const thr *gone = nullptr;
        for (int i = 0; i < S.nthreads && !gone; i++)
            if (S.threads[(size_t)i].state == T_DONE) gone = &S.threads[(size_t)i];
        die("%s reached __syncthreads() at %s:%d after %d threads of its block returned (first: thread "
            "(%u,%u,%u)): a barrier in divergent code is undefined behaviour in CUDA",
            where(t), file, line, S.done, gone->tid.x, gone->tid.y, gone->tid.z);
    }
    if (S.bar_waiting > 0 && !same_site(file, line, S.bar_file, S.bar_line))
        die("%s reached __syncthreads() at %s:%d while %d threads wait at a different __syncthreads() %s:%d",
            where(t), file, line, S.bar_waiting, S.bar_file, S.bar_line);
    S.bar_file = file;
    S.bar_line = line;
    if (++S.bar_waiting == S.nthreads) {
        S.bar_waiting = 0;
        for (int k = 0; k < S.nthreads; k++) {
            thr *o = &S.threads[(size_t)(S.reverse ? S.nthreads - 1 - k : k)];
            if (o->state == T_WAIT_BLOCK) make_runnable(o);
        }
        return;
    }
    t->file = file;
    t->line = line;
    wait_here(t, T_WAIT_BLOCK);
}

/* A warp-level call: returns the value read from the source lane (shuffles) or the
 * vote. The call completes when every lane its mask names waits at a warp call; the
 * completing lane checks that they all wait with the same mask (and, for shuffles and
 * votes, at the same call), computes every lane's result and releases them. */
static unsigned long long warp_call(thr *t, warp_kind kind, const char *what, unsigned mask,
                                    unsigned long long bits, int src, const char *file, int line) {
    int warp = t->linear / 32, lane = t->linear % 32;
    warp_t &w = S.warps[(size_t)warp];
    if (!(mask >> lane & 1u))
        die("%s calls %s at %s:%d with mask 0x%08x that does not include its own lane %d", where(t), what, file, line,
            mask, lane);
    if (mask & ~w.exists)
        die("%s calls %s at %s:%d with mask 0x%08x naming lane %d, which does not exist (the block has %d threads)",
            where(t), what, file, line, mask, __builtin_ctz(mask & ~w.exists), S.nthreads);
    if (mask & w.exited)
        die("%s calls %s at %s:%d with mask 0x%08x naming lane %d, which has returned", where(t), what, file, line,
            mask, __builtin_ctz(mask & w.exited));
    t->wkind = kind;
    t->wwhat = what;
    t->wmask = mask;
    t->wbits = bits;
    t->wsrc = src;
    t->file = file;
    t->line = line;
    unsigned bit = 1u << lane;
    if (((w.waiting | bit) & mask) != mask) {
        w.waiting |= bit;
        wait_here(t, T_WAIT_WARP);
        t->wkind = W_NONE;
        return t->wresult;
    }
    thr *lanes = &S.threads[(size_t)warp * 32];
    for (unsigned m = mask; m; m &= m - 1) {
        const thr *o = &lanes[__builtin_ctz(m)];
        if (o->wmask != mask)
            die("%s calls %s at %s:%d with mask 0x%08x while lane %d waits at %s(mask 0x%08x) %s:%d", where(t), what,
                file, line, mask, __builtin_ctz(m), o->wwhat, o->wmask, o->file, o->line);
        if (o->wkind != kind || (kind != W_SYNCWARP && !same_site(file, line, o->file, o->line)))
            die("%s calls %s at %s:%d while lane %d waits at a different warp call %s %s:%d", where(t), what, file,
                line, __builtin_ctz(m), o->wwhat, o->file, o->line);
    }
    if (kind == W_WMMA) {
        wmma_args *args[32];
        for (int l = 0; l < 32; l++) args[l] = (wmma_args *)(uintptr_t)lanes[l].wbits;
        char why[300];
        int bad = wmma_mismatch(args, why, sizeof why);
        if (bad >= 0)
            die("%s calls %s at %s:%d: %s (CUDA requires the same for every lane of the warp)", where(t), what, file,
                line, why);
        wmma_run(args);
    }
    unsigned ballot = 0;
    if (kind == W_VOTE)
        for (unsigned m = mask; m; m &= m - 1)
            if (lanes[__builtin_ctz(m)].wbits) ballot |= 1u << __builtin_ctz(m);
    for (unsigned m = mask; m; m &= m - 1) {
        int l = __builtin_ctz(m);
        thr *o = &lanes[l];
        if (kind == W_VOTE) {
            o->wresult = o->wsrc == VOTE_BALLOT ? ballot : o->wsrc == VOTE_ANY ? ballot != 0 : ballot == mask;
        } else if (o->wsrc < 0) {
            o->wresult = o->wbits;
        } else if (!(mask >> o->wsrc & 1u)) {
            die("%s: lane %d's %s at %s:%d reads lane %d, which is not in the mask 0x%08x (undefined in CUDA)",
                where(o), l, o->wwhat, o->file, o->line, o->wsrc, mask);
        } else {
            o->wresult = lanes[o->wsrc].wbits;
        }
    }
    w.waiting &= ~mask;
    for (unsigned m = mask & ~bit; m;) {
        int l = S.reverse ? 31 - __builtin_clz(m) : __builtin_ctz(m);
        m &= ~(1u << l);
        make_runnable(&lanes[l]);
    }
    t->wkind = W_NONE;
    return t->wresult;
}

void syncwarp(unsigned mask, const char *file, int line) {
    thr *t = current("__syncwarp()");
    warp_call(t, W_SYNCWARP, "__syncwarp", mask, 0, -1, file, line);
}

unsigned long long shfl(unsigned mask, unsigned long long bits, int mode, int arg, int width, const char *what,
                        const char *file, int line) {
    thr *t = current(what);
    if (width < 1 || width > 32 || (width & (width - 1)))
        die("%s calls %s at %s:%d with width %d: it must be a power of 2 from 1 to 32", where(t), what, file, line,
            width);
    /* As PTX's shfl.sync: the lane offset / source lane is taken modulo 32. */
    arg &= 31;
    int lane = t->linear % 32, base = lane & ~(width - 1), src = -1;
    switch (mode) {
    case SHFL_IDX: src = base + (arg & (width - 1)); break;
    case SHFL_UP: src = lane - arg >= base ? lane - arg : -1; break;
    case SHFL_DOWN: src = lane + arg < base + width ? lane + arg : -1; break;
    case SHFL_XOR: src = (lane ^ arg) < base + width ? lane ^ arg : -1; break;
    default: die("bad shuffle mode %d", mode);
    }
    if (src == lane) src = -1;
    return warp_call(t, W_SHFL, what, mask, bits, src, file, line);
}

unsigned vote(unsigned mask, bool pred, int mode, const char *what, const char *file, int line) {
    thr *t = current(what);
    return (unsigned)warp_call(t, W_VOTE, what, mask, pred ? 1 : 0, mode, file, line);
}

/* A WMMA call: every lane of a full warp, none returned, each with valid arguments. */
void wmma_call(const char *what, wmma_args *args, const char *file, int line) {
    thr *t = current(what);
    int warp = t->linear / 32;
    const warp_t &w = S.warps[(size_t)warp];
    char why[300];
    if (!wmma_check_lane(args, why, sizeof why)) die("%s calls %s at %s:%d: %s", where(t), what, file, line, why);
    if (w.exists != 0xffffffffu)
        die("%s calls %s at %s:%d in a warp of %d lanes (the block has %d threads): WMMA needs all 32 lanes", where(t),
            what, file, line, __builtin_popcount(w.exists), S.nthreads);
    if (w.exited)
        die("%s calls %s at %s:%d after lane %d of its warp returned: all 32 lanes must take part", where(t), what,
            file, line, __builtin_ctz(w.exited));
    warp_call(t, W_WMMA, what, 0xffffffffu, (unsigned long long)(uintptr_t)args, -1, file, line);
}

void misaligned(const char *what, const void *p, size_t align) {
    die("%s: %s(%p) is not aligned to %zu bytes (a misaligned address fault on a GPU)",
        where(t_launching ? S.cur : nullptr), what, p, align);
}

unsigned char *dyn_smem(void) {
    current("DT_DYN_SMEM");
    return S.smem;
}

/* ---- faults inside kernels: say where ------------------------------------------------------ */
static struct sigaction g_old_segv, g_old_bus;

static void fault_handler(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    if (!S.in_kernel && device_mem_guarded((uintptr_t)si->si_addr)) {
        char what[400];
        describe_alloc_address((uintptr_t)si->si_addr, what, sizeof what);
        fprintf(stderr, "cuemu: host code dereferenced device memory at %p (%s): an illegal access on a GPU; copy it "
                        "with cudaMemcpy\n", si->si_addr, what);
        fflush(stderr);
    } else if (S.in_kernel && t_launching) {
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
    for (const fiber *f : S.pool) {
        if (a >= (uintptr_t)f->map && a < (uintptr_t)(f->map + page_size())) {
            snprintf(out, len, "stack overflow (fiber stacks are %zu KiB: DTRUN_CUEMU_STACK_KB)", stack_bytes() / 1024);
            return;
        }
    }
    describe_alloc_address(a, out, len);
}

void install_fault_handler(void) {
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
    size_t need = (bytes + 31) & ~(size_t)31;
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

/* DTRUN_CUEMU_STATS=1: a table of the launches by kernel at exit (stderr). */
struct kstat {
    unsigned long long launches = 0, blocks = 0, threads = 0, switches = 0;
    double ms = 0;
};
static std::map<std::string, kstat> g_stats;
static bool g_stats_on = false;
static double g_stats_t0;
static unsigned long long g_stats_sw0;

static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void stats_print(void) {
    std::vector<std::pair<std::string, kstat>> v(g_stats.begin(), g_stats.end());
    std::sort(v.begin(), v.end(), [](const auto &a, const auto &b) { return a.second.ms > b.second.ms; });
    fprintf(stderr, "cuemu: launches by CPU time (DTRUN_CUEMU_STATS)\n%10s %10s %12s %12s %10s  %s\n", "ms", "launches",
            "blocks", "threads", "sw/thread", "kernel");
    for (const auto &x : v)
        fprintf(stderr, "%10.1f %10llu %12llu %12llu %10.2f  %s\n", x.second.ms, x.second.launches, x.second.blocks,
                x.second.threads, x.second.threads ? (double)x.second.switches / (double)x.second.threads : 0.0,
                x.first.c_str());
    fprintf(stderr, "cuemu: stream syncs %llu, event syncs %llu, cuBLAS calls %llu\n", cuemu_counter("stream_sync"),
            cuemu_counter("event_sync"), cuemu_counter("blas_call"));
}

static void stats_begin(void) {
    static std::once_flag once;
    std::call_once(once, [] {
        const char *e = getenv("DTRUN_CUEMU_STATS");
        g_stats_on = e && *e && strcmp(e, "0") != 0;
        if (g_stats_on) atexit(stats_print);
    });
    if (!g_stats_on) return;
    g_stats_t0 = cpu_ms();
    g_stats_sw0 = S.switches;
}

static void stats_end(const launch_cfg &cfg, int n) {
    if (!g_stats_on) return;
    kstat &k = g_stats[kernel_name(cfg)];
    unsigned long long blocks = (unsigned long long)cfg.grid.x * cfg.grid.y * cfg.grid.z;
    k.launches++;
    k.blocks += blocks;
    k.threads += blocks * (unsigned long long)n;
    k.switches += S.switches - g_stats_sw0;
    k.ms += cpu_ms() - g_stats_t0;
}

/* DTRUN_CUEMU_ORDER=forward: every block runs its threads first to last. */
static bool thread_order_alternates(void) {
    static int alt = -1;
    if (alt < 0) {
        const char *e = getenv("DTRUN_CUEMU_ORDER");
        alt = !(e && strcmp(e, "forward") == 0);
    }
    return alt != 0;
}

/* Every static __shared__ variable of the program is in the section cuemu_shared
 * (cuemu.h); the linker marks its bounds. Weak: a program may have none. */
extern "C" char __start_cuemu_shared[] __attribute__((weak));
extern "C" char __stop_cuemu_shared[] __attribute__((weak));

static void poison_static_shared(void) {
    char *b = __start_cuemu_shared, *e = __stop_cuemu_shared;
    if (b && e > b) memset(b, 0xff, (size_t)(e - b));
}

static void run_block(void) {
    for (int i = 0; i < S.nthreads; i++) {
        thr &t = S.threads[(size_t)i];
        t.state = T_UNSTARTED;
        t.f = nullptr;
        t.wkind = W_NONE;
    }
    S.next_unstarted = 0;
    /* Odd blocks run their threads in reverse: a kernel that reads what another thread
     * writes without a barrier between sees poison in one order or the other. */
    S.reverse = thread_order_alternates() &&
                ((blockIdx.x + (size_t)blockIdx.y * gridDim.x + (size_t)blockIdx.z * gridDim.x * gridDim.y) & 1);
    S.done = 0;
    S.rq_head = S.rq_count = 0;
    S.bar_waiting = 0;
    for (size_t w = 0; w < S.warps.size(); w++) S.warps[w].exited = S.warps[w].waiting = 0;
    if (S.smem_bytes) memset(S.smem, 0xff, S.smem_bytes);
    poison_static_shared();
    switch_fiber(&S.sched_fiber, fiber_get()); /* back when every thread has returned */
}

void run_kernel(const launch_cfg &cfg, void (*thunk)(void *), void *ctx) {
    device_access access;
    if (!device_present()) {
        fail(cudaErrorNoDevice);
        return;
    }
    if (S.in_kernel) die("kernel '%s' launched from inside kernel '%s'", kernel_name(cfg), kernel_name(*S.cfg));
    cudaError_t e = validate_launch(cfg);
    if (e != cudaSuccess) {
        fail(e);
        return;
    }
    install_fault_handler();
    int n = (int)(cfg.block.x * cfg.block.y * cfg.block.z);
    S.threads.resize((size_t)n);
    S.runq.resize((size_t)n);
    for (int i = 0; i < n; i++) {
        thr &t = S.threads[(size_t)i];
        t.linear = i;
        t.tid.x = (unsigned)i % cfg.block.x;
        t.tid.y = (unsigned)i / cfg.block.x % cfg.block.y;
        t.tid.z = (unsigned)i / (cfg.block.x * cfg.block.y);
    }
    S.warps.assign((size_t)(n + 31) / 32, warp_t{0xffffffffu, 0, 0});
    if (n % 32) S.warps.back().exists = (1u << (n % 32)) - 1;
    ensure_smem(cfg.smem);
    S.smem_bytes = cfg.smem;
    S.smem = (unsigned char *)(S.smem_map + S.smem_cap - ((cfg.smem + 31) & ~(size_t)31)); /* 32-byte aligned: WMMA pointers */
    S.cfg = &cfg;
    S.thunk = thunk;
    S.ctx = ctx;
    S.nthreads = n;
    S.in_kernel = true;
    t_launching = true;
    gridDim = cfg.grid;
    blockDim = cfg.block;
    stats_begin();
    for (unsigned z = 0; z < cfg.grid.z; z++)
        for (unsigned y = 0; y < cfg.grid.y; y++)
            for (unsigned x = 0; x < cfg.grid.x; x++) {
                blockIdx = uint3{x, y, z};
                run_block();
            }
    stats_end(cfg, n);
    t_launching = false;
    S.in_kernel = false;
    S.cur = nullptr;
    check_canaries(kernel_name(cfg));
    S.cfg = nullptr;
}

} /* namespace cuemu */
