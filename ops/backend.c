/* backend.c: the CPU backend (see backend.h) and the table's two helpers.
 *
 * What it is: op_backend_cpu, whose every slot runs the registered
 * descriptor's own run, generated from CEDAR_OPS so a new op is on the CPU
 * backend without an edit here. What it is not: a dispatcher that picks a
 * backend, and not a second copy of any op.
 * Test: tests/test_backend_ops.c (ctest -R backend_ops).
 */
#include "ops/backend.h"

#include <stdio.h>

#include "base/check.h"

static bool cpu_available(char *why, size_t len) {
  if (why && len) why[0] = '\0';
  return true;
}

/* One function for every slot: the descriptor's run is the CPU reference.
 * (Static initializers cannot read op_desc_X.run, hence the trampoline.) */
static int cpu_run(const struct op_desc *self, struct op_io *io) { return self->run(self, io); }

const struct op_backend op_backend_cpu = {
    .name = "cpu",
    .available = cpu_available,
    .cpu_bits = true,
    .run =
        {
#define OP_CPU_SLOT_(name) [OP_ID_##name] = cpu_run,
            CEDAR_OPS(OP_CPU_SLOT_)
#undef OP_CPU_SLOT_
        },
};

bool op_backend_has(const struct op_backend *b, enum op_id id) { return id < OP_COUNT && b->run[id] != NULL; }

int op_backend_run(const struct op_backend *b, enum op_id id, struct op_io *io) {
  CEDAR_ASSERT_MSG(id < OP_COUNT, "op id %d past the registry's %d ops", (int)id, OP_COUNT);
  if (!b->run[id]) {
    char msg[128];
    snprintf(msg, sizeof msg, "%s is not implemented on %s", op_name(id), b->name);
    io->fail(io, msg);
    return CEDAR_EUNSUPPORTED;
  }
  return b->run[id](op_registry[id], io);
}
