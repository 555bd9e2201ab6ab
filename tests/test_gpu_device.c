/* test_gpu_device.c: the CUDA device query (kernels/device.h) and cedar's
 * GPU-test convention.
 *
 * Convention: a test that needs a GPU calls kern_device_query first and, when
 * it returns no device (CPU-only build, no driver, no GPU), prints the reason
 * (the CUDA error name, e.g. cudaErrorInsufficientDriver) and exits 77, which
 * CTest reports as skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt).
 *
 * With a device it checks the list is sane: names non-empty and terminated,
 * compute capability >= 3.0, memory >= 256 MiB, SMs > 0, the count stable
 * across calls, and max = 0 / max = 1 honoured. It also checks the CPU-side
 * parts of the contract that hold without a GPU (error text set, the
 * ENOCUDA/ECUDA codes used as documented).
 *
 * Run: ctest --test-dir build -R gpu_device --output-on-failure
 */
#include <stdio.h>
#include <string.h>

#include "kernels/device.h"

#define SKIP 77
#define MAXDEV 64

static int failures;

#define EXPECT(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);      \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
      failures++;                                                          \
    }                                                                      \
  } while (0)

/* No device: the error must say why, in the documented form. */
static int check_absent(int n, const char *err) {
  EXPECT(n == KERN_DEVICE_ENOCUDA || n == KERN_DEVICE_ECUDA, "unexpected return %d", n);
  EXPECT(err[0] != '\0', "no reason given for return %d", n);
  if (n == KERN_DEVICE_ECUDA)
    EXPECT(!strncmp(err, "cudaError", 9), "reason should start with the CUDA error name: '%s'", err);
  if (n == KERN_DEVICE_ENOCUDA)
    EXPECT(strstr(err, "not built with CUDA") != NULL, "reason: '%s'", err);
  int rt = -1, drv = -1;
  char verr[256];
  int vrc = kern_cuda_version(&rt, &drv, verr, sizeof verr);
  if (n == KERN_DEVICE_ENOCUDA) EXPECT(vrc == KERN_DEVICE_ENOCUDA, "version rc %d", vrc);
  if (vrc == 0) EXPECT(rt >= 12000, "CUDA runtime version %d", rt);
  if (failures) return 1;
  printf("skip: no CUDA device: %s\n", err);
  return SKIP;
}

static void check_device(const struct kern_device_info *d, int i) {
  EXPECT(d->index == i, "device %d has index %d", i, d->index);
  EXPECT(memchr(d->name, '\0', sizeof d->name) != NULL && d->name[0], "device %d name", i);
  EXPECT(d->cc_major >= 3 && d->cc_major < 100 && d->cc_minor >= 0 && d->cc_minor < 10,
         "device %d compute capability %d.%d", i, d->cc_major, d->cc_minor);
  EXPECT(d->total_mem >= ((size_t)256 << 20), "device %d memory %zu B", i, d->total_mem);
  EXPECT(d->sm_count > 0 && d->sm_count < 10000, "device %d SMs %d", i, d->sm_count);
  EXPECT(d->clock_khz > 0, "device %d clock %d kHz", i, d->clock_khz);
  EXPECT(d->pci_bus >= 0 && d->pci_device >= 0, "device %d PCI %d:%d", i, d->pci_bus,
         d->pci_device);
  printf("device %d: %s, cc %d.%d, %.1f GiB, %d SMs, %d MHz\n", i, d->name, d->cc_major,
         d->cc_minor, d->total_mem / 1073741824.0, d->sm_count, d->clock_khz / 1000);
}

int main(void) {
  static struct kern_device_info devs[MAXDEV];
  char err[512];
  memset(err, 0, sizeof err);
  int n = kern_device_query(devs, MAXDEV, err, sizeof err);
  if (n <= 0) {
    if (n == 0) {
      printf("skip: CUDA reports 0 devices\n");
      return SKIP;
    }
    return check_absent(n, err);
  }

  EXPECT(err[0] == '\0', "error text set on success: '%s'", err);
  for (int i = 0; i < n && i < MAXDEV; i++) check_device(&devs[i], i);

  /* The count does not depend on max, and max bounds what is written. */
  EXPECT(kern_device_query(NULL, 0, NULL, 0) == n, "count with max = 0 differs");
  struct kern_device_info one[2];
  memset(one, 0xa5, sizeof one);
  EXPECT(kern_device_query(one, 1, err, sizeof err) == n, "count with max = 1 differs");
  EXPECT(!strcmp(one[0].name, devs[0].name), "device 0 differs between calls");
  const unsigned char *sentinel = (const unsigned char *)&one[1];
  for (size_t b = 0; b < sizeof one[1]; b++)
    if (sentinel[b] != 0xa5) {
      EXPECT(0, "max = 1 wrote past out[0] (byte %zu)", b);
      break;
    }

  int rt = 0, drv = 0;
  EXPECT(kern_cuda_version(&rt, &drv, err, sizeof err) == 0, "version: %s", err);
  /* Minor-version compatibility: a 13.x driver runs any 13.y runtime. */
  EXPECT(rt >= 12000 && drv / 1000 >= rt / 1000, "runtime %d driver %d", rt, drv);
  printf("CUDA runtime %d, driver %d, %d device(s)\n", rt, drv, n);
  return failures ? 1 : 0;
}
