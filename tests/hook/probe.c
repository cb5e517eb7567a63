/* Test program for the runtime hook: drives the CUDA driver API the way applications do, through
 * one of three lookup paths, from a little script on the command line, printing one line per step.
 *   probe MODE STEP...      MODE: direct (linked -lcuda) | procaddr (cuGetProcAddress_v2) | dlsym (dlopen+dlsym)
 *   STEP: init | ctx:DEV | alloc:BYTES[m] | free:INDEX | info | total:DEV | launch:N | count
 *         | stress:THREADS:ITERS:SEED (random alloc/free of up to 64 MiB on device 0) | peak:DEV
 *         | stressuntil:THREADS:PATH:SEED (the same until the file PATH exists)
 *         | async:BYTES | managed:BYTES | pool:BYTES | poolp:BYTES (_ptsz) | pitch:WIDTH:HEIGHT
 *         | vmm:DEV:BYTES | release:INDEX | array:W:H | array3d:W:H:D | arrfree:INDEX
 *         | alloc1:BYTES | free1:INDEX | info1 (the CUDA 3.1 ABI)
 *         | mipmap:W:H:LEVELS (float4) | mipfree:INDEX
 *         | launchp:N | coop:N | coopp:N | launchex:N | launchexp:N | graph:N | graphp:N
 *         | rate:TOTAL_MS:WINDOW_MS:GRID (launch GRID-block kernels as fast as allowed for TOTAL_MS,
 *           printing "window START_MS LAUNCHES_PER_S" per window)
 *         | hold:MS (stay alive MS milliseconds)
 *         | tlaunch:THREADS:N (THREADS threads start together, launch N kernels each, then exit)
 *         | forklaunch:N (a fork()ed child launches N kernels and exits)
 *         | nvml:INDEX (nvmlDeviceGetMemoryInfo and _v2 of NVML device INDEX)
 *   (BYTES takes an m suffix for MiB; the 'p' steps use the per-thread-default-stream entry)
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

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
typedef CUresult (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
typedef CUresult (*coop_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **);
/* CUlaunchConfig, CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, CUmemAllocationProp as in cuda.h. */
typedef struct { unsigned grid[3], block[3], shared; void *stream; void *attrs; unsigned nattrs; } launch_config;
typedef CUresult (*launchex_fn)(const launch_config *, void *, void **, void **);
typedef struct { size_t w, h; unsigned format, channels; } array_desc;
typedef struct { size_t w, h, d; unsigned format, channels, flags; } array3d_desc;
typedef struct { unsigned type, handle_types, loc_type; int loc_id; void *win32; unsigned char flags[8]; } alloc_prop;
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, void *, void *);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, void *, void *);
CUresult cuMemCreate(unsigned long long *, size_t, const alloc_prop *, unsigned long long);
CUresult cuDeviceGetDefaultMemPool(void **, int);
CUresult cuCtxGetDevice(int *);
CUresult cuMemRelease(unsigned long long);
CUresult cuArrayCreate_v2(void **, const array_desc *);
CUresult cuArray3DCreate_v2(void **, const array3d_desc *);
CUresult cuArrayDestroy(void *);
CUresult cuMipmappedArrayCreate(void **, const array3d_desc *, unsigned);
CUresult cuMipmappedArrayDestroy(void *);
CUresult cuMemAlloc(unsigned *, unsigned);
CUresult cuMemFree(unsigned);
CUresult cuMemGetInfo(unsigned *, unsigned *);
CUresult cuLaunchKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
CUresult cuLaunchCooperativeKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **);
CUresult cuLaunchCooperativeKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **);
CUresult cuLaunchKernelEx(const launch_config *, void *, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const launch_config *, void *, void **, void **);
CUresult cuGraphLaunch(void *, void *);
CUresult cuGraphLaunch_ptsz(void *, void *);
typedef struct { unsigned long long total, free, used; } nvml_memory;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvml_memory_v2;
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned, void **);
int nvmlDeviceGetMemoryInfo(void *, nvml_memory *);
int nvmlDeviceGetMemoryInfo_v2(void *, nvml_memory_v2 *);
static struct {
    int (*init)(void);
    int (*handle)(unsigned, void **);
    int (*mem)(void *, nvml_memory *);
    int (*mem2)(void *, nvml_memory_v2 *);
} nv;

/* The entry points beyond the basic ones, each resolved on the chosen path. */
static struct {
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*pool)(CUdeviceptr *, size_t, void *, void *);
    CUresult (*poolp)(CUdeviceptr *, size_t, void *, void *);
    CUresult (*vmm)(unsigned long long *, size_t, const alloc_prop *, unsigned long long);
    CUresult (*release)(unsigned long long);
    CUresult (*array)(void **, const array_desc *);
    CUresult (*array3d)(void **, const array3d_desc *);
    CUresult (*arrfree)(void *);
    CUresult (*mipmap)(void **, const array3d_desc *, unsigned);
    CUresult (*mipfree)(void *);
    CUresult (*alloc1)(unsigned *, unsigned);
    CUresult (*free1)(unsigned);
    CUresult (*info1)(unsigned *, unsigned *);
    launch_fn launchp;
    coop_fn coop, coopp;
    launchex_fn launchex, launchexp;
    CUresult (*graph)(void *, void *);
    CUresult (*graphp)(void *, void *);
} g;

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

static void *lookup_v(const char *mode, void *lib, const char *base, const char *full, int version,
                      unsigned long long flags) {
    void *p = NULL;
    if (!strcmp(mode, "dlsym")) return dlsym(lib, full);
    /* The runtime asks for base names with its CUDA version and gets the versioned entry. */
    if (cuGetProcAddress_v2(base, &p, version, flags, NULL) != 0) return NULL;
    return p;
}

static void *lookup(const char *mode, void *lib, const char *base, const char *full) {
    return lookup_v(mode, lib, base, full, 12040, 0);
}

/* Resolves g on a lookup path; returns 0 when something is missing. */
static int lookup_more(const char *mode, void *lib) {
#define L(field, base, full, ver, flags) if (!(*(void **)&g.field = lookup_v(mode, lib, base, full, ver, flags))) { printf("lookup %s failed\n", full); return 0; }
    L(managed, "cuMemAllocManaged", "cuMemAllocManaged", 12040, 0);
    L(pitch, "cuMemAllocPitch", "cuMemAllocPitch_v2", 12040, 0);
    L(pool, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 12040, 0);
    L(poolp, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", 12040, 2);
    L(vmm, "cuMemCreate", "cuMemCreate", 12040, 0);
    L(release, "cuMemRelease", "cuMemRelease", 12040, 0);
    L(array, "cuArrayCreate", "cuArrayCreate_v2", 12040, 0);
    L(array3d, "cuArray3DCreate", "cuArray3DCreate_v2", 12040, 0);
    L(arrfree, "cuArrayDestroy", "cuArrayDestroy", 12040, 0);
    L(mipmap, "cuMipmappedArrayCreate", "cuMipmappedArrayCreate", 12040, 0);
    L(mipfree, "cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", 12040, 0);
    /* A program built against CUDA 3.1 gets the 32-bit ABI. */
    L(alloc1, "cuMemAlloc", "cuMemAlloc", 3010, 0);
    L(free1, "cuMemFree", "cuMemFree", 3010, 0);
    L(info1, "cuMemGetInfo", "cuMemGetInfo", 3010, 0);
    L(launchp, "cuLaunchKernel", "cuLaunchKernel_ptsz", 12040, 2);
    L(coop, "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", 12040, 0);
    L(coopp, "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", 12040, 2);
    L(launchex, "cuLaunchKernelEx", "cuLaunchKernelEx", 12040, 0);
    L(launchexp, "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz", 12040, 2);
    L(graph, "cuGraphLaunch", "cuGraphLaunch", 12040, 0);
    L(graphp, "cuGraphLaunch", "cuGraphLaunch_ptsz", 12040, 2);
#undef L
    return 1;
}

static unsigned long long bytes_arg(const char *a) {
    char *end;
    unsigned long long b = strtoull(a, &end, 10);
    if (*end == 'm') b <<= 20;
    return b;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

struct worker { int iters; const char *stop; unsigned seed; int refused; double worst_ms; double worst_wall_ms; int schedstat; };

/* Time this thread has spent runnable but waiting for a CPU (ms), from the second field of
 * /proc/thread-self/schedstat (Documentation/scheduler/sched-stats.rst); 0 if unavailable. */
static double runqueue_ms(int fd) {
    char buf[128];
    if (fd < 0) return 0;
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    unsigned long long run = 0, wait = 0;
    if (sscanf(buf, "%llu %llu", &run, &wait) != 2) return 0;
    return wait / 1e6;
}

/* Times one driver call. "Blocked" is the wall time minus the time the thread sat runnable in a
 * run queue: on an oversubscribed machine (64 stress threads on 2 cores) a thread can wait for a
 * CPU for a second, which is not the hook making it wait. What is left is time spent sleeping or
 * waiting on something (a lock, a futex, a throttle): the longest is what "never block" is
 * checked against. The wall time is reported too. */
#define TIMED(w, call) do { double q0_ = runqueue_ms((w)->schedstat); double t0_ = now_ms(); call; \
    double d_ = now_ms() - t0_; double b_ = d_ - (runqueue_ms((w)->schedstat) - q0_); \
    if (d_ > (w)->worst_wall_ms) (w)->worst_wall_ms = d_; \
    if (b_ > (w)->worst_ms) (w)->worst_ms = b_; } while (0)

struct lworker { int n; int ok; pthread_barrier_t *start; };

static void *launcher(void *arg) {
    struct lworker *w = arg;
    void *c;
    f.ctx(&c, 0, 0);
    /* All threads make their first launch together: the hook's first-launch path (a meter, the
     * process's slot) must hold up when they race. */
    pthread_barrier_wait(w->start);
    for (int j = 0; j < w->n; j++) w->ok += f.launch((void *)1, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == 0;
    return NULL;
}

static void *stress(void *arg) {
    struct worker *w = arg;
    w->schedstat = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    void *c;
    f.ctx(&c, 0, 0);
    CUdeviceptr held[64];
    int n = 0;
    for (int i = 0; w->stop || i < w->iters; i++) {
        if (w->stop && (i & 63) == 0 && access(w->stop, F_OK) == 0) break;
        if (n < 64 && (n == 0 || rand_r(&w->seed) % 3 != 0)) {
            CUdeviceptr p;
            size_t b = 1 + (size_t)(rand_r(&w->seed) % (64u << 20));
            CUresult r;
            TIMED(w, r = f.alloc(&p, b));
            if (r == 0) held[n++] = p; else w->refused++;
        } else {
            int k = rand_r(&w->seed) % n;
            TIMED(w, f.free(held[k]));
            held[k] = held[--n];
        }
    }
    while (n > 0) f.free(held[--n]);
    if (w->schedstat >= 0) close(w->schedstat);
    return NULL;
}

int main(int argc, char **argv) {
    /* Line-buffered: in a container stdout is a pipe to the log, read while the probe holds. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    const char *mode = argv[1];
    if (!strcmp(mode, "direct")) {
        f.init = cuInit; f.ctx = cuCtxCreate_v2; f.alloc = cuMemAlloc_v2; f.free = cuMemFree_v2;
        f.info = cuMemGetInfo_v2; f.total = cuDeviceTotalMem_v2; f.launch = cuLaunchKernel;
        f.alloc_async = cuMemAllocAsync;
        g.managed = cuMemAllocManaged; g.pitch = cuMemAllocPitch_v2; g.pool = cuMemAllocFromPoolAsync;
        g.poolp = cuMemAllocFromPoolAsync_ptsz; g.vmm = cuMemCreate; g.release = cuMemRelease;
        g.array = cuArrayCreate_v2; g.array3d = cuArray3DCreate_v2; g.arrfree = cuArrayDestroy;
        g.mipmap = cuMipmappedArrayCreate; g.mipfree = cuMipmappedArrayDestroy;
        g.alloc1 = cuMemAlloc; g.free1 = cuMemFree; g.info1 = cuMemGetInfo;
        g.launchp = cuLaunchKernel_ptsz; g.coop = cuLaunchCooperativeKernel;
        g.coopp = cuLaunchCooperativeKernel_ptsz; g.launchex = cuLaunchKernelEx;
        g.launchexp = cuLaunchKernelEx_ptsz; g.graph = cuGraphLaunch; g.graphp = cuGraphLaunch_ptsz;
        nv.init = nvmlInit_v2; nv.handle = nvmlDeviceGetHandleByIndex_v2;
        nv.mem = nvmlDeviceGetMemoryInfo; nv.mem2 = nvmlDeviceGetMemoryInfo_v2;
    } else {
        void *ml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        if (!ml) { printf("dlopen nvml failed\n"); return 3; }
        *(void **)&nv.init = dlsym(ml, "nvmlInit_v2");
        *(void **)&nv.handle = dlsym(ml, "nvmlDeviceGetHandleByIndex_v2");
        *(void **)&nv.mem = dlsym(ml, "nvmlDeviceGetMemoryInfo");
        *(void **)&nv.mem2 = dlsym(ml, "nvmlDeviceGetMemoryInfo_v2");
        void *lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (!lib) { printf("dlopen failed\n"); return 3; }
        f.init = lookup(mode, lib, "cuInit", "cuInit");
        /* cuCtxCreate gained ABIs at 11.4 (_v3) and 12.5 (_v4): the driver hands out the newest one
         * at or below the version asked, so a caller of the _v2 signature asks at 3.2
         * (PFN_cuCtxCreate_v3020), as the CUDA programming guide's "Driver Entry Point Access" says. */
        f.ctx = lookup_v(mode, lib, "cuCtxCreate", "cuCtxCreate_v2", 3020, 0);
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
        if (!lookup_more(mode, lib)) return 3;
    }
    CUdeviceptr ptrs[4096];
    int n = 0;
    unsigned long long handles[256];
    int nh = 0;
    void *arrays[256];
    int na = 0;
    void *mipmaps[256];
    int nm = 0;
    unsigned ptrs32[256];
    int n32 = 0;
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
        } else if (!strncmp(a, "stress:", 7) || !strncmp(a, "stressuntil:", 12)) {
            int threads = 1, iters = 1; unsigned seed = 1;
            char stop[4096] = "";
            if (a[6] == ':') sscanf(a + 7, "%d:%d:%u", &threads, &iters, &seed);
            else sscanf(a + 12, "%d:%4095[^:]:%u", &threads, stop, &seed);
            pthread_t t[64];
            struct worker w[64];
            if (threads > 64) threads = 64;
            for (int j = 0; j < threads; j++) {
                w[j].iters = iters; w[j].stop = stop[0] ? stop : NULL; w[j].seed = seed * 131 + j; w[j].refused = 0; w[j].worst_ms = 0; w[j].worst_wall_ms = 0;
                pthread_create(&t[j], NULL, stress, &w[j]);
            }
            int refused = 0;
            double worst = 0, worst_wall = 0;
            for (int j = 0; j < threads; j++) {
                pthread_join(t[j], NULL);
                refused += w[j].refused;
                if (w[j].worst_ms > worst) worst = w[j].worst_ms;
                if (w[j].worst_wall_ms > worst_wall) worst_wall = w[j].worst_wall_ms;
            }
            printf("stress done refused %d worst_ms %.3f worst_wall_ms %.3f\n", refused, worst, worst_wall);
        } else if (!strncmp(a, "peak:", 5)) {
            CUresult (*pk)(int, unsigned long long *) = dlsym(RTLD_DEFAULT, "fakeCudaGetSharedPeak");
            unsigned long long v = 0;
            CUresult r = pk ? pk(atoi(a + 5), &v) : -1;
            printf("peak = %d bytes %llu\n", r, v);
        } else if (!strncmp(a, "managed:", 8) || !strncmp(a, "pool:", 5) || !strncmp(a, "poolp:", 6)) {
            CUdeviceptr p = 0;
            CUresult r;
            unsigned long long b = bytes_arg(strchr(a, ':') + 1);
            /* Pool allocations come from the current device's default pool (a pool handle is
             * required: "hPool: The pool to allocate from"). */
            int dev = 0;
            void *pool = NULL;
            cuCtxGetDevice(&dev);
            cuDeviceGetDefaultMemPool(&pool, dev);
            if (a[0] == 'm') r = g.managed(&p, b, 1);
            else if (!strncmp(a, "poolp:", 6)) r = g.poolp(&p, b, pool, NULL);
            else r = g.pool(&p, b, pool, NULL);
            if (r == 0 && n < 4096) ptrs[n++] = p;
            printf("%.*s %llu = %d\n", (int)(strchr(a, ':') - a), a, b, r);
        } else if (!strncmp(a, "pitch:", 6)) {
            size_t w = 0, h = 0, pitch = 0;
            sscanf(a + 6, "%zu:%zu", &w, &h);
            CUdeviceptr p = 0;
            CUresult r = g.pitch(&p, &pitch, w, h, 4);
            if (r == 0 && n < 4096) ptrs[n++] = p;
            printf("pitch %zux%zu = %d pitch %zu\n", w, h, r, pitch);
        } else if (!strncmp(a, "vmm:", 4)) {
            int dev = 0;
            char *colon = strchr(a + 4, ':');
            dev = atoi(a + 4);
            unsigned long long b = colon ? bytes_arg(colon + 1) : 0, h = 0;
            alloc_prop prop;
            memset(&prop, 0, sizeof prop);
            prop.type = 1;     /* CU_MEM_ALLOCATION_TYPE_PINNED */
            prop.loc_type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
            prop.loc_id = dev;
            CUresult r = g.vmm(&h, b, &prop, 0);
            if (r == 0 && nh < 256) handles[nh++] = h;
            printf("vmm %d %llu = %d\n", dev, b, r);
        } else if (!strncmp(a, "release:", 8)) {
            int k = atoi(a + 8);
            printf("release = %d\n", k < nh ? g.release(handles[k]) : -1);
        } else if (!strncmp(a, "array:", 6) || !strncmp(a, "array3d:", 8)) {
            size_t w = 0, h = 0, d = 0;
            void *arr = NULL;
            CUresult r;
            if (!strncmp(a, "array3d:", 8)) {
                sscanf(a + 8, "%zu:%zu:%zu", &w, &h, &d);
                array3d_desc desc = { w, h, d, 0x20, 4, 0 }; /* CU_AD_FORMAT_FLOAT, 4 channels */
                r = g.array3d(&arr, &desc);
            } else {
                sscanf(a + 6, "%zu:%zu", &w, &h);
                array_desc desc = { w, h, 0x20, 4 };
                r = g.array(&arr, &desc);
            }
            if (r == 0 && na < 256) arrays[na++] = arr;
            printf("%.*s = %d\n", (int)(strchr(a, ':') - a), a, r);
        } else if (!strncmp(a, "mipmap:", 7)) {
            size_t w = 0, h = 0;
            unsigned levels = 0;
            sscanf(a + 7, "%zu:%zu:%u", &w, &h, &levels);
            array3d_desc desc = { w, h, 0, 0x20, 4, 0 }; /* CU_AD_FORMAT_FLOAT, 4 channels */
            void *arr = NULL;
            CUresult r = g.mipmap(&arr, &desc, levels);
            if (r == 0 && nm < 256) mipmaps[nm++] = arr;
            printf("mipmap = %d\n", r);
        } else if (!strncmp(a, "mipfree:", 8)) {
            int k = atoi(a + 8);
            printf("mipfree = %d\n", k < nm ? g.mipfree(mipmaps[k]) : -1);
        } else if (!strncmp(a, "arrfree:", 8)) {
            int k = atoi(a + 8);
            printf("arrfree = %d\n", k < na ? g.arrfree(arrays[k]) : -1);
        } else if (!strncmp(a, "alloc1:", 7)) {
            unsigned p = 0;
            unsigned long long b = bytes_arg(a + 7);
            CUresult r = g.alloc1(&p, (unsigned)b);
            if (r == 0 && n32 < 256) ptrs32[n32++] = p;
            printf("alloc1 %llu = %d\n", b, r);
        } else if (!strncmp(a, "free1:", 6)) {
            int k = atoi(a + 6);
            printf("free1 = %d\n", k < n32 ? g.free1(ptrs32[k]) : -1);
        } else if (!strcmp(a, "info1")) {
            unsigned fr = 0, t = 0;
            CUresult r = g.info1(&fr, &t);
            printf("info1 = %d free %u total %u\n", r, fr, t);
        } else if (!strncmp(a, "launchp:", 8) || !strncmp(a, "coop:", 5) || !strncmp(a, "coopp:", 6)
                   || !strncmp(a, "launchex:", 9) || !strncmp(a, "launchexp:", 10)
                   || !strncmp(a, "graph:", 6) || !strncmp(a, "graphp:", 7)) {
            int len = (int)(strchr(a, ':') - a), k = atoi(a + len + 1), ok = 0;
            launch_config cfg = { {2, 2, 1}, {32, 1, 1}, 0, NULL, NULL, 0 };
            for (int j = 0; j < k; j++) {
                CUresult r;
                if (!strncmp(a, "launchp:", 8)) r = g.launchp((void *)1, 2, 2, 1, 32, 1, 1, 0, NULL, NULL, NULL);
                else if (!strncmp(a, "coop:", 5)) r = g.coop((void *)1, 2, 2, 1, 32, 1, 1, 0, NULL, NULL);
                else if (!strncmp(a, "coopp:", 6)) r = g.coopp((void *)1, 2, 2, 1, 32, 1, 1, 0, NULL, NULL);
                else if (!strncmp(a, "launchex:", 9)) r = g.launchex(&cfg, (void *)1, NULL, NULL);
                else if (!strncmp(a, "launchexp:", 10)) r = g.launchexp(&cfg, (void *)1, NULL, NULL);
                else if (!strncmp(a, "graph:", 6)) r = g.graph((void *)1, NULL);
                else r = g.graphp((void *)1, NULL);
                ok += r == 0;
            }
            printf("%.*s ok %d\n", len, a, ok);
        } else if (!strncmp(a, "tlaunch:", 8)) {
            int threads = 1, n = 0, ok = 0;
            sscanf(a + 8, "%d:%d", &threads, &n);
            if (threads > 64) threads = 64;
            pthread_t t[64];
            struct lworker w[64];
            pthread_barrier_t start;
            if (threads < 1) threads = 1;
            pthread_barrier_init(&start, NULL, threads);
            for (int j = 0; j < threads; j++) {
                w[j].n = n; w[j].ok = 0; w[j].start = &start;
                pthread_create(&t[j], NULL, launcher, &w[j]);
            }
            for (int j = 0; j < threads; j++) {
                pthread_join(t[j], NULL);
                ok += w[j].ok;
            }
            pthread_barrier_destroy(&start);
            printf("tlaunch ok %d\n", ok);
        } else if (!strncmp(a, "forklaunch:", 11)) {
            int n = atoi(a + 11), st = 0;
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                int ok = 0;
                for (int j = 0; j < n; j++) ok += f.launch((void *)1, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == 0;
                printf("child launch ok %d\n", ok);
                fflush(stdout);
                exit(0);
            }
            waitpid(pid, &st, 0);
            printf("child exited %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        } else if (!strncmp(a, "hold:", 5)) {
            struct timespec t = { atoi(a + 5) / 1000, (atoi(a + 5) % 1000) * 1000000L };
            nanosleep(&t, NULL);
            printf("held\n");
        } else if (!strncmp(a, "nvml:", 5)) {
            void *dev = NULL;
            nvml_memory m = {0, 0, 0};
            nvml_memory_v2 m2 = {40 | (2u << 24), 0, 0, 0, 0}; /* nvmlMemory_v2 */
            int r = nv.init();
            if (r == 0) r = nv.handle(atoi(a + 5), &dev);
            int r1 = r ? r : nv.mem(dev, &m), r2 = r ? r : nv.mem2(dev, &m2);
            printf("nvml = %d total %llu free %llu used %llu\n", r1, m.total, m.free, m.used);
            printf("nvml2 = %d total %llu free %llu used %llu\n", r2, m2.total, m2.free, m2.used);
        } else if (!strncmp(a, "rate:", 5)) {
            int total = 0, window = 0;
            unsigned grid = 1;
            sscanf(a + 5, "%d:%d:%u", &total, &window, &grid);
            double start = now_ms(), w0 = start;
            long count = 0;
            for (;;) {
                if (f.launch((void *)1, grid, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != 0) { printf("launch failed\n"); return 4; }
                count++;
                double t = now_ms();
                if (t - w0 >= window) {
                    printf("window %.0f %.1f\n", w0 - start, count * 1e3 / (t - w0));
                    fflush(stdout);
                    w0 = t;
                    count = 0;
                    if (t - start >= total) break;
                }
            }
        } else {
            printf("unknown step %s\n", a);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
