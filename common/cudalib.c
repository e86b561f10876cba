/*
 * cudalib.c - finds and loads the CUDA library once (cudalib.h): symbols already
 * in the process, else its CUDA dependencies preloaded RTLD_GLOBAL (system path,
 * then PyTorch's nvidia/<pkg>/lib folders) and the library itself from beside the
 * binary or the loader's search path. Every failure becomes one message that
 * names what is missing and every place looked.
 */
#define _GNU_SOURCE /* dladdr */
#include "common/cudalib.h"

#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"

/* The Makefile names the library and its dependencies (sonames read from the CUDA
 * libraries with readelf, so they follow the installed CUDA version). */
#ifndef DT_CUDALIB_NAME
#define DT_CUDALIB_NAME "libdtrun_cuda.so"
#endif
#ifndef DT_CUDALIB_DEPS
#define DT_CUDALIB_DEPS "libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libnccl.so.2"
#endif

/* The symbol that marks the library (and carries its ABI number). */
#define ABI_SYMBOL "dt_cudalib_abi"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int lib_loaded;          /* 1 once loaded (lib_handle may be RTLD_DEFAULT, i.e. NULL) */
static void *lib_handle;        /* RTLD_DEFAULT when linked in */
static char lib_path[PATH_MAX + 64]; /* where it came from */
static char load_error[16384];    /* the one message when loading failed */

const char *dt_cudalib_name(void) { return DT_CUDALIB_NAME; }

const char *dt_cudalib_path(void) { return lib_loaded ? lib_path : NULL; }

/* The running binary's folder (/proc/self/exe), "" when unknown. */
static void exe_dir(char *buf, size_t len) {
    char self[PATH_MAX];
    buf[0] = '\0';
    if (dt_fs_self_exe(self, sizeof self) != DT_STATUS_OK) return;
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    snprintf(buf, len, "%s", self);
}

static int is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The library's file beside the binary or in a folder of LD_LIBRARY_PATH. */
static int find_file(char *path, size_t len) {
    char dir[PATH_MAX];
    exe_dir(dir, sizeof dir);
    snprintf(path, len, "%s/%s", dir, DT_CUDALIB_NAME);
    if (dir[0] && is_file(path)) return 1;
    const char *lp = getenv("LD_LIBRARY_PATH");
    for (const char *p = lp; p && *p;) {
        size_t n = strcspn(p, ":");
        if (n > 0 && n < sizeof dir) {
            memcpy(dir, p, n);
            dir[n] = '\0';
            snprintf(path, len, "%s/%s", dir, DT_CUDALIB_NAME);
            if (is_file(path)) return 1;
        }
        p += n + (p[n] == ':');
    }
    path[0] = '\0';
    return 0;
}

int dt_cudalib_present(char *path, size_t len) {
    if (dlsym(RTLD_DEFAULT, ABI_SYMBOL)) {
        snprintf(path, len, "(linked in)");
        return 1;
    }
    return find_file(path, len);
}

/* PyTorch's wheels carry CUDA as nvidia/<pkg>/lib/<soname> in site-packages or
 * dist-packages; these are the places torch itself is installed (the system's
 * pythons, ~/.local, the active venv or conda env, pyenv's interpreters). Loads `soname`
 * RTLD_GLOBAL from the first folder that has it; writes the patterns looked at to
 * where. NULL when none has it. */
static void *load_from_torch(const char *soname, char *where, size_t len) {
    const char *home = getenv("HOME"), *venv = getenv("VIRTUAL_ENV"), *conda = getenv("CONDA_PREFIX");
    const char *pyenv = getenv("PYENV_ROOT");
    char b_home[1024] = "", b_venv[1024] = "", b_conda[1024] = "", b_pyenv[1024] = "";
    if (home && *home) snprintf(b_home, sizeof b_home, "%s/.local/lib", home);
    if (venv && *venv) snprintf(b_venv, sizeof b_venv, "%s/lib", venv);
    if (conda && *conda) snprintf(b_conda, sizeof b_conda, "%s/lib", conda);
    /* pyenv's interpreters, each with its own site-packages */
    if (pyenv && *pyenv) snprintf(b_pyenv, sizeof b_pyenv, "%s/versions/*/lib", pyenv);
    else if (home && *home) snprintf(b_pyenv, sizeof b_pyenv, "%s/.pyenv/versions/*/lib", home);
    const char *bases[] = {"/usr/lib", "/usr/local/lib", b_home, b_venv, b_conda, b_pyenv};
    const int nb = (int)(sizeof bases / sizeof bases[0]);
    size_t off = 0;
    where[0] = '\0';
    for (int i = 0; i < nb; i++) {
        if (!bases[i][0]) continue;
        char pat[1100];
        snprintf(pat, sizeof pat, "%s/python3*/{site,dist}-packages/nvidia/*/lib", bases[i]);
        if (off < len) off += (size_t)snprintf(where + off, len - off, "%s%s", off ? ", " : "", pat);
        glob_t g;
        memset(&g, 0, sizeof g);
        if (glob(pat, GLOB_BRACE | GLOB_ONLYDIR, NULL, &g) != 0) continue;
        void *h = NULL;
        for (size_t k = 0; !h && k < g.gl_pathc; k++) {
            char file[PATH_MAX * 2];
            snprintf(file, sizeof file, "%s/%s", g.gl_pathv[k], soname);
            if (is_file(file)) h = dlopen(file, RTLD_NOW | RTLD_GLOBAL);
        }
        globfree(&g);
        if (h) return h;
    }
    return NULL;
}

/* "LD_LIBRARY_PATH=..., /etc/ld.so.cache, /lib, /usr/lib": the system's search path. */
static void system_path(char *buf, size_t len) {
    const char *lp = getenv("LD_LIBRARY_PATH");
    snprintf(buf, len, "the system's library path (%s%s%s/etc/ld.so.cache, /lib, /usr/lib)",
             lp && *lp ? "LD_LIBRARY_PATH=" : "", lp && *lp ? lp : "", lp && *lp ? ", " : "");
}

/* Each dependency by soname, RTLD_GLOBAL so the library's own references bind to
 * it: the system's search path first, then PyTorch's folders. */
static int preload_deps(void) {
    char deps[512];
    snprintf(deps, sizeof deps, "%s", DT_CUDALIB_DEPS);
    for (char *save = NULL, *so = strtok_r(deps, " ", &save); so; so = strtok_r(NULL, " ", &save)) {
        if (dlopen(so, RTLD_NOW | RTLD_GLOBAL)) continue;
        char sys_err[1024], torch[2048], sys[1024];
        snprintf(sys_err, sizeof sys_err, "%s", dlerror());
        if (load_from_torch(so, torch, sizeof torch)) continue;
        system_path(sys, sizeof sys);
        snprintf(load_error, sizeof load_error,
                 "the CUDA library %s needs %s, which was not found: looked in %s and in PyTorch's "
                 "CUDA folders (%s) [%s]; install CUDA (or PyTorch with CUDA), or use device cpu",
                 DT_CUDALIB_NAME, so, sys, torch, sys_err);
        return -1;
    }
    return 0;
}

static void load_now(void) {
    if (dlsym(RTLD_DEFAULT, ABI_SYMBOL)) { /* linked in: no file to load */
        lib_handle = RTLD_DEFAULT;
        snprintf(lib_path, sizeof lib_path, "(linked in)");
        lib_loaded = 1;
        return;
    }
    char dir[PATH_MAX], file[PATH_MAX + 64];
    exe_dir(dir, sizeof dir);
    snprintf(file, sizeof file, "%s/%s", dir, DT_CUDALIB_NAME);
    int beside = dir[0] && is_file(file);
    /* A dependency found nowhere may still be found by the library's own run path:
     * its message stands only if the library then does not load. */
    int deps_missing = preload_deps() != 0;
    void *h = dlopen(beside ? file : DT_CUDALIB_NAME, RTLD_NOW | RTLD_LOCAL);
    if (!h && deps_missing) return;
    if (!h) {
        char sys[1024];
        system_path(sys, sizeof sys);
        if (beside)
            snprintf(load_error, sizeof load_error, "the CUDA library %s could not be loaded: %s", file, dlerror());
        else
            snprintf(load_error, sizeof load_error,
                     "the CUDA library %s was not found: looked in %s (beside this dtrun) and in %s [%s]; "
                     "build it with `make` where nvcc is installed, or use device cpu",
                     DT_CUDALIB_NAME, dir[0] ? dir : "(unknown folder)", sys, dlerror());
        return;
    }
    const int *abi = (const int *)dlsym(h, ABI_SYMBOL);
    if (!abi || *abi != DT_CUDALIB_ABI) {
        snprintf(load_error, sizeof load_error,
                 "the CUDA library %s is not this dtrun's (ABI %d, this dtrun expects %d): rebuild both with `make`",
                 beside ? file : DT_CUDALIB_NAME, abi ? *abi : -1, DT_CUDALIB_ABI);
        dlclose(h);
        return;
    }
    if (!beside) {
        /* the loader's search found it: ask where */
        Dl_info info;
        if (dladdr(abi, &info) && info.dli_fname) snprintf(file, sizeof file, "%s", info.dli_fname);
    }
    snprintf(lib_path, sizeof lib_path, "%s", file);
    lib_handle = h;
    lib_loaded = 1;
}

dt_status_t dt_cudalib_load(void) {
    pthread_once(&load_once, load_now);
    if (!lib_loaded) return dt_error(DT_STATUS_UNSUPPORTED, "%s", load_error);
    return DT_STATUS_OK;
}

dt_status_t dt_cudalib_sym(const char *name, void **out) {
    *out = NULL;
    DT_CHECK(dt_cudalib_load());
    void *p = dlsym(lib_handle, name);
    if (!p)
        return dt_error(DT_STATUS_UNSUPPORTED, "the CUDA library %s has no %s", lib_path, name);
    *out = p;
    return DT_STATUS_OK;
}

dt_status_t dt_cudalib_sym_checked(const char *name, const char *layout_sym, unsigned long layout,
                                   const char *header, void **out) {
    void *p;
    *out = NULL;
    DT_CHECK(dt_cudalib_sym(layout_sym, &p));
    unsigned long theirs = *(const unsigned long *)p;
    if (theirs != layout)
        return dt_error(DT_STATUS_UNSUPPORTED,
                        "the CUDA library %s was built against another %s (layout %lu, this dtrun's %lu): "
                        "rebuild both with `make`",
                        lib_path, header, theirs, layout);
    return dt_cudalib_sym(name, out);
}
