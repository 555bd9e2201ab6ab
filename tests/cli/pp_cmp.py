#!/usr/bin/env python3
"""pp_cmp.py: a layer-stage run's per-rank dumps against one process's.

usage: pp_cmp.py ONE.st RANKDUMP:LAYERS [RANKDUMP:LAYERS ...]
  LAYERS: the layers that rank holds, e.g. 0-13 or 14-39 or 0-1,20-39, or
  - for none (a P/D prefill rank after the handoff: its dump is D's request).

Every tensor of ONE.st is checked bitwise on the rank holding it: L{l}.*
(SWA rings and positions, Main KV, Indexer K, tail positions) on the rank
whose LAYERS name l; the model-wide ones (tokens, prefill and decode logits,
positions) on every rank. Each rank must also differ from ONE.st in some
layer it does not hold (it did not compute the whole model). Exit 1 naming
what differs.
"""
import json, re, struct, sys


def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}


def layers(spec):
    out = set()
    if spec == "-":
        return out
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


one = load(sys.argv[1])
covered = set()
for arg in sys.argv[2:]:
    path, _, spec = arg.rpartition(":")
    mine, d = layers(spec), load(path)
    checked, elsewhere_differs = 0, False
    for k, v in one.items():
        m = re.match(r"L(\d+)\.", k)
        if m and int(m.group(1)) not in mine:
            elsewhere_differs |= d.get(k) != v
            continue
        if d.get(k) != v:
            sys.exit("FAIL: %s: %s differs from one process" % (path, k))
        checked += 1
        covered.add(k)
    held_all = not any(re.match(r"L(\d+)\.", k) and int(re.match(r"L(\d+)\.", k).group(1)) not in mine for k in one)
    if not elsewhere_differs and not held_all:
        sys.exit("FAIL: %s equals one process in every layer it does not hold: did it run the whole model?" % path)
    print("%s: %d tensors equal (layers %s)" % (path, checked, spec))
missing = sorted(set(one) - covered)
if missing:
    sys.exit("FAIL: no rank holds %s" % missing[:8])
print("every tensor of %s checked: %d" % (sys.argv[1], len(one)))
