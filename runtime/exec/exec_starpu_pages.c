/* exec_starpu_pages.c: the StarPU data interface over one KV source's page
 * list (exec_starpu_data.h: sp__pages_register). One handle stands for all
 * the pages a request's sequence of one source holds, so a decode task at
 * 4K names one buffer per KV access instead of one per page: StarPU's cost
 * is about 0.3 us per buffer of a task, and a decode step of v41-mini at
 * 4096 bound 2,645 page buffers, 42 page lists now (docs/PERF.md,
 * "StarPU's decode step at 4K").
 *
 * The interface holds the sequence (struct rt_kv_seq), not a copy of its
 * table: pages appended after registration are covered without registering
 * again, and the codelet reads the pages through seq->page_ptr, the table
 * the direct executor reads. Its size is the pages held now times the page
 * bytes. The pages live in main RAM only: a host-home task runs on a CPU
 * worker, so StarPU never allocates or copies a page list elsewhere; a
 * backend that kept KV copies on another node would move them with
 * TRANSFER nodes (scheduler/graph.h), and an attempt to allocate one on
 * another node is a programming error that the assert below names.
 * Test: tests/test_exec_starpu_data.c (every page read through its list).
 */
#include "runtime/exec/exec_starpu_data.h"

#include <errno.h>
#include <stdio.h>

#include "base/check.h"

struct sp_pages_iface {
  enum starpu_data_interface_id id;
  const struct rt_kv_seq *seq; /* NULL on any node but the home (main RAM) */
  size_t page_bytes;
};

static void pages_register(starpu_data_handle_t h, unsigned home, void *data_interface) {
  const struct sp_pages_iface *src = data_interface;
  for (unsigned node = 0; node < starpu_memory_nodes_get_count(); node++) {
    struct sp_pages_iface *local = starpu_data_get_interface_on_node(h, node);
    *local = *src;
    if (node != home) local->seq = NULL;
  }
}

static starpu_ssize_t pages_allocate(void *data_interface, unsigned node) {
  (void)data_interface;
  CEDAR_ASSERT_MSG(false, "a KV page list was asked for on StarPU memory node %u: page lists live in main RAM, and "
                   "only tasks on CPU workers may name them (exec_starpu_pages.c)", node);
  return -ENOMEM;
}

static void pages_free(void *data_interface, unsigned node) { (void)data_interface, (void)node; }

static size_t pages_size(starpu_data_handle_t h) {
  const struct sp_pages_iface *p = starpu_data_get_interface_on_node(h, STARPU_MAIN_RAM);
  return p->seq ? (size_t)p->seq->n_pages * p->page_bytes : 0;
}

static uint32_t pages_footprint(starpu_data_handle_t h) { return starpu_hash_crc32c_be((uint32_t)pages_size(h), 0); }

static int pages_compare(void *a, void *b) {
  const struct sp_pages_iface *x = a, *y = b;
  return x->seq == y->seq && x->page_bytes == y->page_bytes;
}

static starpu_ssize_t pages_describe(void *data_interface, char *buf, size_t size) {
  const struct sp_pages_iface *p = data_interface;
  return snprintf(buf, size, "P%dx%zu", p->seq ? p->seq->n_pages : 0, p->page_bytes);
}

static void *pages_to_pointer(void *data_interface, unsigned node) {
  (void)node;
  const struct sp_pages_iface *p = data_interface;
  return p->seq ? (void *)p->seq->page_ptr : NULL;
}

static const struct starpu_data_copy_methods pages_copy; /* none: see the header */

static struct starpu_data_interface_ops pages_ops = {
    .register_data_handle = pages_register,
    .allocate_data_on_node = pages_allocate,
    .free_data_on_node = pages_free,
    .copy_methods = &pages_copy,
    .get_size = pages_size,
    .footprint = pages_footprint,
    .compare = pages_compare,
    .describe = pages_describe,
    .to_pointer = pages_to_pointer,
    .interfaceid = STARPU_UNKNOWN_INTERFACE_ID,
    .interface_size = sizeof(struct sp_pages_iface),
    .name = "CEDAR_KV_PAGES_INTERFACE",
};

starpu_data_handle_t sp__pages_register(const struct rt_kv_seq *seq) {
  if (pages_ops.interfaceid == STARPU_UNKNOWN_INTERFACE_ID)
    pages_ops.interfaceid = (enum starpu_data_interface_id)starpu_data_interface_get_next_id();
  struct sp_pages_iface p = {pages_ops.interfaceid, seq, rt_kv_page_bytes(seq->pool)};
  starpu_data_handle_t h;
  starpu_data_register(&h, STARPU_MAIN_RAM, &p, &pages_ops);
  starpu_data_set_sequential_consistency_flag(h, 0); /* the graph's edges are the only ordering */
  starpu_data_set_name(h, "kv pages");
  return h;
}

const struct rt_kv_seq *sp__pages_seq(void *data_interface) {
  const struct sp_pages_iface *p = data_interface;
  CEDAR_ASSERT(p->id == pages_ops.interfaceid && p->seq);
  return p->seq;
}
