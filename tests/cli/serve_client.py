#!/usr/bin/env python3
"""serve_client.py: the HTTP clients of tests/cli/serve.sh and
serve_faults.sh against a running `cedar serve` (loopback only; every loop
bounded in count and time; standard library only).

  serve_client.py PORT equal RUNS.json N     N concurrent clients, the
      prompts of RUNS.json (from `cedar run --json --ids`) round robin; each
      reply's token_ids must equal its run's tokens, bitwise
  serve_client.py PORT refusals              bad bodies, each a 4xx JSON error
  serve_client.py PORT limit                 429 with Retry-After past --max-waiting
  serve_client.py PORT storm N               N streaming clients vanish mid-stream;
      then running, waiting and KV pages return to 0
  serve_client.py PORT slowloris N           N partial requests; a normal one still
      answers, and the server closes the partial ones (--idle-timeout)
  serve_client.py PORT soak N PID            N requests in a row; RSS flat
Exit 0 when every check holds, 1 with the failures printed.
"""
import http.client
import json
import socket
import sys
import threading
import time

PORT = int(sys.argv[1])
FAILS = []


def fail(msg):
    FAILS.append(msg)
    print("FAIL: " + msg, file=sys.stderr)


def post(path, body, headers=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request("POST", path, body=data, headers=h)
    r = c.getresponse()
    out = r.status, dict(r.getheaders()), r.read()
    c.close()
    return out


def get(path):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def metrics():
    _, body = get("/metrics")
    m = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
    return m


def equal(runs_path, n, seq=False):
    runs = json.load(open(runs_path))
    res = [None] * n

    def one(i):
        r = runs[i % len(runs)]
        body = {"prompt": r["prompt"], "max_tokens": r["max_new"], "temperature": r.get("temperature", 0),
                "return_token_ids": True}
        for k in ("seed", "top_k", "repetition_penalty"):
            if k in r:
                body[k] = r[k]
        if r.get("chat"):
            body = dict(body, messages=[{"role": "user", "content": body.pop("prompt")}])
        res[i] = post("/v1/chat/completions" if r.get("chat") else "/v1/completions", body)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
        if seq:
            t.join(120)
    for t in ts:
        t.join(120)
    for i in range(n):
        r = runs[i % len(runs)]
        if res[i] is None:
            fail("client %d got no answer" % i)
            continue
        st, _, body = res[i]
        j = json.loads(body)
        if r["end"] == "error":  # an id the tokenizer has no token for: the run says error, the server 500
            if st != 500:
                fail("client %d: cedar run ended by error, the server answered %d" % (i, st))
            continue
        if st != 200:
            fail("client %d: status %d: %s" % (i, st, body[:200]))
            continue
        ch = j["choices"][0]
        if ch["token_ids"] != r["tokens"] or ch["prompt_token_ids"] != r["prompt_ids"]:
            fail("client %d (prompt %r): ids %s, cedar run's %s" % (i, r["prompt"], ch["token_ids"], r["tokens"]))
        if ch.get("text", ch.get("message", {}).get("content")) != r["text"]:
            fail("client %d: text %r, cedar run's %r" % (i, ch.get("text"), r["text"]))
    print("equal: %d %s, %d prompts, %d failures" % (n, "requests one at a time" if seq else "concurrent clients",
                                                      len(runs), len(FAILS)))


def refusals():
    cases = [  # (body, status, text the message must hold)
        (b'{"prompt": "x", "logprobs": 2}', 400, '"logprobs"'),
        (b'{"prompt": "x", "frequency_penalty": 0.5}', 400, '"frequency_penalty"'),
        (b'{"prompt": "x",', 400, "byte 14"),
        (b'{"prompt": "x"} trailing', 400, "byte 16"),
        (b'', 400, "byte 0"),
        (b'[1, 2]', 400, "JSON object"),
        (b'"prompt"', 400, "JSON object"),
        (b'{"prompt": 5}', 400, '"prompt"'),
        (b'{"prompt": ["a", "b"]}', 400, "several prompts"),
        (b'{"prompt": [1, -1]}', 400, '"prompt"[1]'),
        (b'{"prompt": [1e300]}', 400, '"prompt"[0]'),
        (b'{"prompt": "x", "max_tokens": 0}', 400, '"max_tokens"'),
        (b'{"prompt": "x", "max_tokens": 2.5}', 400, '"max_tokens"'),
        (b'{"prompt": "x", "max_tokens": "8"}', 400, '"max_tokens"'),
        (b'{"prompt": "x", "max_tokens": 99999999}', 400, '"max_tokens"'),
        (b'{"prompt": "x", "temperature": -1}', 400, '"temperature"'),
        (b'{"prompt": "x", "top_p": 0}', 400, '"top_p"'),
        (b'{"prompt": "x", "top_k": 1.5}', 400, '"top_k"'),
        (b'{"prompt": "x", "seed": -3}', 400, '"seed"'),
        (b'{"prompt": "x", "stop": [1]}', 400, '"stop"[0]'),
        (b'{"prompt": "x", "stop": ""}', 400, '"stop"'),
        (b'{"prompt": "x", "stream": "yes"}', 400, '"stream"'),
        (b'{"prompt": "x", "n": 2}', 400, '"n"'),
        (b'{"prompt": "x", "prompt": "y"}', 400, "twice"),
        (b'{"prompt": "x", "model": "gpt-4"}', 404, "gpt-4"),
        (b'{"max_tokens": 3}', 400, '"prompt" is required'),
        (b'{"prompt": ""}', 400, "empty"),
        (b'{"prompt": "\xff\xfe"}', 400, "UTF-8"),
        (b'{"prompt": "x", "a": ' + b'[' * 5000 + b']' * 5000 + b'}', 400, ""),
        (b'{"prompt": "' + b'a' * 10000 + b'"', 400, "byte"),
    ]
    for body, want, text in cases:
        st, hdr, out = post("/v1/completions", body)
        try:
            msg = json.loads(out)["error"]["message"]
        except Exception:
            fail("%r: not a JSON error: %r" % (body[:60], out[:200]))
            continue
        if st != want or text not in msg:
            fail("%r: %d %r, want %d with %r" % (body[:60], st, msg, want, text))
    chat = [
        ({"messages": []}, 400, "1 to"),
        ({"messages": [{"role": "user"}]}, 400, "content"),
        ({"messages": [{"role": "tool", "content": "x"}]}, 400, "tool"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}, 400, "first"),
        ({"messages": [{"role": "assistant", "content": "a"}]}, 400, "answer"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, 400, "end with"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}, 400, "content parts"),
        ({"messages": [{"role": "user", "content": "a"}], "tools": []}, 400, '"tools"'),
        ({"prompt": "x"}, 400, '"prompt"'),
    ]
    for body, want, text in chat:
        st, _, out = post("/v1/chat/completions", body)
        msg = json.loads(out)["error"]["message"]
        if st != want or text not in msg:
            fail("chat %r: %d %r, want %d with %r" % (body, st, msg, want, text))
    # a body over --max-body: 413 as soon as its Content-Length is read, before the body is sent
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
    line = s.recv(100)
    s.close()
    if not line.startswith(b"HTTP/1.1 413"):
        fail("a 2 MiB Content-Length: %r, want 413" % line)
    # chunked, no length: refused once the bytes pass the limit (413, or the connection closed mid-send)
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    sent, line = 0, b""
    try:
        while sent < (4 << 20):
            s.sendall(b"10000\r\n" + b"a" * 0x10000 + b"\r\n")
            sent += 0x10000
        line = s.recv(100)
    except OSError:
        try:
            line = s.recv(100)
        except OSError:
            line = b"(reset)"
    s.close()
    # (the server queues its 413 and closes; a client still sending may see the close or a reset first)
    if not (line.startswith(b"HTTP/1.1 413") or line in (b"", b"(reset)")) or sent >= (4 << 20):
        fail("a chunked body past the limit: %r after %d bytes" % (line[:40], sent))
    for method, path, want in (("GET", "/v1/completions", 405), ("GET", "/nope", 404), ("GET", "/../etc/passwd", 404)):
        c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
        c.request(method, path)
        r = c.getresponse()
        r.read()
        if r.status != want:
            fail("%s %s: %d, want %d" % (method, path, r.status, want))
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)  # malformed HTTP: libmicrohttpd's 400
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
    line = s.recv(100)
    s.close()
    if not line.startswith(b"HTTP/1.1 400"):
        fail("malformed HTTP: %r" % line)
    st, _ = get("/health")
    if st != 200:
        fail("/health after the refusals: %d" % st)
    print("refusals: %d cases, %d failures" % (len(cases) + len(chat) + 5, len(FAILS)))


def limit():
    """With --max-batch 1 --max-waiting 1: a burst of 8 long requests gets 429s."""
    res = []

    def one():
        res.append(post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 64, "temperature": 0}))

    ts = [threading.Thread(target=one) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    codes = sorted(r[0] for r in res)
    if 429 not in codes or not any(c in (200, 500) for c in codes):
        fail("a burst of 8 past --max-waiting 1: statuses %s, want some 429 and some answered" % codes)
    for st, hdr, body in res:
        if st == 429 and hdr.get("Retry-After") != "1":
            fail("429 without Retry-After: %s" % hdr)
    print("limit: statuses %s" % codes)


def storm(n):
    """n streaming clients; each vanishes after its first event."""
    got = [0]
    lock = threading.Lock()

    def one(i):
        s = socket.create_connection(("127.0.0.1", PORT), timeout=60)
        body = json.dumps({"prompt": [1 + i % 50, 2, 3], "max_tokens": 4000, "temperature": 0.8, "seed": i,
                           "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        try:
            data = b""
            while b"data:" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            with lock:
                got[0] += b"data:" in data
        except OSError:
            pass
        s.close()  # vanish mid-stream

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    deadline = time.time() + 60
    m = metrics()
    while time.time() < deadline and (m["cedar_requests_running"] or m["cedar_requests_waiting"] or
                                      m["cedar_kv_pages_in_use"]):
        time.sleep(0.2)
        m = metrics()
    ended = sum(m['cedar_requests_total{outcome="%s"}' % o] for o in ("ok", "failed", "cancelled"))
    print("storm: %d clients, %d saw their first event; after: running %d, waiting %d, KV pages %d; cancelled %d, "
          "failed %d" % (n, got[0], m["cedar_requests_running"], m["cedar_requests_waiting"],
                         m["cedar_kv_pages_in_use"], m['cedar_requests_total{outcome="cancelled"}'],
                         m['cedar_requests_total{outcome="failed"}']))
    if m["cedar_requests_running"] or m["cedar_requests_waiting"] or m["cedar_kv_pages_in_use"]:
        fail("after the storm: slots or pages still held")
    if got[0] < n * 0.9:
        fail("only %d of %d clients saw an event" % (got[0], n))
    if m['cedar_requests_total{outcome="cancelled"}'] < got[0] * 0.5 or ended < n:
        fail("the storm's requests did not all end as cancelled (or finished first)")


def slowloris(n):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        socks.append(s)
    t0 = time.time()
    st, _, body = post("/v1/completions", {"prompt": [1, 2], "max_tokens": 2, "temperature": 0}, timeout=20)
    took = time.time() - t0
    if st not in (200, 500):
        fail("a normal request beside %d partial ones: %d" % (n, st))
    if took > 10:
        fail("a normal request beside %d partial ones took %.1f s" % (n, took))
    closed = 0
    for s in socks:  # the server closes each after its idle timeout
        s.settimeout(30)
        try:
            closed += s.recv(100) == b""
        except OSError:
            closed += 1
        s.close()
    if closed != n:
        fail("%d of %d partial requests were closed by the server" % (closed, n))
    print("slowloris: %d partial requests closed by the server after %.1f s; a normal one beside them answered in "
          "%.3f s" % (closed, time.time() - t0, took))


def rss(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def soak(n, pid):
    warm = max(n // 10, 50)
    base = 0
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    t0 = time.time()
    for i in range(n):
        stream = i % 2 == 1
        c.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": [1 + i % 97, 2 + i % 13, 3], "max_tokens": 4, "temperature": 0.7, "seed": i, "stream": stream}),
            headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        if r.status not in (200, 500):
            fail("soak request %d: %d" % (i, r.status))
        if i == warm and pid:
            base = rss(pid)
    c.close()
    if not pid:
        print("soak: %d requests in %.1f s; RSS not checked (a sanitizer build)" % (n, time.time() - t0))
        return
    end = rss(pid)
    grow = (end - base) / base if base else 1
    print("soak: %d requests in %.1f s; RSS %d kB after %d, %d kB at the end (%+.2f%%)" % (
        n, time.time() - t0, base, warm, end, 100 * grow))
    if grow > 0.05:
        fail("RSS grew %.1f%% over %d requests" % (100 * grow, n - warm))


def main():
    what = sys.argv[2]
    if what == "equal":
        equal(sys.argv[3], int(sys.argv[4]), len(sys.argv) > 5 and sys.argv[5] == "seq")
    elif what == "refusals":
        refusals()
    elif what == "limit":
        limit()
    elif what == "storm":
        storm(int(sys.argv[3]))
    elif what == "slowloris":
        slowloris(int(sys.argv[3]))
    elif what == "soak":
        soak(int(sys.argv[3]), int(sys.argv[4]))
    else:
        print("unknown check %s" % what, file=sys.stderr)
        return 2
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
