/* test_devstate.c: the device-state layout (runtime/device/devstate.h) on the CPU,
 * and the refusals of the device half where it cannot run.
 *
 *  - for plans/v41-mini.yaml and v41-flash.yaml: every pool region holds
 *    pages * rt_kv_page_bytes, every ring, ring-position and tail region of
 *    a request slot is exactly the bytes the host request holds for that
 *    layer (rt_request_init's rings and tails), and their sum over layers
 *    equals rt_request_bytes' swa_bytes and tail_bytes plus the positions;
 *  - regions of one slab never overlap and each starts RT_DEV_ALIGN-aligned;
 *    n_slots request slots take n_slots * req_bytes;
 *  - bad counts are refused with a message;
 *  - without a GPU (or without CUDA), rt_dev_state_open, rt_dev_weights_upload
 *    and rt_cugraph_cache_open refuse with a reason instead of crashing.
 *
 * The device half on a GPU: tests/gpu/test_gpu_graph.cu (tests/gpu/run.sh).
 * Run: ctest --test-dir build -R '^devstate$'.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "runtime/device/cuda_graph.h"
#include "runtime/device/devstate.h"
#include "runtime/model/state.h"
#include "tests/harness.h"

static struct plan plan;
static struct rt_kv_pool pools[PLAN_MAX_LAYERS];
static struct rt_request req;
static struct rt_dev_layout L;

struct span {
  size_t a, b;
};

static bool disjoint_aligned(struct span *s, int n, const char *what) {
  bool ok = true;
  for (int i = 0; i < n; i++) {
    if (s[i].a % RT_DEV_ALIGN) {
      EXPECT(false, "%s: region %d starts at %zu, not %d-aligned", what, i, s[i].a, RT_DEV_ALIGN);
      ok = false;
    }
    for (int j = i + 1; j < n; j++)
      if (s[i].a < s[j].b && s[j].a < s[i].b) {
        EXPECT(false, "%s: regions %d [%zu, %zu) and %d [%zu, %zu) overlap", what, i, s[i].a, s[i].b, j, s[j].a,
               s[j].b);
        ok = false;
      }
  }
  return ok;
}

static void test_plan(const char *path) {
  char err[256] = "";
  if (!h_load_plan(path, &plan)) return;
  EXPECT(rt_kv_pools_init(pools, &plan, err, sizeof err) == 0, "%s: pools: %s", path, err);
  EXPECT(rt_request_init(&req, 0, &plan, pools, 4096) == 0, "%s: request", path);
  const int pages = 37, slots = 3;
  int rc = rt_dev_layout_init(&L, &plan, pools, &req, pages, slots, 12345, err, sizeof err);
  EXPECT(rc == 0, "%s: layout: %s", path, err);
  if (rc) goto out;
  struct rt_state_bytes b;
  rt_request_bytes(&req, &b);
  int64_t swa = 0, tail = 0;
  static struct span kv[PLAN_MAX_LAYERS], rq[3 * PLAN_MAX_LAYERS];
  int nkv = 0, nrq = 0;
  for (int l = 0; l < plan.n_layers; l++) {
    if (pools[l].entry_bytes) {
      EXPECT_EQ(L.kv[l].bytes, (int64_t)pages * (int64_t)rt_kv_page_bytes(&pools[l]), "%s: layer %d pool", path, l);
      kv[nkv++] = (struct span){L.kv[l].off, L.kv[l].off + L.kv[l].bytes};
    } else {
      EXPECT_EQ(L.kv[l].bytes, 0, "%s: layer %d has no pool", path, l);
    }
    EXPECT_EQ(L.ring[l].bytes, (int64_t)req.ring[l].window * (int64_t)req.ring[l].entry_bytes, "%s: ring %d", path, l);
    EXPECT_EQ(L.ring_pos[l].bytes, (int64_t)sizeof(int64_t) * req.ring[l].window, "%s: ring pos %d", path, l);
    swa += (int64_t)L.ring[l].bytes;
    rq[nrq++] = (struct span){L.ring[l].off, L.ring[l].off + L.ring[l].bytes};
    rq[nrq++] = (struct span){L.ring_pos[l].off, L.ring_pos[l].off + L.ring_pos[l].bytes};
    if (req.tail_buf[l]) {
      EXPECT_EQ(L.tail[l].bytes, (int64_t)(sizeof(float) * op_comp_tail_floats(req.tail[l].ratio, req.tail[l].d)),
                "%s: tail %d", path, l);
      tail += (int64_t)L.tail[l].bytes;
      rq[nrq++] = (struct span){L.tail[l].off, L.tail[l].off + L.tail[l].bytes};
    } else {
      EXPECT_EQ(L.tail[l].bytes, 0, "%s: layer %d has no tail", path, l);
    }
  }
  EXPECT_EQ(swa, b.swa_bytes, "%s: rings = rt_request_bytes' swa_bytes", path);
  EXPECT_EQ(tail, b.tail_bytes, "%s: tails = rt_request_bytes' tail_bytes", path);
  disjoint_aligned(kv, nkv, "KV slab");
  disjoint_aligned(rq, nrq, "request slab");
  for (int i = 0; i < nkv; i++) EXPECT(kv[i].b <= L.kv_total, "%s: pool region %d past the KV slab", path, i);
  for (int i = 0; i < nrq; i++) EXPECT(rq[i].b <= L.req_bytes, "%s: request region %d past the slot", path, i);
  EXPECT_EQ(L.req_total, (int64_t)L.req_bytes * slots, "%s: slots", path);
  EXPECT(L.act_total >= 12345 && L.act_total % RT_DEV_ALIGN == 0, "%s: activations %zu", path, L.act_total);
  EXPECT(L.param_bytes >= sizeof(struct rt_dev_params), "%s: parameter block", path);
  EXPECT_EQ(rt_dev_layout_total(&L), (int64_t)(L.kv_total + L.req_total + L.act_total + L.param_bytes), "%s: total",
            path);
  printf("%s: %d pages/pool -> KV %zu B, %d slots x %zu B, params %zu B\n", path, pages, L.kv_total, slots,
         L.req_bytes, L.param_bytes);

  /* Bad counts. */
  err[0] = 0;
  EXPECT(rt_dev_layout_init(&L, &plan, pools, &req, -1, 1, 0, err, sizeof err) == CEDAR_EINVAL && strstr(err, "-1"),
         "%s: negative pages refused: '%s'", path, err);
  err[0] = 0;
  EXPECT(rt_dev_layout_init(&L, &plan, pools, &req, 1, 0, 0, err, sizeof err) == CEDAR_EINVAL && strstr(err, "slots"),
         "%s: zero slots refused: '%s'", path, err);

  /* The device half refuses here (no GPU on this machine, or no CUDA). */
  rt_dev_layout_init(&L, &plan, pools, &req, 2, 1, 0, err, sizeof err);
  struct rt_dev_state *ds = NULL;
  err[0] = 0;
  rc = rt_dev_state_open(&ds, &L, 0, err, sizeof err);
  if (rc == 0) {
    printf("%s: device state opened on device 0 (a GPU and StarPU-CUDA are present)\n", path);
    rt_dev_state_close(ds);
  } else {
    EXPECT(rc == CEDAR_EUNSUPPORTED && err[0] && !ds, "%s: rt_dev_state_open: rc %d, err '%s'", path, rc, err);
    printf("%s: device state refused: %s\n", path, err);
  }
out:
  rt_request_free(&req);
  rt_kv_pools_free(pools, plan.n_layers);
  plan_free(&plan);
}

static void test_graph_refusal(void) {
  struct rt_cugraph_cache *c = NULL;
  char err[256] = "";
  int rc = rt_cugraph_cache_open(&c, 0, sizeof(struct rt_dev_params), err, sizeof err);
  if (rc == 0) {
    printf("graph cache opened on device 0\n");
    rt_cugraph_cache_close(c);
    return;
  }
  EXPECT(rc == CEDAR_EUNSUPPORTED && err[0] && !c, "rt_cugraph_cache_open: rc %d, err '%s'", rc, err);
  printf("graph cache refused: %s\n", err);
}

int main(void) {
  test_plan("plans/v41-mini.yaml");
  test_plan("plans/v41-flash.yaml");
  test_graph_refusal();
  return h_report("devstate");
}
