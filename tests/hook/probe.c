/* Test program for the runtime hook: drives the CUDA driver API the way applications do, through
 * one of three lookup paths, from a little script on the command line, printing one line per step.
 *   probe MODE STEP...      MODE: direct (linked -lcuda) | procaddr (cuGetProcAddress_v2) | dlsym (dlopen+dlsym)
 *   STEP: init | ctx:DEV | alloc:BYTES[m] | free:INDEX | info | total:DEV | launch:N | count
 *         | stress:THREADS:ITERS:SEED (random alloc/free of up to 64 MiB on device 0) | peak:DEV
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned int);
CUresult cuCtxCreate_v2(void **, unsigned int, int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, int);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, void *);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

static struct {
    CUresult (*init)(unsigned int);
    CUresult (*ctx)(void **, unsigned int, int);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*info)(size_t *, size_t *);
    CUresult (*total)(size_t *, int);
    CUresult (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
    CUresult (*alloc_async)(CUdeviceptr *, size_t, void *);
} f;

static void *lookup(const char *mode, void *lib, const char *base, const char *full) {
    void *p = NULL;
    if (!strcmp(mode, "dlsym")) return dlsym(lib, full);
    /* The runtime asks for base names with its CUDA version and gets the versioned entry. */
    if (cuGetProcAddress_v2(base, &p, 12040, 0, NULL) != 0) return NULL;
    return p;
}

struct worker { int iters; unsigned seed; int refused; };

static void *stress(void *arg) {
    struct worker *w = arg;
    void *c;
    f.ctx(&c, 0, 0);
    CUdeviceptr held[64];
    int n = 0;
    for (int i = 0; i < w->iters; i++) {
        if (n < 64 && (n == 0 || rand_r(&w->seed) % 3 != 0)) {
            CUdeviceptr p;
            size_t b = 1 + (size_t)(rand_r(&w->seed) % (64u << 20));
            if (f.alloc(&p, b) == 0) held[n++] = p; else w->refused++;
        } else {
            int k = rand_r(&w->seed) % n;
            f.free(held[k]);
            held[k] = held[--n];
        }
    }
    while (n > 0) f.free(held[--n]);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *mode = argv[1];
    if (!strcmp(mode, "direct")) {
        f.init = cuInit; f.ctx = cuCtxCreate_v2; f.alloc = cuMemAlloc_v2; f.free = cuMemFree_v2;
        f.info = cuMemGetInfo_v2; f.total = cuDeviceTotalMem_v2; f.launch = cuLaunchKernel;
        f.alloc_async = cuMemAllocAsync;
    } else {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (!lib) { printf("dlopen failed\n"); return 3; }
        f.init = lookup(mode, lib, "cuInit", "cuInit");
        f.ctx = lookup(mode, lib, "cuCtxCreate", "cuCtxCreate_v2");
        f.alloc = lookup(mode, lib, "cuMemAlloc", "cuMemAlloc_v2");
        f.free = lookup(mode, lib, "cuMemFree", "cuMemFree_v2");
        f.info = lookup(mode, lib, "cuMemGetInfo", "cuMemGetInfo_v2");
        f.total = lookup(mode, lib, "cuDeviceTotalMem", "cuDeviceTotalMem_v2");
        f.launch = lookup(mode, lib, "cuLaunchKernel", "cuLaunchKernel");
        /* The per-thread-default-stream entry: flag CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2). */
        if (!strcmp(mode, "dlsym")) f.alloc_async = dlsym(lib, "cuMemAllocAsync_ptsz");
        else if (cuGetProcAddress_v2("cuMemAllocAsync", (void **)&f.alloc_async, 12040, 2, NULL) != 0) f.alloc_async = NULL;
        if (!f.alloc_async) { printf("lookup failed\n"); return 3; }
        if (!f.init || !f.ctx || !f.alloc || !f.free || !f.info || !f.total || !f.launch) {
            printf("lookup failed\n");
            return 3;
        }
    }
    CUdeviceptr ptrs[4096];
    int n = 0;
    for (int i = 2; i < argc; i++) {
        char *a = argv[i];
        if (!strcmp(a, "init")) {
            printf("init = %d\n", f.init(0));
        } else if (!strncmp(a, "ctx:", 4)) {
            void *c;
            printf("ctx = %d\n", f.ctx(&c, 0, atoi(a + 4)));
        } else if (!strncmp(a, "alloc:", 6)) {
            char *end;
            unsigned long long b = strtoull(a + 6, &end, 10);
            if (*end == 'm') b <<= 20;
            CUdeviceptr p = 0;
            CUresult r = f.alloc(&p, b);
            if (r == 0 && n < 4096) ptrs[n++] = p;
            printf("alloc %llu = %d\n", b, r);
        } else if (!strncmp(a, "async:", 6)) {
            char *end;
            unsigned long long b = strtoull(a + 6, &end, 10);
            if (*end == 'm') b <<= 20;
            CUdeviceptr p = 0;
            CUresult r = f.alloc_async(&p, b, NULL);
            if (r == 0 && n < 4096) ptrs[n++] = p;
            printf("async %llu = %d\n", b, r);
        } else if (!strncmp(a, "free:", 5)) {
            int k = atoi(a + 5);
            printf("free = %d\n", k < n ? f.free(ptrs[k]) : -1);
        } else if (!strcmp(a, "info")) {
            size_t fr = 0, t = 0;
            CUresult r = f.info(&fr, &t);
            printf("info = %d free %zu total %zu\n", r, fr, t);
        } else if (!strncmp(a, "total:", 6)) {
            size_t t = 0;
            CUresult r = f.total(&t, atoi(a + 6));
            printf("total = %d bytes %zu\n", r, t);
        } else if (!strncmp(a, "launch:", 7)) {
            int k = atoi(a + 7), ok = 0;
            for (int j = 0; j < k; j++) ok += f.launch((void *)1, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == 0;
            printf("launch ok %d\n", ok);
        } else if (!strcmp(a, "count")) {
            CUresult (*c)(unsigned long long *) = dlsym(RTLD_DEFAULT, "fakeCudaGetLaunchCount");
            unsigned long long v = 0;
            if (c) c(&v);
            printf("driver launches %llu\n", v);
        } else if (!strncmp(a, "stress:", 7)) {
            int threads = 1, iters = 1; unsigned seed = 1;
            sscanf(a + 7, "%d:%d:%u", &threads, &iters, &seed);
            pthread_t t[64];
            struct worker w[64];
            if (threads > 64) threads = 64;
            for (int j = 0; j < threads; j++) {
                w[j].iters = iters; w[j].seed = seed * 131 + j; w[j].refused = 0;
                pthread_create(&t[j], NULL, stress, &w[j]);
            }
            int refused = 0;
            for (int j = 0; j < threads; j++) { pthread_join(t[j], NULL); refused += w[j].refused; }
            printf("stress done refused %d\n", refused);
        } else if (!strncmp(a, "peak:", 5)) {
            CUresult (*pk)(int, unsigned long long *) = dlsym(RTLD_DEFAULT, "fakeCudaGetSharedPeak");
            unsigned long long v = 0;
            CUresult r = pk ? pk(atoi(a + 5), &v) : -1;
            printf("peak = %d bytes %llu\n", r, v);
        } else {
            printf("unknown step %s\n", a);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
