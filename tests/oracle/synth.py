"""Synthetic weights for a plan, for the oracle's self-tests (and for any
test that wants a seeded model file in cedar's naming, docs/weights.md).

Scales keep every activation O(1): linear weights ~ N(0, 1/fan_in), norm
weights 1 + N(0, 0.1^2), mHC bases biased so H_res starts near the identity,
attention sinks ~ N(0, 1), Engram rows ~ N(0, 1) packed as E4M3 + E8M0.

    /usr/bin/python3 tests/oracle/synth.py PLAN OUT.safetensors [SEED]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import formats as F  # noqa: E402
import oracle as O  # noqa: E402
import plan as P  # noqa: E402
import st as ST  # noqa: E402


def make_weights(plan, seed=0):
    rng = np.random.default_rng(seed)
    shapes = O.weight_shapes(plan)
    hc = plan.model['mhc']['streams']
    out = {}
    # the drafter's tensors after all others, so they leave the others' draws as they were
    for name in sorted(shapes, key=lambda n: (n.startswith('mtp.'), n)):
        dt, shape = shapes[name]
        leaf = name.split('.')[-1]
        if dt == 'U8':  # Engram table: rows of E4M3 + E8M0 per 32
            hd = shape[1] * 32 // 33
            vals = rng.standard_normal((shape[0], hd), dtype=np.float32)
            out[name] = F.engram_row_pack(vals)
            continue
        if name.endswith('hc.base') or name.endswith('hc_attn.base') or name.endswith('hc_ffn.base'):
            a = 0.1 * rng.standard_normal(shape)
            if shape[0] == (2 + hc) * hc:
                a[2 * hc:] += 2.0 * np.eye(hc).ravel()          # H_res near the identity
        elif leaf == 'scale':
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif leaf in ('norm', 'attn_norm', 'ffn_norm', 'q_norm', 'kv_norm', 'k_norm', 'q_w', 'k_w'):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif leaf == 'sink':
            a = rng.standard_normal(shape)
        elif leaf == 'bias':
            a = 0.1 * rng.standard_normal(shape)
        elif name == 'embed':
            a = rng.standard_normal(shape, dtype=np.float32)
        else:  # linear (..., out, in)
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(shape[-1]))
        out[name] = np.asarray(a, dtype=np.float32)
    return out


def write_weights(plan_path, out_path, seed=0):
    plan = P.Plan(plan_path)
    ST.write(out_path, make_weights(plan, seed),
             {'cedar.plan': plan.name, 'cedar.seed': str(seed),
              'cedar.fingerprint': 'oracle-synthetic'})
    return out_path


if __name__ == '__main__':
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    write_weights(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
