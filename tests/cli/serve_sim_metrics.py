#!/usr/bin/env python3
"""serve_sim_metrics.py: recompute `cedar serve-sim --max-batch N --json`'s
totals from its per-request rows, independently of the C code, and compare.

Definitions (docs/serving.md; vLLM's benchmark_serving names):
  ttft  = first token time - arrival         (ms, per request)
  tpot  = (e2el - ttft) / (output_len - 1)   (ms, requests with 2+ tokens)
  itl   = every gap between consecutive token times, all requests pooled (ms)
  e2el  = last token time - arrival          (ms, per request)
  mean, median, std (population) and percentiles by linear interpolation
  (numpy.percentile's default); goodput = requests within every SLO they
  carry / duration; throughputs = counts / duration.
Usage: serve_sim_metrics.py FILE.jsonl  (exit 1 naming the first mismatch)
"""
import json
import sys

import numpy as np


def main(path):
    lines = [json.loads(l) for l in open(path) if l.strip()]
    rows, tot = lines[:-1], lines[-1]["totals"]
    for r in rows:
        t = r["token_times_s"]
        assert len(t) == r["output_len"] == len(r["tokens"]), r["id"]
        assert all(b >= a for a, b in zip(t, t[1:])), f"request {r['id']}: token times go backwards"
        assert t[0] >= r["admitted_s"] >= r["arrival_s"], f"request {r['id']}: first token before admission"
    ttft = np.array([1e3 * (r["token_times_s"][0] - r["arrival_s"]) for r in rows])
    e2el = np.array([1e3 * (r["token_times_s"][-1] - r["arrival_s"]) for r in rows])
    tpot = np.array([(e - f) / (r["output_len"] - 1) for r, f, e in zip(rows, ttft, e2el) if r["output_len"] > 1])
    itl = np.array([1e3 * (b - a) for r in rows for a, b in zip(r["token_times_s"], r["token_times_s"][1:])])
    good = 0
    for r, f, e in zip(rows, ttft, e2el):
        tp = (e - f) / (r["output_len"] - 1) if r["output_len"] > 1 else 0.0
        ok = all(k not in r or v <= r[k] * (1 + 1e-12) for k, v in
                 (("slo_ttft_ms", f), ("slo_tpot_ms", tp), ("slo_e2el_ms", e)))
        assert ok == r["good"], f"request {r['id']}: good is {r['good']}, recomputed {ok}"
        good += ok
    dur = tot["duration"]
    want = {
        "completed": len(rows),
        "total_input_tokens": sum(r["prompt_len"] for r in rows),
        "total_output_tokens": sum(r["output_len"] for r in rows),
        "request_throughput": len(rows) / dur,
        "request_goodput": good / dur,
        "output_throughput": sum(r["output_len"] for r in rows) / dur,
        "total_token_throughput": sum(r["prompt_len"] + r["output_len"] for r in rows) / dur,
    }
    for name, v in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        v = v if len(v) else np.zeros(1)
        want[f"mean_{name}_ms"] = float(np.mean(v))
        want[f"median_{name}_ms"] = float(np.median(v))
        want[f"std_{name}_ms"] = float(np.std(v))
        for p in tot["percentiles"]:
            want[f"p{p:g}_{name}_ms"] = float(np.percentile(v, p))
    # the C side sums in a different order: agree to a few ulps of the values' scale
    for k, v in want.items():
        got = tot[k]
        scale = max(abs(v), 1e-9)
        if abs(got - v) > 1e-9 * scale + 1e-12:
            print(f"{k}: serve-sim says {got}, recomputed {v}")
            return 1
    print(f"{len(rows)} requests: {len(want)} totals agree with the rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
