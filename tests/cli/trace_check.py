"""trace_check.py: check a multi-rank Chrome trace (`mpirun -np 2 cedar run
--trace`, cli/run_pd.c) against the format rules its consumers apply.

The Trace Event Format rules Perfetto's JSON importer and speedscope's
Chrome importer rely on: a traceEvents array of objects with string name and
ph and integer pid and tid; "X" slices with numeric ts and non-negative dur,
properly nested or disjoint on each (pid, tid) track (Perfetto drops, and
speedscope refuses, slices that overlap without nesting); timestamps that
never go back on a track in file order; process_name for every pid and
thread_name for every track that holds a slice, each named under its own
pid; flow v1 events ("s" then "f" with "bp":"e") paired by (cat, id), each
bound to a slice on its own track (its ts inside the slice), the start no
later than the end.

cedar's multi-rank content (--ranks R --transfers T): a process per rank
0..R-1, each holding slices; exactly T flows of category "transfer", each
from a "xfer ..." slice on the prefill rank's process to a "recv xfer ..."
slice of the same node on the decode rank's; cross-worker graph edges stay
category "dep" and inside one process.

cedar's one-process content (--tasks N, tests/cli/trace.sh): exactly N
slices (one per task that ran), each named "<node> r<request>" with args
layer, mode, chunk, request, flops and bytes; slices on two or more tracks
have at least one flow between them (the graph is connected).

Usage: trace_check.py FILE [--ranks R --transfers T] [--tasks N]. Exit 0 when it holds,
1 with the first problem on stderr. --selftest: the checker rejects traces
broken in each way above (so it can fail).
"""
import json
import sys
from collections import defaultdict


def problems(doc, ranks=None, transfers=None, tasks=None):
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return "no traceEvents array"
    names, last_ts, slices, flows = {}, {}, defaultdict(list), defaultdict(list)
    num = (int, float)
    for i, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict):
            return f"event {i} is not an object"
        for k, t in (("name", str), ("ph", str), ("pid", int), ("tid", int)):
            if not isinstance(e.get(k), t) or isinstance(e.get(k), bool):
                return f"event {i} lacks {k} of type {t.__name__}: {e}"
        ph, track = e["ph"], (e["pid"], e["tid"])
        if ph == "M":
            if not isinstance(e.get("args"), dict) or not isinstance(e["args"].get("name", ""), (str, int)):
                return f"metadata event {i} has no args"
            if e["name"] == "process_name":
                names[("p", e["pid"])] = e["args"]["name"]
            elif e["name"] == "thread_name":
                names[("t", track)] = e["args"]["name"]
            continue
        if ph == "C":  # a counter lane (the Engram prefetch): numeric ts and numeric args
            if not isinstance(e.get("ts"), num) or not isinstance(e.get("args"), dict) or \
                    not all(isinstance(v, num) for v in e["args"].values()):
                return f"counter event {i} lacks a numeric ts or numeric args"
            continue
        if ph not in ("X", "s", "f"):
            return f"event {i}: phase {ph} is not one cedar writes"
        if not isinstance(e.get("ts"), num) or isinstance(e.get("ts"), bool):
            return f"event {i} has no numeric ts"
        if e["ts"] < last_ts.get(track, float("-inf")):
            return f"event {i}: ts {e['ts']} goes back on track {track}"
        last_ts[track] = e["ts"]
        if ph == "X":
            if not isinstance(e.get("dur"), num) or isinstance(e.get("dur"), bool) or e["dur"] < 0:
                return f"slice {i} has no non-negative numeric dur"
            slices[track].append((e["ts"], e["ts"] + e["dur"], i, e))
        else:
            if not isinstance(e.get("id"), int) or not isinstance(e.get("cat"), str):
                return f"flow event {i} has no integer id and string cat"
            if ph == "f" and e.get("bp") != "e":
                return f"flow end {i} is not bound to its enclosing slice (bp e)"
            flows[(e["cat"], e["id"])].append(e)
    for track, ss in slices.items():
        stack = []
        for t0, t1, i, _ in ss:
            while stack and stack[-1][1] <= t0:
                stack.pop()
            if stack and t1 > stack[-1][1]:
                return f"slice {i} on track {track} overlaps slice {stack[-1][2]} without nesting"
            stack.append((t0, t1, i))
        if ("t", track) not in names:
            return f"track {track} has no thread_name under pid {track[0]}"
        if ("p", track[0]) not in names:
            return f"process {track[0]} has no process_name"

    def slice_at(e):
        for t0, t1, _, s in slices[(e["pid"], e["tid"])]:
            if t0 <= e["ts"] <= t1:
                return s
        return None

    xfer = 0
    for key, es in flows.items():
        kinds = sorted(x["ph"] for x in es)
        if kinds != ["f", "s"]:
            return f"flow {key} has phases {kinds}, not one s and one f"
        s, f = (es[0], es[1]) if es[0]["ph"] == "s" else (es[1], es[0])
        if s["ts"] > f["ts"]:
            return f"flow {key} ends before it starts"
        a, b = slice_at(s), slice_at(f)
        if a is None or b is None:
            return f"flow {key} is not bound to a slice on its track"
        if (s["pid"], s["tid"]) == (f["pid"], f["tid"]):
            return f"flow {key} stays on one track"
        if key[0] == "transfer":
            xfer += 1
            if s["pid"] == f["pid"]:
                return f"transfer flow {key} stays in process {s['pid']}"
            if not a["name"].startswith("xfer ") or b["name"] != "recv " + a["name"].rsplit(" r", 1)[0]:
                return f"transfer flow {key} joins '{a['name']}' to '{b['name']}'"
        elif s["pid"] != f["pid"]:
            return f"graph edge {key} crosses processes"
    if ranks is not None:
        for r in range(ranks):
            if ("p", r) not in names:
                return f"no process_name for rank {r}"
            if not any(t[0] == r and ss for t, ss in slices.items()):
                return f"rank {r} has no slices"
    if transfers is not None and xfer != transfers:
        return f"{xfer} transfer flows, expected {transfers} (one per transfer)"
    n = sum(len(ss) for ss in slices.values())
    if tasks is not None:
        if n != tasks:
            return f"{n} slices, expected {tasks} (one per task)"
        for ss in slices.values():
            for _, _, _, e in ss:
                a = e.get("args", {})
                for k in ("layer", "mode", "chunk", "request", "flops", "bytes"):
                    if k not in a:
                        return f"slice {e['name']} lacks arg {k}"
                if e["name"].rsplit(" r", 1)[-1] != str(a["request"]):
                    return f"slice {e['name']} is not named after its request {a['request']}"
        if sum(1 for ss in slices.values() if ss) >= 2 and not flows:
            return f"slices on {sum(1 for ss in slices.values() if ss)} tracks but no flow between them"
    print(f"trace: {n} slices on {len(slices)} tracks in {len({t[0] for t in slices})} processes, "
          f"{xfer} transfer flows, {len(flows) - xfer} graph-edge flows")
    return None


def selftest():
    base = {"traceEvents": [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "rank 0"}},
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "rank 1"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 2, "args": {"name": "a"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 3, "args": {"name": "b"}},
        {"name": "xfer L0.kv c0 r0", "ph": "X", "pid": 0, "tid": 2, "ts": 0, "dur": 10},
        {"name": "transfer", "cat": "transfer", "ph": "s", "pid": 0, "tid": 2, "ts": 0, "id": 1},
        {"name": "recv xfer L0.kv c0", "ph": "X", "pid": 1, "tid": 3, "ts": 12, "dur": 1},
        {"name": "transfer", "cat": "transfer", "ph": "f", "bp": "e", "pid": 1, "tid": 3, "ts": 12, "id": 1}]}
    assert problems(json.loads(json.dumps(base)), 2, 1) is None
    bad = {
        "overlap": lambda e: e.append({"name": "z", "ph": "X", "pid": 1, "tid": 3, "ts": 12.5, "dur": 9}),
        "backwards": lambda e: e.append({"name": "z", "ph": "X", "pid": 0, "tid": 2, "ts": -2, "dur": 1}),
        "no_ts": lambda e: e[4].pop("ts"),
        "no_pid": lambda e: e[6].pop("pid"),
        "unpaired": lambda e: e.pop(7),
        "no_thread_name": lambda e: e.pop(3),
        "no_process_name": lambda e: e.pop(1),
        "string_dur": lambda e: e[4].update(dur="10"),
        "unbound": lambda e: e[7].update(ts=20),
        "no_bp": lambda e: e[7].pop("bp"),
        "same_process": lambda e: (e[6].update(pid=0), e[7].update(pid=0), e.append(
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 3, "args": {"name": "b"}})),
        "wrong_pair": lambda e: e[6].update(name="recv xfer L1.kv c0"),
        "missing_rank": lambda e: (e.pop(7), e.pop(6), e.pop(5)),
    }
    for k, f in bad.items():
        b = json.loads(json.dumps(base))
        f(b["traceEvents"])
        if problems(b, 2, 1) is None:
            print(f"the checker accepts a trace broken by {k}", file=sys.stderr)
            sys.exit(1)
    one = {"traceEvents": [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "cedar"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "w0"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 2, "args": {"name": "w1"}},
        {"name": "L0.attn c0 r0", "ph": "X", "pid": 0, "tid": 1, "ts": 0, "dur": 10, "args": {
            "layer": 0, "mode": "csa", "chunk": 0, "request": 0, "flops": 1, "bytes": 1}},
        {"name": "dep", "cat": "dep", "ph": "s", "pid": 0, "tid": 1, "ts": 5, "id": 1},
        {"name": "L0.moe c0 r0", "ph": "X", "pid": 0, "tid": 2, "ts": 12, "dur": 5, "args": {
            "layer": 0, "mode": "csa", "chunk": 0, "request": 0, "flops": 1, "bytes": 1}},
        {"name": "dep", "cat": "dep", "ph": "f", "bp": "e", "pid": 0, "tid": 2, "ts": 12, "id": 1}]}
    assert problems(json.loads(json.dumps(one)), tasks=2) is None
    bad1 = {
        "task_count": lambda e: e.pop(5),
        "no_arg": lambda e: e[3]["args"].pop("flops"),
        "wrong_request": lambda e: e[5].update(name="L0.moe c0 r1"),
        "no_flow": lambda e: (e.pop(6), e.pop(4)),
    }
    for k, f in bad1.items():
        b = json.loads(json.dumps(one))
        f(b["traceEvents"])
        if problems(b, tasks=2) is None:
            print(f"the checker accepts a one-process trace broken by {k}", file=sys.stderr)
            sys.exit(1)
    print(f"trace_check: rejects all {len(bad) + len(bad1)} broken traces")


if __name__ == "__main__":
    if sys.argv[1:] == ["--selftest"]:
        selftest()
        sys.exit(0)
    args = sys.argv[2:]
    opt = {args[i]: int(args[i + 1]) for i in range(0, len(args), 2)}
    with open(sys.argv[1]) as fh:
        d = json.load(fh)
    p = problems(d, opt.get("--ranks"), opt.get("--transfers"), opt.get("--tasks"))
    if p:
        print(p, file=sys.stderr)
        sys.exit(1)
