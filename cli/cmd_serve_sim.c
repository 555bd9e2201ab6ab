/* cmd_serve_sim.c: `cedar serve-sim`, a workload driver for the prefix cache
 * (issue 6): JSON-lines requests through one engine (runtime/engine/engine.h:
 * model, page pools, prefix cache, encoder-SWA pool, optional disk tier),
 * one after the other, printing per request what was reused and what ran.
 *
 *   cedar serve-sim --requests FILE [--plan P] [--weights W | --seed S] [--no-cache]
 *                   [--no-swa-pool] [--cache-dir D] [--cache-bytes N] [--executor E] [--json]
 *   cedar serve-sim gen [--sessions S] [--turns T] [--first N] [--turn-len N] [--max-new M] [--seed S]
 *
 * A request line: {"id": "s0t3", "session": "s0", "turn": 3, "tokens": [..] or
 * "new_len": N or "prompt": "text", "max_new": M}. Its prompt is its
 * session's history (every earlier prompt and the tokens generated for it)
 * followed by its new tokens, as a chat client sends it; new_len draws N
 * byte tokens from a seed of (session, turn); "prompt" is a user turn in the
 * tokenizer's chat format (cli/run_text.h; "raw": true encodes it as is),
 * and its output is text that ends at EOS or a "stop" string.
 * Tested by tests/cli/serve_sim.sh.
 */
#include <cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "ops/sample.h"
#include "base/check.h"
#include "base/file.h"
#include "cli/cli.h"
#include "cli/weights_resident.h"
#include "cli/serve_sim_batch.h"
#include "cli/run_text.h"
#include "runtime/engine/engine.h"

static const char usage[] =
    "usage: cedar serve-sim --requests FILE [--plan P] [--weights W | --model DIR | --seed S] [--no-cache] [--no-swa-pool]\n"
    "                       [--weights-format stored|f32] [--cache-dir D] [--cache-bytes N] [--executor direct|starpu] [--json]\n"
    "       cedar serve-sim --max-batch N ... (continuous batching; `cedar serve-sim --max-batch 1 --help`)\n"
    "       cedar serve-sim gen [--sessions S] [--turns T] [--first N] [--turn-len N] [--max-new M] [--seed S] [--json]\n"
    "Replay JSON-lines requests through one runtime with the prefix cache of plan P (default %s):\n"
    "global KV blocks shared across requests, encoder-SWA snapshots at the end of every request,\n"
    "and with --cache-dir a disk tier that survives restarts. Per request it prints the prompt,\n"
    "the hit (global blocks, snapshot), encoder replay and suffix positions, decoder replay\n"
    "positions (of which cached), token-layers, new global entries, bytes reused per tier (global\n"
    "blocks from memory, the encoder snapshot, global blocks loaded from disk) and TTFT. A line: {\"id\", \"session\", \"turn\", \"tokens\": [...] |\n"
    "\"new_len\": N | \"prompt\": \"text\", \"max_new\": M}; the prompt is the session's history plus the new tokens.\n"
    "A \"prompt\" is a user turn in the chat format of the tokenizer's tokenizer_config.json (the first\n"
    "turn opens with BOS; a later one closes the assistant's turn with EOS first when it did not end\n"
    "with one), or with \"raw\": true its text as it is; its output is text (\"text\" in --json, a\n"
    "line under the row in the table), ending at EOS or at one of \"stop\": [\"...\"] (docs/tokenizer.md).\n"
    "  --tokenizer PATH the tokenizer.json for text requests and the Engram token map (default: --model\n"
    "                   DIR's own, else the npm cache this build found, for text requests only)\n"
    "  --model DIR      a checkpoint directory in the released layout (docs/checkpoints.md): its\n"
    "                   config gives the plan (or --plan P is checked against it), its tensors the weights\n"
    "  --weights W      safetensors weights checked against the plan; else --seed S: synthetic\n"
    "                   weights from seed S (default 0), which also seeds sampling\n"
    CLI_WEIGHTS_FORMAT_HELP
    "  --no-cache       no prefix cache (every request cold): the baseline\n"
    "  --no-swa-pool    global blocks only (every hit replays the encoder window: SPEC 6.5 path b)\n"
    "  --cache-dir D    disk tier directory (block files, checked; see docs/runtime.md)\n"
    "  --cache-bytes N  memory tier capacity in bytes, suffixes K, M, G, T (powers of 1024; default\n"
    "                   serving.cache.host_bytes; 0 = no limit)\n"
    "  --executor E     direct (default: one thread, requests one after the other) or starpu\n"
    "  --json           one JSON object per request instead of the table, then one line\n"
    "                   {\"totals\": {...}, \"cache\": {...}} with the closing lines' figures\n"
    "`gen` writes a multi-turn chat workload: S sessions (default 4) of T turns (default 10), a\n"
    "first prompt of N tokens (default 512), T-1 follow-ups of --turn-len tokens (default 32),\n"
    "--max-new tokens generated per turn (default 16), interleaved turn by turn across sessions;\n"
    "its output is JSON lines with or without --json.\n"
    "Request lines are checked as they are read: \"id\" and \"session\" strings; one of \"tokens\" (ids\n"
    "in [0, vocab)), \"new_len\" (1..16777216) or \"prompt\" (its ids in [0, vocab)); \"max_new\" (1..1048576, default 16, as `cedar run`);\n"
    "\"turn\" and \"seed\" (whole numbers >= 0); no other key. A bad line fails alone, naming its\n"
    "number; the session's history plus the line's tokens and max_new must fit the plan's positions.\n"
    "FILE is a regular file of at most 256 MiB (or - for stdin), lines at most 16 MiB.\n";

/* ---- gen --------------------------------------------------------------- */

static int gen(int argc, char **argv) {
  static const struct option opts[] = {{"sessions", required_argument, NULL, 's'}, {"turns", required_argument, NULL, 't'},
                                       {"first", required_argument, NULL, 'f'},    {"turn-len", required_argument, NULL, 'l'},
                                       {"max-new", required_argument, NULL, 'm'},  {"seed", required_argument, NULL, 'S'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},           {0, 0, 0, 0}};
  int64_t sessions = 4, turns = 10, first = 512, turn_len = 32, max_new = 16, seed = 0;
  int c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int64_t *dst = c == 's' ? &sessions : c == 't' ? &turns : c == 'f' ? &first : c == 'l' ? &turn_len
              : c == 'm' ? &max_new : c == 'S' ? &seed : NULL;
    if (c == 'h') {
      printf(usage, CEDAR_DEFAULT_PLAN);
      return 0;
    }
    if (c == 'j') continue; /* gen's output is JSON lines already */
    if (!dst || !cli_parse_int(optarg, c == 'S' ? 0 : 1, 1L << 24, dst))
      return cli_usage_error("serve-sim gen", "bad option or value: '%s'", argv[optind - 1]);
  }
  if (optind < argc) return cli_usage_error("serve-sim gen", "unexpected argument '%s'", argv[optind]);
  for (int64_t t = 0; t < turns; t++)
    for (int64_t s = 0; s < sessions; s++)
      printf("{\"id\": \"s%" PRId64 "t%" PRId64 "\", \"session\": \"s%" PRId64 "\", \"turn\": %" PRId64
             ", \"new_len\": %" PRId64 ", \"max_new\": %" PRId64 ", \"seed\": %" PRId64 "}\n",
             s, t, s, t, t ? turn_len : first, max_new, seed);
  return 0;
}

/* ---- the driver ------------------------------------------------------------ */

struct session {
  char *name; /* the request's "session", whole: a name of any length is its own session */
  int32_t *hist;
  int64_t n, cap;
};

struct sopts {
  const char *plan, *weights, *requests, *cache_dir, *model, *tokenizer;
  uint64_t seed;
  int64_t cache_bytes;
  bool no_cache, no_swa, json, have_cache_bytes, weights_f32;
  enum rt_executor executor;
};

static struct session *session_of(struct session **ss, int *n, const char *name) {
  for (int i = 0; i < *n; i++)
    if (!strcmp((*ss)[i].name, name)) return &(*ss)[i];
  *ss = cedar_xrealloc(*ss, sizeof(**ss) * (size_t)(*n + 1));
  struct session *s = &(*ss)[(*n)++];
  memset(s, 0, sizeof(*s));
  s->name = cedar_xstrdup(name);
  return s;
}

static void hist_push(struct session *s, int32_t t) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 256;
    s->hist = cedar_xrealloc(s->hist, sizeof(int32_t) * (size_t)s->cap);
  }
  s->hist[s->n++] = t;
}

/* One request line, every field checked (issue 18 row 7): the same limits
 * as `cedar run` (max_new in [1, 1048576], ids in [0, vocab)), integers that
 * are whole numbers a double holds exactly, no unknown key. */
struct req {
  const char *id, *session;
  const cJSON *tokens;   /* or NULL: new_len or prompt */
  const char *prompt;    /* text, or NULL */
  bool raw;
  const char *stops[16];
  int n_stops;
  int32_t *text_ids;     /* the prompt's ids for its session (drive) */
  int64_t n_text;
  int64_t new_len, max_new, turn, seed;
};

/* A whole number in [lo, hi] at key k (absent: *out = dflt when dflt >= lo,
 * else an error); false with a message naming the line. */
static bool req_int(const cJSON *j, const char *k, int64_t lo, int64_t hi, int64_t dflt, int64_t *out, long line,
                    char *err, size_t len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
  if (!v && dflt >= lo) {
    *out = dflt;
    return true;
  }
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi) ||
      v->valuedouble != floor(v->valuedouble)) {
    snprintf(err, len, "line %ld: \"%s\" must be a whole number in [%" PRId64 ", %" PRId64 "]", line, k, lo, hi);
    return false;
  }
  *out = (int64_t)v->valuedouble;
  return true;
}

/* "prompt" (a non-empty string), "raw" (a boolean, with a prompt), "stop"
 * (up to 16 non-empty strings, with a prompt). */
static int parse_text(const cJSON *j, long line, struct req *q, char *err, size_t len) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt"), *raw = cJSON_GetObjectItemCaseSensitive(j, "raw"),
              *stop = cJSON_GetObjectItemCaseSensitive(j, "stop"), *s;
  if (p && (!cJSON_IsString(p) || !*p->valuestring)) {
    snprintf(err, len, "line %ld: \"prompt\" must be a non-empty string", line);
    return CEDAR_EINVAL;
  }
  if ((raw || stop) && !p) {
    snprintf(err, len, "line %ld: \"raw\" and \"stop\" go with \"prompt\"", line);
    return CEDAR_EINVAL;
  }
  if (raw && !cJSON_IsBool(raw)) {
    snprintf(err, len, "line %ld: \"raw\" must be true or false", line);
    return CEDAR_EINVAL;
  }
  if (stop && (!cJSON_IsArray(stop) || cJSON_GetArraySize(stop) > 16)) {
    snprintf(err, len, "line %ld: \"stop\" must be an array of at most 16 strings", line);
    return CEDAR_EINVAL;
  }
  cJSON_ArrayForEach(s, stop) {
    if (!cJSON_IsString(s) || !*s->valuestring) {
      snprintf(err, len, "line %ld: \"stop\" must hold non-empty strings", line);
      return CEDAR_EINVAL;
    }
    q->stops[q->n_stops++] = s->valuestring;
  }
  q->prompt = p ? p->valuestring : NULL;
  q->raw = cJSON_IsTrue(raw);
  return 0;
}

static int parse_request(const cJSON *j, int vocab, long line, struct req *q, char *err, size_t len) {
  static const char *const keys[] = {"id", "session", "turn", "tokens", "new_len", "max_new", "seed", "prompt", "raw",
                                     "stop"};
  memset(q, 0, sizeof(*q));
  if (!cJSON_IsObject(j)) {
    snprintf(err, len, "line %ld: not a request (a JSON object with \"id\" and \"session\" strings)", line);
    return CEDAR_EINVAL;
  }
  for (const cJSON *c = j->child; c; c = c->next) {
    size_t k = 0;
    while (k < sizeof keys / sizeof keys[0] && strcmp(c->string, keys[k])) k++;
    if (k == sizeof keys / sizeof keys[0]) {
      snprintf(err, len, "line %ld: unknown key \"%s\" (a request has id, session, turn, tokens or new_len or "
               "prompt, max_new, seed, raw, stop)", line, c->string);
      return CEDAR_EINVAL;
    }
  }
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id"), *sid = cJSON_GetObjectItemCaseSensitive(j, "session");
  if (!cJSON_IsString(id) || !cJSON_IsString(sid) || !*sid->valuestring) {
    snprintf(err, len, "line %ld: not a request (a JSON object with \"id\" and \"session\" strings)", line);
    return CEDAR_EINVAL;
  }
  q->id = id->valuestring;
  q->session = sid->valuestring;
  const cJSON *tok = cJSON_GetObjectItemCaseSensitive(j, "tokens");
  bool has_nl = cJSON_GetObjectItemCaseSensitive(j, "new_len") != NULL;
  if (parse_text(j, line, q, err, len)) return CEDAR_EINVAL;
  if (!!tok + has_nl + !!q->prompt != 1) {
    snprintf(err, len, "line %ld: give one of \"tokens\": [ids], \"new_len\": N or \"prompt\": \"text\"", line);
    return CEDAR_EINVAL;
  }
  if (tok) {
    if (!cJSON_IsArray(tok) || !cJSON_GetArraySize(tok)) {
      snprintf(err, len, "line %ld: \"tokens\" must be a non-empty array of token ids", line);
      return CEDAR_EINVAL;
    }
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tok) {
      if (!cJSON_IsNumber(t) || !(t->valuedouble >= 0 && t->valuedouble < vocab) ||
          t->valuedouble != floor(t->valuedouble)) {
        snprintf(err, len, "line %ld: \"tokens\" item %d is not a token id in [0, %d)", line, i + 1, vocab);
        return CEDAR_EINVAL;
      }
      i++;
    }
    q->tokens = tok;
  } else if (!q->prompt && !req_int(j, "new_len", 1, 1 << 24, -1, &q->new_len, line, err, len)) {
    return CEDAR_EINVAL;
  }
  if (!req_int(j, "max_new", 1, 1 << 20, 16, &q->max_new, line, err, len) ||
      !req_int(j, "turn", 0, INT32_MAX, 0, &q->turn, line, err, len) ||
      !req_int(j, "seed", 0, INT32_MAX, 0, &q->seed, line, err, len))
    return CEDAR_EINVAL;
  return 0;
}

/* The new tokens of a checked request into the session. new_len draws N
 * byte tokens from a seed of (seed, session, turn). */
static void new_tokens(const struct req *q, struct session *s, int vocab) {
  for (int64_t i = 0; i < q->n_text; i++) hist_push(s, q->text_ids[i]);
  if (q->prompt) return;
  if (q->tokens) {
    const cJSON *t;
    cJSON_ArrayForEach(t, q->tokens) hist_push(s, (int32_t)t->valuedouble);
    return;
  }
  uint64_t rng = (uint64_t)q->seed * 1000003u + (uint64_t)s->name[0] * 131u + (uint64_t)strlen(s->name) +
                 (uint64_t)q->turn * 7919u;
  for (const char *c = s->name; *c; c++) rng = rng * 31u + (uint64_t)(unsigned char)*c;
  int lim = vocab < 256 ? vocab : 256;
  for (int64_t i = 0; i < q->new_len; i++) hist_push(s, (int32_t)(op_rng_next(&rng) % (uint64_t)lim));
}

/* A text request's ids for its session (the tokenizer opened at the first
 * one), checked against the plan's vocab; non-zero with err naming the line. */
static int text_ids(const struct sopts *o, struct run_text *tx, struct req *q, const struct session *s,
                    const struct plan *p, long line, char *err, size_t len) {
  char e[900];
  if (!tx->tok && (tx->eos_id == -2 || run_text_open(tx, "serve-sim", o->tokenizer, o->model))) {
    tx->eos_id = -2; /* the open failed and said why once: later text requests fail without trying again */
    snprintf(err, len, "line %ld: a text request needs a tokenizer (see the first error)", line);
    return CEDAR_EINVAL;
  }
  int rc = run_text_turn(tx, q->prompt, q->raw, s->n ? s->hist[s->n - 1] : -1, &q->text_ids, &q->n_text, e, sizeof e);
  if (!rc) rc = run_text_fits(tx, q->text_ids, q->n_text, p->model.vocab, p->name, e, sizeof e);
  if (rc) {
    free(q->text_ids);
    q->text_ids = NULL;
    snprintf(err, len, "line %ld: %s", line, e);
  }
  return rc;
}

struct totals {
  int64_t requests, prompt, hit, token_layers, cold_token_layers;
  double ttft;
};

/* A text request's output: JSON fields, or a line under the table's row. */
static void print_text(cJSON *row, const struct text_out *tx, int n_tokens) {
  if (row) {
    cJSON_AddStringToObject(row, "text", tx->text);
    cJSON_AddStringToObject(row, "end", text_end_name(tx->end));
    if (tx->end == TEXT_STOP) cJSON_AddStringToObject(row, "stop_string", tx->stops[tx->stop]);
    return;
  }
  char end[512];
  run_text_end(tx, n_tokens, end, sizeof end);
  cJSON *t = cJSON_CreateString(tx->text);
  char *q = cJSON_PrintUnformatted(t); /* one line: newlines and quotes escaped */
  printf("  text, ended by %s: %s\n", end, q);
  free(q);
  cJSON_Delete(t);
}

static void print_row(const char *id, const struct session *s, int64_t n, const struct rt_gen_result *g, bool json,
                      const struct text_out *tx, struct totals *tt) {
  const struct rt_hit_report *h = &g->hit;
  tt->requests++;
  tt->prompt += n;
  tt->hit += h->hit;
  tt->token_layers += g->prefill.token_layers;
  tt->ttft += g->ttft_s;
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "session", s->name);
    cJSON_AddNumberToObject(j, "prompt", (double)n);
    cJSON_AddNumberToObject(j, "hit", (double)h->hit);
    cJSON_AddNumberToObject(j, "global_hit", (double)h->global_hit);
    cJSON_AddBoolToObject(j, "swa_hit", h->swa_hit);
    cJSON_AddNumberToObject(j, "encoder_replay", (double)h->encoder_replay);
    cJSON_AddNumberToObject(j, "encoder_replay_start", (double)h->encoder_replay_start);
    cJSON_AddNumberToObject(j, "encoder_positions", (double)h->encoder_positions);
    cJSON_AddNumberToObject(j, "decoder_replay", (double)h->decoder_replay);
    cJSON_AddNumberToObject(j, "decoder_cached", (double)h->decoder_cached);
    cJSON_AddNumberToObject(j, "token_layers", (double)g->prefill.token_layers);
    cJSON_AddNumberToObject(j, "new_entries", (double)h->new_entries);
    cJSON_AddNumberToObject(j, "new_entry_bytes", (double)h->new_entry_bytes);
    cJSON_AddNumberToObject(j, "bytes_attached", (double)h->bytes_attached);
    cJSON_AddNumberToObject(j, "bytes_restored", (double)h->bytes_restored);
    cJSON_AddNumberToObject(j, "disk_blocks", (double)h->disk_blocks);
    cJSON_AddNumberToObject(j, "bytes_from_disk", (double)h->bytes_from_disk);
    cJSON_AddNumberToObject(j, "blocks_inserted", (double)h->blocks_inserted);
    cJSON_AddNumberToObject(j, "ttft_s", g->ttft_s);
    cJSON *t = cJSON_AddArrayToObject(j, "tokens");
    for (int i = 0; i < g->n_tokens; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(g->tokens[i]));
    if (tx) print_text(j, tx, g->n_tokens);
    char *txt = cJSON_PrintUnformatted(j);
    printf("%s\n", txt);
    free(txt);
    cJSON_Delete(j);
    return;
  }
  printf("%-10s %-6s %7" PRId64 " %7" PRId64 " %4s %7" PRId64 " %7" PRId64 " %7" PRId64 "/%-4" PRId64 " %9" PRId64
         " %8" PRId64 " %10" PRId64 " %10" PRId64 " %10" PRId64 " %9.1f\n",
         id, s->name, n, h->hit, h->swa_hit ? "yes" : "no", h->encoder_replay, h->encoder_positions, h->decoder_replay,
         h->decoder_cached, g->prefill.token_layers, h->new_entries, h->bytes_attached - h->bytes_from_disk,
         h->bytes_restored, h->bytes_from_disk, 1e3 * g->ttft_s);
  if (tx) print_text(NULL, tx, g->n_tokens);
}

/* The last JSON line of `serve-sim --json`: {"totals": {...}, "cache": {...}}
 * (cache absent with --no-cache), the table's closing lines as data. */
static void print_totals_json(const struct totals *tt, const struct pc_cache *cache) {
  cJSON *j = cJSON_CreateObject();
  cJSON *t = cJSON_AddObjectToObject(j, "totals");
  cJSON_AddNumberToObject(t, "requests", (double)tt->requests);
  cJSON_AddNumberToObject(t, "prompt_tokens", (double)tt->prompt);
  cJSON_AddNumberToObject(t, "hit_tokens", (double)tt->hit);
  cJSON_AddNumberToObject(t, "token_layers", (double)tt->token_layers);
  cJSON_AddNumberToObject(t, "mean_ttft_s", tt->requests ? tt->ttft / (double)tt->requests : 0.0);
  if (cache) {
    const struct pc_stats *st = &cache->stats;
    cJSON *c = cJSON_AddObjectToObject(j, "cache");
    cJSON_AddNumberToObject(c, "blocks", (double)cache->count);
    cJSON_AddNumberToObject(c, "bytes", (double)cache->bytes);
    cJSON_AddNumberToObject(c, "inserted", (double)st->inserted);
    cJSON_AddNumberToObject(c, "evicted", (double)st->evicted);
    cJSON_AddNumberToObject(c, "hit_blocks", (double)st->hit_blocks);
    cJSON_AddNumberToObject(c, "missed_blocks", (double)st->miss_blocks);
    cJSON_AddNumberToObject(c, "disk_blocks", (double)st->disk_blocks);
    cJSON_AddNumberToObject(c, "snapshots", cache->n_snap);
    cJSON_AddNumberToObject(c, "snapshot_bytes", (double)cache->snap_bytes);
    cJSON_AddNumberToObject(c, "snapshot_hits", (double)st->snap_hits);
    cJSON_AddNumberToObject(c, "snapshot_misses", (double)st->snap_misses);
  }
  char *txt = cJSON_PrintUnformatted(j);
  printf("%s\n", txt);
  free(txt);
  cJSON_Delete(j);
}

static int parse(int argc, char **argv, struct sopts *o) {
  static const struct option opts[] = {
      {"requests", required_argument, NULL, 'r'}, {"plan", required_argument, NULL, 'p'},
      {"weights", required_argument, NULL, 'w'},  {"seed", required_argument, NULL, 's'},
      {"no-cache", no_argument, NULL, 'n'},       {"no-swa-pool", no_argument, NULL, 'N'},
      {"cache-dir", required_argument, NULL, 'd'}, {"cache-bytes", required_argument, NULL, 'b'},
      {"executor", required_argument, NULL, 'E'}, {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},           {"model", required_argument, NULL, 'M'},
      {"tokenizer", required_argument, NULL, 'K'}, {"weights-format", required_argument, NULL, 'F'},
      {0, 0, 0, 0}};
  memset(o, 0, sizeof(*o));
  int c;
  int64_t v;
  uint64_t u;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'r': o->requests = optarg; break;
    case 'p': o->plan = optarg; break;
    case 'w': o->weights = optarg; break;
    case 'M': o->model = optarg; break;
    case 'K': o->tokenizer = optarg; break;
    case 's':
      if (!cli_parse_int(optarg, 0, INT32_MAX, &v)) return cli_usage_error("serve-sim", "--seed takes S >= 0");
      o->seed = (uint64_t)v;
      break;
    case 'F':
      if (!cli_parse_weights_format(optarg, &o->weights_f32))
        return cli_usage_error("serve-sim", "--weights-format takes stored or f32, not '%s'", optarg);
      break;
    case 'n': o->no_cache = true; break;
    case 'N': o->no_swa = true; break;
    case 'd': o->cache_dir = optarg; break;
    case 'b':
      if (!cli_parse_size(optarg, &u) || u > INT64_MAX)
        return cli_usage_error("serve-sim", "--cache-bytes takes a byte count such as 64M or 1G (0 = no limit), got '%s'", optarg);
      o->cache_bytes = (int64_t)u;
      o->have_cache_bytes = true;
      break;
    case 'E':
      if (!rt_executor_parse(optarg, &o->executor))
        return cli_usage_error("serve-sim", "--executor takes direct or starpu (got '%s')", optarg);
      break;
    case 'j': o->json = true; break;
    case 'h': printf(usage, CEDAR_DEFAULT_PLAN); return 0;
    default: return cli_usage_error("serve-sim", "bad option, or an option without its value: '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error("serve-sim", "unexpected argument '%s'", argv[optind]);
  if (!o->requests) return cli_usage_error("serve-sim", "--requests FILE is required (make one with `cedar serve-sim gen`)");
  if (o->model && o->weights) return cli_usage_error("serve-sim", "--model DIR is the weights; drop --weights");
  if (o->no_cache && (o->cache_dir || o->no_swa)) return cli_usage_error("serve-sim", "--no-cache excludes the cache options");
  return -1;
}

/* Workload limits: no request line needs more (a prompt of 1M token ids
 * is about 8 MiB of JSON), and /dev/zero or a runaway pipe stops here
 * instead of growing without bound. */
#define REQ_MAX_LINE (16 << 20)
#define REQ_MAX_BYTES ((int64_t)256 << 20)

/* One line into *buf (NUL-terminated, the newline kept): its length, -1 at
 * the end of the input, -2 when it runs past REQ_MAX_LINE. */
static ssize_t read_line(FILE *in, char **buf, size_t *cap) {
  size_t n = 0;
  int c;
  while ((c = getc(in)) != EOF) {
    if (n + 2 > *cap) {
      if (*cap >= REQ_MAX_LINE) return -2;
      *cap = *cap ? 2 * *cap : 4096;
      *buf = cedar_xrealloc(*buf, *cap);
    }
    (*buf)[n++] = (char)c;
    if (c == '\n') break;
  }
  if (!n) return -1;
  (*buf)[n] = 0;
  return (ssize_t)n;
}

/* A request id seen on an earlier line is refused (issue 28, low row):
 * its output rows and its JSON would be ambiguous. Records new ids. */
static int dup_id(cJSON *seen, const struct req *q, long line, char *err, size_t len) {
  const cJSON *first = cJSON_GetObjectItemCaseSensitive(seen, q->id);
  if (first) {
    snprintf(err, len, "line %ld: duplicate id \"%.200s\" (first on line %.0f): give each request its own id", line,
             q->id, first->valuedouble);
    return CEDAR_EINVAL;
  }
  cJSON_AddNumberToObject(seen, q->id, (double)line);
  return 0;
}

/* Every request of the file, in order, through one engine. */
static int drive(const struct sopts *o, struct rt_engine *e, FILE *in) {
  const struct plan *p = &e->plan;
  const struct pc_cache *cache = e->cache;
  struct session *ss = NULL;
  int n_ss = 0, status = 0;
  struct totals tt = {0};
  char *line = NULL, err[1024];
  size_t cap = 0;
  long lineno = 0;
  struct run_text tx = {0}; /* opened at the first text request */
  cJSON *seen = cJSON_CreateObject(); /* id -> its line, for dup_id */
  if (!o->json)
    printf("%-10s %-6s %7s %7s %4s %7s %7s %12s %9s %8s %10s %10s %10s %9s\n", "id", "sess", "prompt", "hit", "swa",
           "encrep", "encpos", "dec/cached", "tok-lay", "new-ent", "memory-B", "snap-B", "disk-B", "ttft-ms");
  int64_t total = 0;
  ssize_t got;
  while ((got = read_line(in, &line, &cap)) != -1) {
    lineno++;
    total += got < 0 ? REQ_MAX_LINE : got;
    if (got == -2 || total > REQ_MAX_BYTES) {
      fprintf(stderr, "cedar serve-sim: %s:%ld: %s; stopping here\n", o->requests, lineno,
              got == -2 ? "a line longer than 16 MiB (a request line is one JSON object)"
                        : "the workload is larger than 256 MiB");
      status = 1;
      break;
    }
    if (line[strspn(line, " \t\r\n")] == 0) continue;
    if (cli_json_has_nul(line)) { /* cJSON would end the string there: a prompt cut short without a word */
      fprintf(stderr, "cedar serve-sim: %s: line %ld: a \\u0000 (NUL) in a string: cedar's strings end at NUL; "
              "remove it\n", o->requests, lineno);
      status = 1;
      continue;
    }
    cJSON *j = cJSON_Parse(line);
    struct req q;
    if (parse_request(j, p->model.vocab, lineno, &q, err, sizeof err) || dup_id(seen, &q, lineno, err, sizeof err)) {
      fprintf(stderr, "cedar serve-sim: %s: %s\n", o->requests, err);
      cJSON_Delete(j);
      status = 1;
      continue;
    }
    struct session *s = session_of(&ss, &n_ss, q.session);
    int64_t before = s->n;
    if (q.prompt && text_ids(o, &tx, &q, s, p, lineno, err, sizeof err)) {
      fprintf(stderr, "cedar serve-sim: %s: %s\n", o->requests, err);
      cJSON_Delete(j);
      status = 1;
      continue;
    }
    int64_t want = s->n + (q.tokens ? cJSON_GetArraySize(q.tokens) : q.prompt ? q.n_text : q.new_len) + q.max_new;
    if (want > plan_max_positions(p)) {
      fprintf(stderr, "cedar serve-sim: %s: line %ld: the session's history, the new tokens and max_new need %" PRId64
              " positions; plan %s holds at most %" PRId64 " (model.rope.csa)\n", o->requests, lineno, want, p->name,
              plan_max_positions(p));
      cJSON_Delete(j);
      free(q.text_ids);
      status = 1;
      continue;
    }
    new_tokens(&q, s, p->model.vocab);
    free(q.text_ids);
    struct text_out out = {0};
    if (q.prompt) run_text_out(&tx, &out, q.stops, q.n_stops, false);
    int max_new = (int)q.max_new;
    struct rt_gen_opts go = {.replay = -1, .max_new = max_new, .top_p = 1, .seed = o->seed,
                             .on_token = q.prompt ? text_out_on_token : NULL, .token_user = &out};
    struct rt_request r;
    struct rt_gen_result g;
    int64_t n = s->n;
    if (rt_engine_generate(e, &r, s->hist, n, &go, &g, err, sizeof err)) {
      fprintf(stderr, "cedar serve-sim: request %s failed: %s (the others go on)\n", q.id, err);
      s->n = before;
      status = 1;
    } else {
      if (q.prompt) text_out_finish(&out);
      print_row(q.id, s, n, &g, o->json, q.prompt ? &out : NULL, &tt);
      for (int i = 0; i < g.n_tokens; i++) hist_push(s, g.tokens[i]);
    }
    text_out_free(&out);
    rt_gen_result_free(&g);
    rt_engine_request_free(e, &r);
    cJSON_Delete(j);
  }
  free(line);
  if (!o->json && tt.requests)
    printf("%" PRId64 " requests: %" PRId64 " prompt tokens, %" PRId64 " from the cache (%.1f%%), %" PRId64
           " token-layers, mean TTFT %.1f ms\n",
           tt.requests, tt.prompt, tt.hit, 100.0 * (double)tt.hit / (double)tt.prompt, tt.token_layers,
           1e3 * tt.ttft / (double)tt.requests);
  if (o->json) print_totals_json(&tt, cache);
  if (cache && !o->json) {
    const struct pc_stats *st = &cache->stats;
    printf("cache: %" PRId64 " blocks held (%" PRId64 " B), %" PRId64 " inserted, %" PRId64 " evicted, %" PRId64
           " hit / %" PRId64 " missed blocks, %" PRId64 " from disk; snapshots %d held (%" PRId64 " B), %" PRId64
           " hits, %" PRId64 " misses\n",
           cache->count, cache->bytes, st->inserted, st->evicted, st->hit_blocks, st->miss_blocks, st->disk_blocks,
           cache->n_snap, cache->snap_bytes, st->snap_hits, st->snap_misses);
    if (cache->disk)
      printf("disk tier %s: %" PRId64 " written (%" PRId64 " B), %" PRId64 " loaded (%.3f ms per block), %" PRId64
             " rejected, %" PRId64 " expired, %" PRId64 " skipped as slower than recomputing (estimated %.1f ms per block)\n",
             cache->disk->dir, cache->disk->stats.written, cache->disk->stats.bytes_written, cache->disk->stats.loaded,
             cache->disk->stats.loaded ? 1e3 * cache->disk->stats.load_seconds / (double)cache->disk->stats.loaded : 0.0,
             cache->disk->stats.rejected, cache->disk->stats.expired, st->disk_skipped,
             1e3 * cache->disk->recompute_s_per_block);
  }
  for (int i = 0; i < n_ss; i++) free(ss[i].hist), free(ss[i].name);
  free(ss);
  cJSON_Delete(seen);
  run_text_close(&tx);
  return status;
}

int cmd_serve_sim(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "gen")) return gen(argc - 1, argv + 1);
  for (int i = 1; i < argc; i++) /* continuous batching: cli/serve_sim_batch.c */
    if (!strncmp(argv[i], "--max-batch", 11)) return serve_sim_batch(argc, argv);
  struct sopts o;
  int rc = parse(argc, argv, &o);
  if (rc >= 0) return rc;
  char err[1024]; /* base/file.h: a FIFO, device or directory is refused at once, a file over the cap too */
  FILE *in = strcmp(o.requests, "-") ? cedar_fopen_in(o.requests, REQ_MAX_BYTES, err, sizeof err) : stdin;
  if (!in) {
    fprintf(stderr, "cedar serve-sim: --requests %s: %s\n", o.requests, cedar_file_why(err, o.requests));
    return 1;
  }
  struct plan_diags diags = {0};
  struct rt_engine_opts eo = {
      .plan = o.plan ? o.plan : o.model ? NULL : cli_default_plan(),
      .weights = o.weights,
      .model = o.model,
      .tokenizer = o.tokenizer,
      .seed = o.seed,
      .weights_f32 = o.weights_f32,
      .exec = {.executor = o.executor},
      .cache = {.on = !o.no_cache, .capacity_bytes = o.have_cache_bytes ? o.cache_bytes : -1,
                .snapshots = !o.no_swa, .dir = o.cache_dir},
      .diags = &diags};
  struct rt_engine e;
  int status = 1;
  rc = rt_engine_open(&e, &eo, err, sizeof err);
  if (rc && e.failed == RT_ENGINE_PLAN) plan_diags_print(&diags, stderr);
  plan_diags_free(&diags);
  if (rc)
    fprintf(stderr, "cedar serve-sim: %s\n", err);
  else {
    if (!o.json) cli_weights_resident_line(stdout, &e.plan, &e.weights);
    status = drive(&o, &e, in);
  }
  rt_engine_close(&e);
  if (in != stdin) fclose(in);
  return status;
}
