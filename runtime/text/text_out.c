/* text_out.c: streaming text with EOS and stop strings (text_out.h). */
#include "runtime/text/text_out.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"

void text_out_init(struct text_out *t) {
  memset(&t->st, 0, sizeof t->st);
  t->text = cedar_xstrdup(""); /* the output is a string from the start, empty or not */
  t->cap = 1;
  t->len = t->emitted = 0;
  t->end = TEXT_RUNNING;
  t->stop = -1;
  t->err = 0;
  t->bad_id = -1;
}

const char *text_end_name(enum text_end e) {
  return e == TEXT_EOS ? "eos" : e == TEXT_STOP ? "stop" : e == TEXT_MAX_NEW ? "max-new" : e == TEXT_ERROR ? "error"
                                                                                            : "running";
}

static void emit_to(struct text_out *t, size_t upto) {
  if (upto > t->emitted && t->emit) t->emit(t->user, t->text + t->emitted, upto - t->emitted);
  if (upto > t->emitted) t->emitted = upto;
}

/* Look for a stop string that ends in the text added since `from` (earlier
 * text held none); on a hit cut the text there. Returns true on a hit. */
static bool find_stop(struct text_out *t, size_t from) {
  size_t best = (size_t)-1, best_len = 0;
  int which = -1;
  for (int k = 0; k < t->n_stops; k++) {
    size_t sl = strlen(t->stops[k]);
    if (!sl || sl > t->len) continue;
    size_t start = from + 1 > sl ? from + 1 - sl : 0; /* a match must end past `from` */
    for (size_t i = start; i + sl <= t->len; i++)
      if (!memcmp(t->text + i, t->stops[k], sl)) {
        if (i < best || (i == best && sl > best_len)) best = i, best_len = sl, which = k;
        break;
      }
  }
  if (which < 0) return false;
  t->len = best;
  t->text[best] = 0;
  t->end = TEXT_STOP;
  t->stop = which;
  return true;
}

/* Bytes at the end of the text that could begin a stop string. */
static size_t held_for_stops(const struct text_out *t) {
  size_t hold = 0;
  for (int k = 0; k < t->n_stops; k++) {
    size_t sl = strlen(t->stops[k]);
    for (size_t n = sl - 1 < t->len ? sl - 1 : t->len; n > hold; n--)
      if (!memcmp(t->text + t->len - n, t->stops[k], n)) {
        hold = n;
        break;
      }
  }
  return hold;
}

int text_out_push(struct text_out *t, int32_t id) {
  if (t->end != TEXT_RUNNING) return 1;
  if (id == t->eos_id && t->eos_id >= 0) {
    text_out_finish(t);
    if (t->end == TEXT_MAX_NEW) t->end = TEXT_EOS; /* the held bytes did not end at a stop string */
    return 1;
  }
  size_t before = t->len;
  int rc = tok_stream_push(t->tok, &t->st, id, &t->text, &t->len, &t->cap);
  if (rc) {
    t->err = rc;
    t->bad_id = id;
    t->end = TEXT_ERROR; /* ends the request; the caller reports err */
    return 1;
  }
  if (find_stop(t, before)) {
    emit_to(t, t->len);
    return 1;
  }
  emit_to(t, t->len - held_for_stops(t));
  return 0;
}

int text_out_on_token(void *user, int32_t id) { return text_out_push(user, id); }

void text_out_finish(struct text_out *t) {
  if (t->end != TEXT_RUNNING) return;
  size_t before = t->len;
  if (tok_stream_finish(&t->st, &t->text, &t->len, &t->cap)) t->err = CEDAR_ENOMEM;
  if (!find_stop(t, before)) t->end = TEXT_MAX_NEW;
  emit_to(t, t->len);
}

void text_out_free(struct text_out *t) {
  free(t->text);
  t->text = NULL;
  t->len = t->cap = t->emitted = 0;
}
