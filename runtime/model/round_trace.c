/* round_trace.c: see round_trace.h. */
#include "runtime/model/round_trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "runtime/load/safetensors.h"

#define RT_RTRACE_POINTS 64

bool rt_rtrace_enabled;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int64_t tile_pos0;

static struct {
  const char *names[RT_RTRACE_POINTS];
  int n_names;
  int64_t *index; /* (n, 7) */
  size_t n, cap;
  float *values;
  size_t n_values, cap_values;
  uint8_t *bytes;
  size_t n_bytes, cap_bytes;
} T;

static void clear(void) {
  free(T.index);
  free(T.values);
  free(T.bytes);
  memset(&T, 0, sizeof(T));
}

void rt_rtrace_begin(void) {
  pthread_mutex_lock(&mu);
  clear();
  rt_rtrace_enabled = true;
  pthread_mutex_unlock(&mu);
}

void rt_rtrace_tile(int64_t pos0) { tile_pos0 = pos0; }

static int point_id(const char *pt) { /* names are static strings: compared by content, few */
  for (int i = 0; i < T.n_names; i++)
    if (!strcmp(T.names[i], pt)) return i;
  CEDAR_ASSERT_MSG(T.n_names < RT_RTRACE_POINTS, "round trace: more than %d points", RT_RTRACE_POINTS);
  T.names[T.n_names] = pt;
  return T.n_names++;
}

static void grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return;
  size_t c = *cap ? *cap : 1024;
  while (c < need) c *= 2;
  *p = cedar_xrealloc(*p, c * elem);
  *cap = c;
}

/* Append the record's index row; returns where its data goes (values or bytes). */
static size_t add_row(const char *pt, int l, int64_t pos0, int rows, int cols, int kind) {
  grow((void **)&T.index, &T.cap, T.n + 1, 7 * sizeof(int64_t));
  int64_t *r = T.index + 7 * T.n++;
  size_t cnt = (size_t)rows * (size_t)cols, off = kind ? T.n_bytes : T.n_values;
  r[0] = point_id(pt), r[1] = l, r[2] = pos0 < 0 ? tile_pos0 : pos0, r[3] = rows, r[4] = cols, r[5] = kind;
  r[6] = (int64_t)off;
  if (kind) {
    grow((void **)&T.bytes, &T.cap_bytes, off + cnt, 1);
    T.n_bytes += cnt;
  } else {
    grow((void **)&T.values, &T.cap_values, off + cnt, sizeof(float));
    T.n_values += cnt;
  }
  return off;
}

void rt_rtrace_f32(const char *pt, int l, int64_t pos0, int rows, int cols, int ld, const float *v) {
  if (!rt_rtrace_enabled || rows <= 0) return;
  if (pos0 < 0) pos0 = tile_pos0; /* the caller's thread, before the lock */
  pthread_mutex_lock(&mu);
  size_t off = add_row(pt, l, pos0, rows, cols, 0);
  for (int r = 0; r < rows; r++) memcpy(T.values + off + (size_t)r * cols, v + (size_t)r * ld, sizeof(float) * cols);
  pthread_mutex_unlock(&mu);
}

void rt_rtrace_i32(const char *pt, int l, int64_t pos0, int rows, int cols, const int32_t *v) {
  if (!rt_rtrace_enabled || rows <= 0) return;
  if (pos0 < 0) pos0 = tile_pos0;
  pthread_mutex_lock(&mu);
  size_t off = add_row(pt, l, pos0, rows, cols, 0);
  for (size_t i = 0; i < (size_t)rows * cols; i++) T.values[off + i] = (float)v[i]; /* ids < 2^24: exact */
  pthread_mutex_unlock(&mu);
}

void rt_rtrace_u8(const char *pt, int l, int64_t pos0, int rows, int cols, const uint8_t *v) {
  if (!rt_rtrace_enabled || rows <= 0) return;
  if (pos0 < 0) pos0 = tile_pos0;
  pthread_mutex_lock(&mu);
  size_t off = add_row(pt, l, pos0, rows, cols, 1);
  memcpy(T.bytes + off, v, (size_t)rows * cols);
  pthread_mutex_unlock(&mu);
}

int rt_rtrace_write(const char *path, char *err, size_t err_len) {
  pthread_mutex_lock(&mu);
  rt_rtrace_enabled = false;
  char names[RT_RTRACE_POINTS * 24] = "";
  size_t len = 0;
  for (int i = 0; i < T.n_names; i++) {
    int w = snprintf(names + len, sizeof(names) - len, "%s%s", i ? "," : "", T.names[i]);
    CEDAR_ASSERT(w > 0 && (size_t)w < sizeof(names) - len);
    len += (size_t)w;
  }
  static const float no_f = 0;
  static const uint8_t no_b = 0;
  struct st_tensor t[3] = {
      {.name = "index", .dtype = ST_I64, .ndim = 2, .shape = {(int64_t)T.n, 7}, .nbytes = T.n * 7 * sizeof(int64_t),
       .data = T.index ? (const void *)T.index : (const void *)&no_f},
      {.name = "values", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)T.n_values}, .nbytes = T.n_values * sizeof(float),
       .data = T.values ? (const void *)T.values : (const void *)&no_f},
      {.name = "bytes", .dtype = ST_U8, .ndim = 1, .shape = {(int64_t)T.n_bytes}, .nbytes = T.n_bytes,
       .data = T.bytes ? (const void *)T.bytes : (const void *)&no_b},
  };
  struct st_meta meta[] = {{"cedar.points", names}};
  int rc = st_write(path, t, 3, meta, 1, err, err_len);
  clear();
  pthread_mutex_unlock(&mu);
  return rc;
}
