/* A stand-in for the CUDA driver (libcuda.so.1), for rehearsing a first real launch on a machine
 * without a GPU.
 *
 * It exports the driver entry points that Triton's NVIDIA backend calls (the ones its cuda_utils
 * and, in Triton 3.6 and older, its per-kernel launchers link against or look up with dlsym) and
 * answers them as one Hopper GPU would: one device, compute capability 9.0, 132 SMs, 227 KiB of
 * opt-in shared memory per block. Modules load only from a cubin (an ELF image, as ptxas writes
 * it), a function is found only if its name is in the image, and a launch checks its grid and block
 * against CUDA's limits, then does nothing: no kernel runs, no memory is touched. Every launch is
 * counted (standin_launches()) and, with AUTOKERNEL_STANDIN_TRACE set, told on stderr.
 *
 * Built by the rehearsal's tests with gcc: gcc -shared -fPIC -o libcuda.so.1 standin_libcuda.c
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

enum {
  CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_INVALID_IMAGE = 200, CUDA_ERROR_INVALID_CONTEXT = 201, CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701, CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* the fields of CUlaunchConfig a launch reads (cuda.h's layout) */
typedef struct {
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  void *attrs;
  unsigned int numAttrs;
} LaunchConfig;

struct module { size_t size; unsigned char *image; };
struct function { struct module *module; char name[256]; int shared_bytes; };

static int initialised = 0;
static int context_current = 0;
static char primary_context = 0;
static unsigned long long launches = 0;

/* answers of one H100 SXM (CUdevice_attribute numbers from cuda.h) */
static int attribute(int which) {
  switch (which) {
    case 1: return 1024;      /* MAX_THREADS_PER_BLOCK */
    case 2: return 1024;      /* MAX_BLOCK_DIM_X */
    case 3: return 1024;      /* MAX_BLOCK_DIM_Y */
    case 4: return 64;        /* MAX_BLOCK_DIM_Z */
    case 5: return 2147483647;/* MAX_GRID_DIM_X */
    case 6: return 65535;     /* MAX_GRID_DIM_Y */
    case 7: return 65535;     /* MAX_GRID_DIM_Z */
    case 8: return 49152;     /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 10: return 32;       /* WARP_SIZE */
    case 12: return 65536;    /* MAX_REGISTERS_PER_BLOCK */
    case 13: return 1980000;  /* CLOCK_RATE, kHz */
    case 16: return 132;      /* MULTIPROCESSOR_COUNT */
    case 36: return 2619000;  /* MEMORY_CLOCK_RATE, kHz */
    case 37: return 5120;     /* GLOBAL_MEMORY_BUS_WIDTH, bits */
    case 38: return 52428800; /* L2_CACHE_SIZE */
    case 39: return 2048;     /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 75: return 9;        /* COMPUTE_CAPABILITY_MAJOR */
    case 76: return 0;        /* COMPUTE_CAPABILITY_MINOR */
    case 81: return 233472;   /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 82: return 65536;    /* MAX_REGISTERS_PER_MULTIPROCESSOR */
    case 97: return 232448;   /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 106: return 32;      /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    case 120: return 1;       /* CLUSTER_LAUNCH */
    default: return 0;
  }
}

static void trace(const char *fmt, const char *name, const LaunchConfig *c) {
  if (getenv("AUTOKERNEL_STANDIN_TRACE") == NULL) return;
  fprintf(stderr, fmt, name, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
          c->blockDimZ, c->sharedMemBytes);
  fflush(stderr);
}

unsigned long long standin_launches(void) { return launches; }

CUresult cuInit(unsigned int flags) { (void)flags; initialised = 1; return CUDA_SUCCESS; }

CUresult cuDriverGetVersion(int *version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = 12080; /* a driver of the 570 series */
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = 1;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  if (!device || ordinal != 0) return CUDA_ERROR_INVALID_VALUE;
  initialised = 1;
  *device = 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int which, CUdevice device) {
  if (!value || device != 0) return CUDA_ERROR_INVALID_VALUE;
  *value = attribute(which);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
  if (!name || len <= 0 || device != 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "%s", "NVIDIA H100 80GB HBM3 (stand-in)");
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) {
  if (!ctx || device != 0) return CUDA_ERROR_INVALID_VALUE;
  *ctx = &primary_context;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  *ctx = context_current ? &primary_context : NULL;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (ctx != NULL && ctx != &primary_context) return CUDA_ERROR_INVALID_CONTEXT;
  context_current = ctx != NULL;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
  *device = 0;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) { return context_current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT; }

CUresult cuCtxGetLimit(size_t *value, int limit) {
  (void)limit;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  *value = 1 << 20;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(int limit, size_t value) { (void)limit; (void)value; return CUDA_SUCCESS; }

CUresult cuStreamIsCapturing(CUstream stream, int *status) {
  (void)stream;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  *status = 0; /* CU_STREAM_CAPTURE_STATUS_NONE */
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream stream) { (void)stream; return CUDA_SUCCESS; }

/* cubins are ELF files; the image's length is read from its section table, as the driver does */
static size_t elf_size(const unsigned char *p) {
  if (p[0] != 0x7f || p[1] != 'E' || p[2] != 'L' || p[3] != 'F' || p[4] != 2 /* 64-bit */) return 0;
  uint64_t shoff; uint16_t shentsize, shnum;
  memcpy(&shoff, p + 0x28, 8);
  memcpy(&shentsize, p + 0x3a, 2);
  memcpy(&shnum, p + 0x3c, 2);
  size_t end = (size_t)(shoff + (uint64_t)shentsize * shnum);
  for (uint16_t i = 0; i < shnum; i++) { /* a section may lie past the table */
    uint64_t off, size;
    memcpy(&off, p + shoff + (uint64_t)i * shentsize + 0x18, 8);
    memcpy(&size, p + shoff + (uint64_t)i * shentsize + 0x20, 8);
    if (off + size > end) end = (size_t)(off + size);
  }
  return end;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
  if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
  size_t size = elf_size((const unsigned char *)image);
  if (size == 0) return CUDA_ERROR_INVALID_IMAGE; /* PTX text or garbage: not what Triton loads */
  struct module *m = malloc(sizeof *m);
  m->image = malloc(size);
  memcpy(m->image, image, size);
  m->size = size;
  *module = m;
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule module) {
  struct module *m = module;
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  free(m->image);
  free(m);
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *fn, CUmodule module, const char *name) {
  struct module *m = module;
  if (!fn || !m || !name) return CUDA_ERROR_INVALID_VALUE;
  size_t n = strlen(name);
  if (n == 0 || n >= sizeof(((struct function *)0)->name)) return CUDA_ERROR_INVALID_VALUE;
  int found = 0;
  for (size_t i = 0; i + n <= m->size && !found; i++)
    found = memcmp(m->image + i, name, n) == 0 && (i + n == m->size || m->image[i + n] == 0);
  if (!found) return CUDA_ERROR_NOT_FOUND;
  struct function *f = calloc(1, sizeof *f);
  f->module = m;
  memcpy(f->name, name, n + 1);
  *fn = f;
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *value, int which, CUfunction fn) {
  if (!value || !fn) return CUDA_ERROR_INVALID_VALUE;
  switch (which) {
    case 0: *value = 1024; break;                                   /* MAX_THREADS_PER_BLOCK */
    case 1: *value = ((struct function *)fn)->shared_bytes; break; /* SHARED_SIZE_BYTES */
    case 4: *value = 32; break;                                     /* NUM_REGS */
    default: *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction fn, int which, int value) {
  if (!fn) return CUDA_ERROR_INVALID_HANDLE;
  /* SHARED_MEMORY_MODE (oversized shared memory) is newer than this driver: refused, as a 12.8
   * driver refuses it, so Triton takes the older path (MAX_DYNAMIC_SHARED_SIZE_BYTES) */
  if (which == 17) return CUDA_ERROR_INVALID_VALUE;
  if (which == 8 /* MAX_DYNAMIC_SHARED_SIZE_BYTES */) {
    if (value > attribute(97)) return CUDA_ERROR_INVALID_VALUE;
    ((struct function *)fn)->shared_bytes = value;
  }
  return CUDA_SUCCESS;
}

CUresult cuFuncSetCacheConfig(CUfunction fn, int config) { (void)config; return fn ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

/* Every pointer is a device pointer here: the rehearsal's tensors live in host memory, and nothing
 * is ever read or written through them. */
CUresult cuPointerGetAttribute(void *data, int which, CUdeviceptr ptr) {
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  if (which == 6 /* DEVICE_POINTER */) *(CUdeviceptr *)data = ptr;
  else if (which == 2 /* MEMORY_TYPE */) *(unsigned int *)data = 2; /* CU_MEMORYTYPE_DEVICE */
  else *(unsigned long long *)data = 0;
  return CUDA_SUCCESS;
}

CUresult cuPointerGetAttributes(unsigned int n, int *which, void **data, CUdeviceptr ptr) {
  for (unsigned int i = 0; i < n; i++) {
    CUresult r = cuPointerGetAttribute(data[i], which[i], ptr);
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

static CUresult launch(const char *name, const LaunchConfig *c, int shared_optin) {
  if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
  unsigned long long threads = (unsigned long long)c->blockDimX * c->blockDimY * c->blockDimZ;
  if (c->gridDimX == 0 || c->gridDimY == 0 || c->gridDimZ == 0 || threads == 0) return CUDA_ERROR_INVALID_VALUE;
  if (c->gridDimY > 65535 || c->gridDimZ > 65535 || c->blockDimZ > 64 || threads > 1024)
    return CUDA_ERROR_INVALID_VALUE;
  if ((int)c->sharedMemBytes > (shared_optin > 49152 ? shared_optin : 49152)) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  launches++;
  trace("standin-libcuda: launch %s grid=(%u,%u,%u) block=(%u,%u,%u) shared=%u\n", name, c);
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const LaunchConfig *config, CUfunction fn, void **params, void **extra) {
  (void)params; (void)extra;
  if (!config || !fn) return CUDA_ERROR_INVALID_VALUE;
  struct function *f = fn;
  return launch(f->name, config, f->shared_bytes);
}

CUresult cuLaunchKernel(CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                        void **extra) {
  (void)params; (void)extra;
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  LaunchConfig c = {gx, gy, gz, bx, by, bz, shared, stream, NULL, 0};
  struct function *f = fn;
  return launch(f->name, &c, f->shared_bytes);
}

CUresult cuOccupancyMaxActiveClusters(int *clusters, CUfunction fn, const LaunchConfig *config) {
  (void)fn; (void)config;
  if (!clusters) return CUDA_ERROR_INVALID_VALUE;
  *clusters = 16;
  return CUDA_SUCCESS;
}

/* a TMA descriptor: 128 opaque bytes; zeros stand in, since nothing reads them */
CUresult cuTensorMapEncodeTiled(void *map, int dtype, unsigned int rank, void *address, const uint64_t *dims,
                                const uint64_t *strides, const unsigned int *box, const unsigned int *elem_strides,
                                int interleave, int swizzle, int promotion, int fill) {
  (void)dtype; (void)address; (void)dims; (void)strides; (void)box; (void)elem_strides;
  (void)interleave; (void)swizzle; (void)promotion; (void)fill;
  if (!map || rank == 0 || rank > 5) return CUDA_ERROR_INVALID_VALUE;
  memset(map, 0, 128);
  return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeIm2col(void *map, int dtype, unsigned int rank, void *address, const uint64_t *dims,
                                 const uint64_t *strides, const int *lower, const int *upper, unsigned int channels,
                                 unsigned int pixels, const unsigned int *elem_strides, int interleave, int swizzle,
                                 int promotion, int fill) {
  (void)dtype; (void)address; (void)dims; (void)strides; (void)lower; (void)upper; (void)channels;
  (void)pixels; (void)elem_strides; (void)interleave; (void)swizzle; (void)promotion; (void)fill;
  if (!map || rank < 3 || rank > 5) return CUDA_ERROR_INVALID_VALUE;
  memset(map, 0, 128);
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
  if (!text) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS: *text = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
    case CUDA_ERROR_INVALID_IMAGE: *text = "device kernel image is invalid"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
    case CUDA_ERROR_INVALID_HANDLE: *text = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_FOUND: *text = "named symbol not found"; break;
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *text = "too many resources requested for launch"; break;
    default: *text = "unknown error"; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **text) { return cuGetErrorString(error, text); }
