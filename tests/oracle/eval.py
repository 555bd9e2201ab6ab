"""Teacher-forced NLL of a text by the NumPy oracle, and its comparison with
`cedar eval --json --per-token` (tests/cli/eval.sh, ctest cli_eval).

    eval.py PLAN WEIGHTS --text FILE --context N --stride S [--released DIR] --cedar CEDAR.json [--json]

The windows are `cedar eval`'s, written here from its documentation
(docs/runtime.md, "Teacher-forced evaluation"; runtime/engine/eval.h), not
from its code: one id per byte; the first window prefills id 0 and scores
ids 1 .. min(N, n) - 1; window k >= 1 scores ids [a, b) = [N + (k-1) S,
min(a + S, n)) after a prefill of ids [a - (N - S), a). A window's first
scored id is predicted by the prefill's last row (every position of it ran
through every layer, `PrefillResult.last`); id j > a by the decode step that
consumed id j - 1. Each window is a fresh request (`Oracle.reset`).

The comparison, and why its tolerance is what it is: cedar computes in fp32
(the plan's `model.numerics` all f32), the oracle in float64 with the same
storage roundings. A value cedar computes carries a relative error of at
most K u from its longest reduction (u = 2^-24, K the longest dot product
of the model: the mHC mix over hc x hidden), and one such error enters per
layer, so a logit differs by at most L K u relative (L layers) plus what
the softmax adds, which is no more than the logit error itself: the NLL of
a token differs by at most twice the largest logit difference. So each
scored id's NLL may differ by TOL = 2 L K u (1 + |NLL|) and the total by the
sum of those. A discrete choice (Top-K, MoE routing, the candidate pool) made
differently at a near tie is not an fp32 error; the test's plan and text are
chosen small enough that none occurs, and a token over TOL is reported with
its position. Exit 0 = agree, 1 = disagree, 2 = usage.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import oracle as O  # noqa: E402

U32 = 2.0 ** -24


def windows(n, context, stride):
    """(c0, a, b) for each window: prefill [c0, a), score [a, b)."""
    first = min(context, n)
    if first > 1:
        yield 0, 1, first
    a = first
    while a < n:
        b = min(a + stride, n)
        yield a - (context - stride), a, b
        a = b


def log_softmax(row):
    row = np.asarray(row, np.float64)
    m = row.max()
    return row - (m + math.log(np.exp(row - m).sum()))


def score(o, ids, context, stride):
    """Per scored id: (position, NLL in nats, argmax)."""
    out = []
    for c0, a, b in windows(len(ids), context, stride):
        o.reset()
        rows = [o.prefill(ids[c0:a]).last]
        for j in range(a + 1, b):
            rows.append(o.decode(ids[j - 1]))
        for j, row in zip(range(a, b), rows):
            ls = log_softmax(row)
            out.append((j, float(-ls[ids[j]]), int(np.argmax(row))))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('plan')
    ap.add_argument('weights', help='a safetensors file for the oracle (released.py --out writes one from DIR)')
    ap.add_argument('--text', required=True)
    ap.add_argument('--context', type=int, required=True)
    ap.add_argument('--stride', type=int, required=True)
    ap.add_argument('--cedar', required=True, help='`cedar eval --json --per-token` output')
    ap.add_argument('--json', action='store_true')
    a = ap.parse_args(argv)
    with open(a.text, 'rb') as f:
        ids = list(f.read())
    with open(a.cedar) as f:
        c = json.load(f)
    o = O.Oracle(a.plan, a.weights)
    got = score(o, ids, a.context, a.stride)
    L = o.n_layers
    K = o.hc * o.d            # the longest reduction: the mHC mix over hc x hidden
    tol_rel = 2 * L * K * U32
    pt = c['per_token']
    problems = []
    if c['windows'] != sum(1 for _ in windows(len(ids), a.context, a.stride)):
        problems.append('windows: cedar %d' % c['windows'])
    if pt['pos'] != [g[0] for g in got] or pt['id'] != [ids[g[0]] for g in got]:
        problems.append('scored positions or ids differ')
    worst, tot_o, tot_tol = 0.0, 0.0, 0.0
    for i, (j, nll, am) in enumerate(got):
        if i >= len(pt['nll']):
            break
        d = abs(pt['nll'][i] - nll)
        tol = tol_rel * (1 + abs(nll))
        worst = max(worst, d / tol)
        tot_o += nll
        tot_tol += tol
        if d > tol:
            problems.append('position %d: NLL cedar %.9g, oracle %.9g (|d| %.3g > %.3g)' % (j, pt['nll'][i], nll, d, tol))
        if pt['argmax'][i] != am:
            problems.append('position %d: argmax cedar %d, oracle %d' % (j, pt['argmax'][i], am))
    d_tot = abs(c['nll_nats'] - tot_o)
    if d_tot > tot_tol:
        problems.append('total NLL cedar %.12g, oracle %.12g (|d| %.3g > %.3g)' % (c['nll_nats'], tot_o, d_tot, tot_tol))
    bpb_o = tot_o / math.log(2) / len(got)
    rep = {'tokens': len(got), 'nll_oracle': tot_o, 'nll_cedar': c['nll_nats'], 'bpb_oracle': bpb_o,
           'bpb_cedar': c['bits_per_byte'], 'rel_diff_total': d_tot / tot_o if tot_o else 0.0,
           'tol_rel_per_token': tol_rel, 'worst_over_tol': worst, 'problems': problems}
    if a.json:
        print(json.dumps(rep, indent=1))
    else:
        print('oracle eval: %d ids, bits per byte oracle %.9f cedar %.9f (total NLL relative difference %.3g); '
              'per-id tolerance 2 L K u = %.3g x (1 + NLL), worst id at %.3g of it'
              % (len(got), bpb_o, c['bits_per_byte'], rep['rel_diff_total'], tol_rel, worst))
        for p in problems[:20]:
            print('  ' + p)
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
