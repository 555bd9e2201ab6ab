/* run_opts.c: `cedar run`'s command line into struct ropts (cli/run_opts.h):
 * every flag, its range, and the combinations refused with the reason. The
 * help text is cli/run_usage.c. */
#include "cli/run_opts.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "cli/cli.h"
#include "cli/run_text.h"
#include "runtime/engine/speculate.h"

/* The built-in prompt when none is given (tokenized byte by byte). */
const char run_default_prompt[] =
    "cedar runs DeepSeek-V4.1-Flash-style models from declarative execution plans: a causal "
    "encoder-decoder with sparse attention over a compressed global cache, sliding windows, "
    "bounded replay, mixture-of-experts feed-forward layers and conditional memory.";

static bool parse_f(const char *s, float *out) {
  char *end;
  errno = 0;
  float v = strtof(s, &end);
  if (errno || end == s || *end || !isfinite(v)) return false;
  *out = v;
  return true;
}

/* What the options said beyond their values: for the checks of their combinations. */
struct seen {
  int given;            /* of --prompt, --tokens, --prompt-len */
  bool top_p_given, executor_given;
};

/* One option c (getopt_long's) into o: -1 to go on, else the exit code (0 after --help). */
static int run_opt(int c, struct ropts *o, struct seen *s, char **argv) {
  int64_t v;
  switch (c) {
  case 'p': o->plan = optarg; break;
  case 'w': o->weights = optarg; break;
  case 'M': o->model = optarg; break;
  case 'K': o->tokenizer = optarg; break;
  case 's':
    if (!cli_parse_int(optarg, 0, INT64_MAX, &v)) return cli_usage_error("run", "--seed takes an integer >= 0");
    o->seed = (uint64_t)v;
    break;
  case 1007:
    if (!cli_parse_weights_format(optarg, &o->weights_f32))
      return cli_usage_error("run", "--weights-format takes stored or f32, not '%s'", optarg);
    break;
  case 't': o->prompt = optarg; s->given++; break;
  case 'k': o->tokens = optarg; s->given++; break;
  case 'n':
    if (!cli_parse_int(optarg, 1, INT32_MAX, &o->prompt_len)) return cli_usage_error("run", "--prompt-len takes N >= 1");
    s->given++;
    break;
  case 'm':
    if (!cli_parse_int(optarg, 1, 1 << 20, &v)) return cli_usage_error("run", "--max-new takes N in [1, 1048576]");
    o->max_new = (int)v;
    break;
  case 'c':
    if (!cli_parse_int(optarg, 1, 1 << 20, &v)) return cli_usage_error("run", "--chunk takes C in [1, 1048576]");
    o->chunk = (int)v;
    break;
  case 'r':
    if (!cli_parse_int(optarg, 0, INT32_MAX, &o->replay)) return cli_usage_error("run", "--replay takes R >= 0");
    break;
  case 'T':
    if (!parse_f(optarg, &o->temperature) || o->temperature < 0)
      return cli_usage_error("run", "--temperature takes T >= 0");
    break;
  case 'P':
    if (!parse_f(optarg, &o->top_p) || !(o->top_p > 0 && o->top_p <= 1))
      return cli_usage_error("run", "--top-p takes P in (0, 1]");
    s->top_p_given = true;
    break;
  case 'x': o->exact = true; break;
  case 'd': o->dump = optarg; break;
  case 1004: o->dump_round = optarg; break; /* cli/run_dump.h */
  case 'j': o->json = true; break;
  case 'E':
    if (!rt_executor_parse(optarg, &o->executor))
      return cli_usage_error("run", "--executor takes direct or starpu (got '%s')", optarg);
    s->executor_given = true;
    break;
  case 'S': o->sched = optarg; break;
  case 'W':
    if (!cli_parse_int(optarg, 1, 1024, &v)) return cli_usage_error("run", "--workers takes N >= 1");
    o->workers = (int)v;
    break;
  case 'A': o->trace = optarg; break;
  case 'G': o->dot = optarg; break;
  case 1001: {
    char e2[256];
    if (!run_spec_parse(optarg, &o->spec, e2, sizeof e2)) return cli_usage_error("run", "%s", e2);
    o->speculate = true;
    break;
  }
  case 1002:
    if (!cli_parse_int(optarg, 1, RT_SPEC_LMAX, &v)) return cli_usage_error("run", "--draft-len takes L in [1, %d]", RT_SPEC_LMAX);
    o->spec.draft_len = (int)v;
    break;
  case 1003:
    if (!strcmp(optarg, "auto")) o->spec.verify_len = -1;
    else if (!cli_parse_int(optarg, 0, RT_SPEC_LMAX, &v)) return cli_usage_error("run", "--verify-len takes auto or L in [0, %d]", RT_SPEC_LMAX);
    else o->spec.verify_len = (int)v;
    break;
  case 'D':
    if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
      return cli_usage_error("run", "--device takes cpu or cuda (got '%s')", optarg);
    o->device = optarg;
    break;
  case 1005:
    if (strcmp(optarg, "on") && strcmp(optarg, "off"))
      return cli_usage_error("run", "--cuda-graphs takes on or off (got '%s')", optarg);
    o->cuda_graphs = strcmp(optarg, "on") ? 2 : 1;
    break;
  case 1006: {
    char *end;
    long long mib = strtoll(optarg, &end, 10);
    if (*end || mib < 1 || mib > (1LL << 20))
      return cli_usage_error("run", "--cuda-scratch takes MiB, 1 to 1048576 (got '%s')", optarg);
    o->cuda_scratch = mib << 20;
    break;
  }
  case 'R': o->raw = true; break;
  case 'Y': o->system = optarg; break;
  case 'I': o->ids = true; break;
  case 'Z':
    if (!*optarg || o->n_stops == 16) return cli_usage_error("run", "--stop takes a non-empty string, at most 16 times");
    o->stops[o->n_stops++] = optarg;
    break;
  case 'k' + 256:
    if (!cli_parse_int(optarg, 1, INT32_MAX, &v)) return cli_usage_error("run", "--top-k takes K >= 1");
    o->top_k = (int)v;
    break;
  case 'R' + 256:
    if (!parse_f(optarg, &o->rep_penalty) || !(o->rep_penalty > 0))
      return cli_usage_error("run", "--repetition-penalty takes R > 0 (1 = off)");
    break;
  case 's' + 256:
    if (!cli_parse_int(optarg, 0, INT64_MAX, &v)) return cli_usage_error("run", "--sample-seed takes an integer >= 0");
    o->sample_seed = (uint64_t)v, o->sample_seed_given = true;
    break;
  case 'h': printf(run_usage, CEDAR_DEFAULT_PLAN, strlen(run_default_prompt)), fputs(run_text_usage, stdout); return 0;
  default: return cli_usage_error("run", "bad option, or an option without its value: '%s'", argv[optind - 1]);
  }
  return -1;
}

/* The options' combinations: -1 when they go together, else a usage error. */
static int run_combos(struct ropts *o, const struct seen *s) {
  if (o->speculate && (o->exact || o->dump || o->dump_round || o->trace || o->dot || o->executor != RT_EXEC_DIRECT))
    return cli_usage_error("run", "--speculate runs on the direct executor and takes none of --exact-replay, --dump, "
                                  "--dump-roundings, --trace, --dot");
  if (o->speculate && o->device && !strcmp(o->device, "cuda"))
    return cli_usage_error("run", "--speculate runs on the CPU: its rollback reads the tails' logs on the host");
  if (!o->speculate && (o->spec.draft_len || o->spec.verify_len >= 0))
    return cli_usage_error("run", "--draft-len and --verify-len need --speculate");
  o->spec.json = o->json;
  if (s->given > 1) return cli_usage_error("run", "give one of --prompt, --tokens, --prompt-len");
  if (o->weights && o->seed) return cli_usage_error("run", "--seed makes synthetic weights; drop it with --weights");
  if (o->model && (o->weights || o->seed))
    return cli_usage_error("run", "--model DIR is the weights; drop --weights and --seed");
  if (s->top_p_given && o->temperature == 0)
    return cli_usage_error("run", "--top-p needs --temperature T > 0 (greedy decoding, the default, has no nucleus)");
  if (o->top_k && o->temperature == 0)
    return cli_usage_error("run", "--top-k needs --temperature T > 0 (greedy decoding, the default, keeps one id)");
  if (!o->prompt && (o->raw || o->system || o->n_stops))
    return cli_usage_error("run", "--raw, --system and --stop go with --prompt TEXT (the output is text only then)");
  if (o->raw && o->system) return cli_usage_error("run", "--system is part of the chat format; --raw has none");
  if (!s->executor_given && (o->sched || o->workers || o->trace)) o->executor = RT_EXEC_STARPU; /* they are StarPU's */
  if (o->executor == RT_EXEC_DIRECT && (o->sched || o->workers || o->trace))
    return cli_usage_error("run", "--sched, --workers and --trace need --executor starpu (the direct executor runs "
                                  "on one thread and records no task times)");
  return -1;
}

int run_parse(int argc, char **argv, struct ropts *o) {
  static const struct option opts[] = {
      {"plan", required_argument, NULL, 'p'},        {"weights", required_argument, NULL, 'w'},
      {"seed", required_argument, NULL, 's'},        {"prompt", required_argument, NULL, 't'},
      {"tokens", required_argument, NULL, 'k'},      {"prompt-len", required_argument, NULL, 'n'},
      {"max-new", required_argument, NULL, 'm'},     {"chunk", required_argument, NULL, 'c'},
      {"replay", required_argument, NULL, 'r'},      {"temperature", required_argument, NULL, 'T'},
      {"top-p", required_argument, NULL, 'P'},       {"exact-replay", no_argument, NULL, 'x'},
      {"dump", required_argument, NULL, 'd'},        {"json", no_argument, NULL, 'j'},
      {"executor", required_argument, NULL, 'E'},    {"sched", required_argument, NULL, 'S'},
      {"workers", required_argument, NULL, 'W'},     {"trace", required_argument, NULL, 'A'},
      {"dot", required_argument, NULL, 'G'},         {"help", no_argument, NULL, 'h'},
      {"device", required_argument, NULL, 'D'},
      {"model", required_argument, NULL, 'M'},       {"tokenizer", required_argument, NULL, 'K'},
      {"speculate", required_argument, NULL, 1001},  {"draft-len", required_argument, NULL, 1002},
      {"verify-len", required_argument, NULL, 1003}, {"dump-roundings", required_argument, NULL, 1004},
      {"raw", no_argument, NULL, 'R'},               {"system", required_argument, NULL, 'Y'},
      {"stop", required_argument, NULL, 'Z'},        {"ids", no_argument, NULL, 'I'},
      {"top-k", required_argument, NULL, 'k' + 256}, {"repetition-penalty", required_argument, NULL, 'R' + 256},
      {"sample-seed", required_argument, NULL, 's' + 256},
      {"cuda-graphs", required_argument, NULL, 1005},
      {"cuda-scratch", required_argument, NULL, 1006},
      {"weights-format", required_argument, NULL, 1007},
      {0, 0, 0, 0}};
  memset(o, 0, sizeof(*o));
  o->max_new = 16;
  o->replay = -1;
  o->top_p = 1.0f;
  o->spec.verify_len = -1;
  o->executor = RT_EXEC_DIRECT; /* a single request decodes fastest on it (docs/runtime.md, "Which executor") */
  struct seen s = {0};
  int c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int rc = run_opt(c, o, &s, argv);
    if (rc != -1) return rc;
  }
  if (optind < argc) return cli_usage_error("run", "unexpected argument '%s'", argv[optind]);
  return run_combos(o, &s);
}
