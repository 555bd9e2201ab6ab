#!/usr/bin/env python3
"""bench_serve.py: cedar serve's streamed latency against serve-sim's on the
same workload, in one run (issue 27's goals; docs/PERF.md "cedar serve").

  python3 tests/serve/bench_serve.py --cedar build/cedar [--plan P]
      [--concurrency 64] [--prompt-len 32] [--max-tokens 32] [--rounds 1]

1. `cedar serve-sim --max-batch C --num-prompts C --prompt-len L --max-new M`
   (all at time 0, no prefix cache): its TTFT and ITL (vLLM's names), the
   engine's step time with no HTTP;
2. `cedar serve --max-batch C --no-cache` on a free loopback port, and C
   concurrent streaming clients (random id prompts of L tokens, greedy,
   max_tokens M) started at once: TTFT and ITL as a client sees them (ITL:
   the gaps between consecutive SSE events, as vLLM's benchmark_serving
   measures them), errors;
3. the overhead per token: (HTTP ITL - serve-sim ITL) / serve-sim ITL at the
   median, and the p99/p50 ratio of the streamed ITL.
Loopback only; every loop bounded; the server is stopped with SIGTERM.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    f = int(k)
    return xs[f] + (xs[min(f + 1, len(xs) - 1)] - xs[f]) * (k - f)


def serve_sim(a):
    out = subprocess.run([a.cedar, "serve-sim", "--plan", a.plan, "--max-batch", str(a.concurrency), "--num-prompts",
                          str(a.concurrency), "--prompt-len", str(a.prompt_len), "--max-new", str(a.max_tokens),
                          "--no-cache", "--json"], capture_output=True, text=True, timeout=1200, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["totals"]


def stream_one(port, prompt, max_tokens, rec):
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": prompt, "max_tokens": max_tokens,
                                                           "temperature": 0, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        rec["error"] = "status %d" % r.status
        r.read()
        return
    times, buf = [], b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b"data: {"):
                j = json.loads(ev[6:])
                if "error" in j:
                    rec["error"] = j["error"]["message"]
                elif j["choices"] and j["choices"][0].get("text"):
                    times.append(time.monotonic())
    c.close()
    rec["ttft"] = times[0] - t0 if times else None
    rec["itl"] = [b - a for a, b in zip(times, times[1:])]


def http_run(a):
    tmp = tempfile.mkdtemp()
    pf = os.path.join(tmp, "port")
    srv = subprocess.Popen([a.cedar, "serve", "--plan", a.plan, "--max-batch", str(a.concurrency), "--no-cache",
                            "--port", "0", "--port-file", pf, "--max-waiting", str(4 * a.concurrency), "--quiet",
                            "--max-tokens", str(max(a.max_tokens, 16))], stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if os.path.exists(pf) and open(pf).read().strip():
                break
            time.sleep(0.1)
        port = int(open(pf).read())
        rng = random.Random(1)
        recs = []
        for _ in range(a.rounds):
            rs = [{} for _ in range(a.concurrency)]
            ts = [threading.Thread(target=stream_one, args=(port, [rng.randrange(1, 256) for _ in range(a.prompt_len)],
                                                            a.max_tokens, rs[i])) for i in range(a.concurrency)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(900)
            recs += rs
        return recs
    finally:
        srv.terminate()
        srv.wait(60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cedar", default="build/cedar")
    ap.add_argument("--plan", default="plans/v41-mini.yaml")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    sim = serve_sim(a)
    recs = http_run(a)
    errors = [r.get("error") for r in recs if r.get("error")]
    itl = [x * 1e3 for r in recs for x in r.get("itl", [])]
    ttft = [r["ttft"] * 1e3 for r in recs if r.get("ttft") is not None]
    p50, p99 = pct(itl, 50), pct(itl, 99)
    print("workload: %d concurrent streams, prompts of %d tokens, %d new each, plan %s" % (
        a.concurrency, a.prompt_len, a.max_tokens, a.plan))
    print("serve-sim (no HTTP): TTFT p50 %.2f ms; ITL p50 %.2f ms, p99 %.2f ms" % (
        sim["p50_ttft_ms"], sim["p50_itl_ms"], sim["p99_itl_ms"]))
    print("cedar serve (HTTP, SSE): %d streams, %d errors; TTFT p50 %.2f ms; ITL p50 %.2f ms, p99 %.2f ms "
          "(p99/p50 %.2f), mean %.2f ms over %d gaps" % (len(recs), len(errors), pct(ttft, 50), p50, p99, p99 / p50,
                                                         statistics.mean(itl) if itl else float("nan"), len(itl)))
    print("overhead per token at the median: %+.1f%% of serve-sim's ITL" % (100 * (p50 - sim["p50_itl_ms"]) /
                                                                           sim["p50_itl_ms"]))
    for e in sorted(set(errors))[:5]:
        print("  error: %s" % e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
