/* round_trace.h: a record of cedar's discrete numeric decisions, for the
 * NumPy oracle's per-row flip accounting (`cedar run --dump-roundings FILE`;
 * tests/oracle/follow.py, tests/oracle/README.md "Flip accounting").
 *
 * With model.numerics' bf16 and MXFP8 rounding points (docs/model.md s7.1),
 * cedar's fp32 arithmetic and the oracle's float64 land on different sides
 * of a rounding boundary now and then, and each such flip moves the rest of
 * the run. The trace lets the oracle see, at every point where cedar rounds
 * a value computed with rounding error (or takes a discrete decision from
 * one), what cedar decided: the rounded values (bf16 points, MXFP8 inputs
 * of computed values, the indexer query's MXFP4 round trip), the SWA cache
 * entries as stored, and the MoE / Top-K / candidate-pool selections. The
 * oracle adopts a decision only where its own float64 value lies within the
 * fp32 error bound of the boundary, and counts each.
 *
 * A record is keyed by (point name, layer, first position) over `rows`
 * consecutive positions of `cols` values. Names are static strings (the
 * points of model.c). Recording is process-wide and off unless begun; each
 * call costs a load and a branch then. Thread-safe (a mutex; the StarPU
 * executor runs nodes on several workers). The tile position is the
 * calling thread's (rt_rtrace_tile, set by the node dispatch): op groups
 * that do not know their positions (embed, Engram, head) record with it.
 * Batched decode rows (runtime/engine/batch.c) are not recorded.
 */
#ifndef CEDAR_RUNTIME_ROUND_TRACE_H
#define CEDAR_RUNTIME_ROUND_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern bool rt_rtrace_enabled;

static inline bool rt_rtrace_on(void) { return rt_rtrace_enabled; }

/* Start (and clear) the process-wide record. */
void rt_rtrace_begin(void);
/* The first position of the tile this thread runs now. */
void rt_rtrace_tile(int64_t pos0);
/* Record rows x cols values of point pt at layer l, positions pos0 ..
 * pos0 + rows - 1 (pos0 < 0: the thread's tile position). Row r of v starts
 * at v + r * ld. No-op unless begun. */
void rt_rtrace_f32(const char *pt, int l, int64_t pos0, int rows, int cols, int ld, const float *v);
void rt_rtrace_i32(const char *pt, int l, int64_t pos0, int rows, int cols, const int32_t *v);
void rt_rtrace_u8(const char *pt, int l, int64_t pos0, int rows, int cols, const uint8_t *v);
/* Write the record as safetensors (tensors `index` I64 (R, 7): point,
 * layer, pos0, rows, cols, kind 0 = values / 1 = bytes, offset; `values`
 * F32; `bytes` U8; metadata `cedar.points`: the point names, comma
 * separated, index = point id), stop recording and free it. */
int rt_rtrace_write(const char *path, char *err, size_t err_len);

#endif
