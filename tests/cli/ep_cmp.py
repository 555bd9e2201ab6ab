#!/usr/bin/env python3
"""ep_cmp.py: an expert-parallel run's dumps against one process's.

usage: ep_cmp.py ONE.st OWNER.st [SHARD.st ...]
  OWNER.st (the rank holding every layer: rank 0 of a plan without stages,
  or a one-process run) must equal ONE.st bitwise in every tensor: request
  state of every layer, tokens, positions, prefill and decode logits.
  Each SHARD.st (a rank that only computed experts) must equal ONE.st in
  every model-wide tensor (tokens, logits, positions: each rank has them)
  and differ in some layer's state (it ran no layer). Exit 1 naming what
  differs. Dumps are cedar's safetensors (pp_cmp.py reads the same).
"""
import json, re, struct, sys


def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}


one = load(sys.argv[1])
owner = load(sys.argv[2])
for k, v in one.items():
    if owner.get(k) != v:
        sys.exit("FAIL: %s: %s differs from one process" % (sys.argv[2], k))
print("%s: all %d tensors equal" % (sys.argv[2], len(one)))
for path in sys.argv[3:]:
    d, n, differs = load(path), 0, False
    for k, v in one.items():
        if re.match(r"L\d+\.", k):
            differs |= d.get(k) != v
        elif d.get(k) != v:
            sys.exit("FAIL: %s: %s differs from one process" % (path, k))
        else:
            n += 1
    if not differs:
        sys.exit("FAIL: %s equals one process in every layer: did a shard rank run the model?" % path)
    print("%s: %d model-wide tensors equal" % (path, n))
