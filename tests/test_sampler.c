/* test_sampler.c: the one sampler path (runtime/gen/sampler.h).
 *
 *  - greedy (temperature 0) takes the argmax, as op_sample_greedy does;
 *  - with temperature, top-k, top-p and a seed it draws exactly what
 *    op_sample_k draws from the same state, and advances the state alike;
 *  - teacher forcing (rt_sample_opts.teacher) hands out the text's next id
 *    while the text lasts, then draws;
 *  - the repetition penalty is applied over the request's ids (a penalised
 *    argmax loses to the next id) and an id outside the vocabulary is
 *    refused with a message;
 *  - logits holding NaN, +inf, or no finite value fail with CEDAR_EINVAL
 *    and a message naming the position and the counts; the id is never
 *    handed out as a token (it stays -1 and the call says so).
 * Run: ctest --test-dir build -R sampler.
 */
#include <math.h>
#include <string.h>

#include "base/check.h"
#include "ops/sample.h"
#include "runtime/gen/sampler.h"
#include "tests/harness.h"

#define V 64

int main(void) {
  struct rt_sampler s;
  CEDAR_ASSERT(rt_sampler_init(&s, V) == 0);
  float lg[V];
  for (int i = 0; i < V; i++) lg[i] = sinf((float)i * 0.7f) * 3.0f;
  int32_t ids[4] = {1, 2, 3, 4};
  struct rt_request r = {0};
  r.tokens = ids;
  r.n_tokens = 4;
  char err[400];
  int32_t id;
  uint64_t rng = 7;

  struct rt_sample_opts greedy = {0.0f, 1.0f, 0, 0.0f, NULL, 0};
  EXPECT(rt_sample_next(&s, &greedy, &r, lg, 3, &rng, &id, err, sizeof err) == 0 && id == op_sample_greedy(lg, V),
         "greedy: %d, argmax %d", id, op_sample_greedy(lg, V));

  struct rt_sample_opts so = {0.8f, 0.9f, 10, 0.0f, NULL, 0};
  float prob[V];
  int32_t order[V];
  for (int k = 0; k < 20; k++) {
    uint64_t a = 1000 + (uint64_t)k, b = a;
    EXPECT(rt_sample_next(&s, &so, &r, lg, 3, &a, &id, err, sizeof err) == 0, "draw %d: %s", k, err);
    int32_t want = op_sample_k(prob, order, lg, V, so.temperature, so.top_k, so.top_p, &b);
    EXPECT(id == want && a == b, "draw %d: %d, op_sample_k %d (state %llu/%llu)", k, id, want,
           (unsigned long long)a, (unsigned long long)b);
  }

  /* teacher forcing (cedar eval): the token after position pos is the
   * text's teacher[pos + 1], whatever the logits say; past the text's end
   * the sampler draws again; the rng advances as a draw would */
  int32_t text[6] = {5, 17, 33, 2, 60, 9};
  struct rt_sample_opts tf = {0.8f, 0.9f, 10, 0.0f, text, 6};
  for (int64_t pos = 0; pos < 7; pos++) {
    uint64_t a = 99, b = 99;
    EXPECT(rt_sample_next(&s, &tf, &r, lg, pos, &a, &id, err, sizeof err) == 0, "teacher %lld: %s", (long long)pos, err);
    int32_t draw = op_sample_k(prob, order, lg, V, tf.temperature, tf.top_k, tf.top_p, &b);
    int32_t want = pos + 1 < 6 ? text[pos + 1] : draw;
    EXPECT(id == want && a == b, "teacher at position %lld: %d, want %d", (long long)pos, id, want);
  }

  /* the penalty: make id 2 (one of the request's) the argmax by a small
   * margin; a penalty of 2 divides its positive logit, the runner-up wins */
  float pl[V];
  for (int i = 0; i < V; i++) pl[i] = 0.0f;
  pl[2] = 2.0f, pl[9] = 1.5f;
  struct rt_sample_opts pen = {0.0f, 1.0f, 0, 2.0f, NULL, 0};
  EXPECT(rt_sample_next(&s, &pen, &r, pl, 3, &rng, &id, err, sizeof err) == 0 && id == 9,
         "penalised argmax: %d (want 9)", id);
  int32_t bad_ids[2] = {1, V + 5};
  struct rt_request rb = {0};
  rb.tokens = bad_ids;
  rb.n_tokens = 2;
  EXPECT(rt_sample_next(&s, &pen, &rb, pl, 1, &rng, &id, err, sizeof err) == CEDAR_EINVAL && id == -1 &&
             strstr(err, "outside [0, 64)"),
         "an id outside the vocabulary under the penalty: id %d, '%s'", id, err);

  /* non-finite rows */
  const float bads[3] = {NAN, INFINITY, -INFINITY};
  for (int b = 0; b < 3; b++) {
    float nl[V];
    memcpy(nl, lg, sizeof nl);
    if (b < 2)
      nl[5] = bads[b];
    else
      for (int i = 0; i < V; i++) nl[i] = -INFINITY;
    for (int t = 0; t < 2; t++) {
      struct rt_sample_opts o = t ? so : greedy;
      err[0] = 0;
      int rc = rt_sample_next(&s, &o, &r, nl, 41, &rng, &id, err, sizeof err);
      EXPECT(rc == CEDAR_EINVAL && id == -1 && strstr(err, "position 41") && strstr(err, "NaN or +inf"),
             "non-finite row %d (%s): rc %d id %d '%s'", b, t ? "sampled" : "greedy", rc, id, err);
    }
  }
  rt_sampler_free(&s);
  return h_report("sampler");
}
