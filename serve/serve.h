/* serve.h: `cedar serve`, an OpenAI-compatible HTTP server over one open
 * engine (issue 27, docs/serving.md "cedar serve").
 *
 * The HTTP front is libmicrohttpd, one thread per connection
 * (serve/http.c): it parses and checks a request (serve/request.h),
 * tokenizes its prompt and hands it to the engine thread through a locked
 * queue, then waits for its text (JSON at the end, or server-sent events as
 * it comes). The engine thread (serve/loop.c) owns the engine: it drives
 * runtime/engine/batch.h's continuous batching from a real clock, one step after
 * another while requests run, and turns each request's ids into text
 * (runtime/text/text_out.h: EOS, stop strings). No HTTP thread touches the
 * engine, the batch or the KV pools.
 *
 * With several ranks (srv_opts.ranks: mpirun and a P/D, staged or
 * expert-parallel plan) the engine thread is serve/ranks.c's instead: one
 * request at a time through ranks.run (cli/serve_ranks.c: MPI).
 * Not here: flags and the engine's opening (cli/cmd_serve.c); P/D, staged
 * and CUDA plans in one process (continuous batching refuses them at
 * rt_batch_init, and srv_run returns that message).
 * Test: tests/cli/serve.sh (curl, the openai npm client, greedy ids against
 * `cedar run`), tests/cli/serve_faults.sh (slowloris, disconnect storm,
 * bad bodies, RSS over a run of requests), tests/fuzz/fuzz_serve_request.c.
 */
#ifndef CEDAR_SERVE_SERVE_H
#define CEDAR_SERVE_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/engine/batch.h"
#include "runtime/engine/engine.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

/* The text side: the tokenizer (encoding is serialized here: it keeps a
 * cache), the chat format of its tokenizer_config.json (chat->user NULL: no
 * chat endpoint), and the EOS id (-1: none). */
struct srv_text {
  struct tokenizer *tok;
  const struct chat_format *chat;
  int eos_id;
};

/* One request as the ranks run it (under mpirun: serve/ranks.c hands it to
 * srv_ranks.run, which cli/serve_ranks.c implements over MPI). */
struct srv_rank_job {
  const int32_t *ids;
  int64_t n_ids;
  int max_new, top_k;
  uint64_t seed;
  float temperature, top_p, rep_penalty;
};

/* Several ranks computing (n > 1): the engine thread runs each request
 * through run, one at a time, instead of continuous batching. run returns 0
 * with the generated ids in *out (malloc'ed, *n_out), or a negative
 * cedar_status with err; stop is called once when the server ends. */
struct srv_ranks {
  int n;
  int (*run)(void *user, const struct srv_rank_job *j, int32_t **out, int *n_out, char *err, size_t err_len);
  void (*stop)(void *user);
  void *user;
};

struct srv_opts {
  const char *host;          /* IPv4 or IPv6 literal to bind; NULL: 127.0.0.1 */
  int port;                  /* 0: any free port (printed, and written to port_file) */
  const char *port_file;     /* or NULL */
  const char *api_key;       /* or NULL: no authentication */
  const char *model_name;    /* the id /v1/models lists and requests must name; NULL: the plan's name */
  int max_waiting;           /* requests queued beyond the running ones before 429 */
  size_t max_body;           /* request bytes before 413 */
  int max_tokens_limit;      /* the largest max_tokens accepted */
  int default_max_tokens;    /* when a request gives none */
  int64_t max_prompt_tokens; /* longer prompts get 400 */
  int max_connections;       /* open connections at once (libmicrohttpd refuses more) */
  int idle_timeout_s;        /* a connection silent this long is closed (slowloris) */
  double drain_s;            /* after SIGTERM/SIGINT: running requests get this long to finish */
  uint64_t default_seed;     /* the sampling seed of a request that gives none (`cedar run`'s default) */
  struct rt_batch_opts batch;/* continuous batching (its cache: the engine's) */
  bool quiet;                /* no per-request lines on stderr */
  struct srv_ranks ranks;    /* n <= 1: this process alone */
};

/* Serve e until SIGTERM or SIGINT, then stop accepting, drain and return 0;
 * or a negative cedar_status with err (the address in use, the batch
 * refused the plan). Blocks those signals in the calling thread and the
 * threads it starts. */
int srv_run(struct rt_engine *e, const struct srv_text *t, const struct srv_opts *o, char *err, size_t err_len);

#endif
