"""Per-row flip accounting: the oracle run on cedar's own rounding decisions
where, and only where, they are within the fp32 error bound of a rounding
boundary (README.md, "Flip accounting").

    follow.py CEDAR_DUMP ROUNDINGS --plan P --weights W [--json] [--out O]

CEDAR_DUMP is `cedar run --dump`, ROUNDINGS `cedar run --dump-roundings` of
the same run (runtime/model/round_trace.h).  The oracle (float64) reruns cedar's
tokens (the prompt, then the tokens cedar consumed).  At every point where
the model rounds a value that carries rounding error, or takes a discrete
decision from one, it compares its own result with cedar's:

  bf16 points        residual streams, sublayer inputs, normed inputs, outputs,
                     the decoder sources' a_enc, the head's h and RMSNorm(h);
  MXFP8 inputs       cq, the attention output o, the grouped projection z, the
                     shared expert's SwiGLU hidden (the MXFP8 of an exact,
                     already rounded input is not a decision: it is not traced);
  cache entries      SWA (from the trace), Main-KV and Indexer-K (cedar's dump),
                     the indexer query's MXFP4 round trip;
  selections         MoE experts, indexer Top-K, candidate-pool blocks.

Equal: nothing to do.  Different: the disagreement is *certified* when the
oracle's float64 value x lies within b of the boundary between the two
results, i.e. cedar's result is what the same rounding gives for some x' with
|x' - x| <= b elementwise (for a block format: some scale the block's amax
+- b gives, and each element at that scale); then the oracle takes cedar's
side and counts it.  Any other disagreement fails.  b is the fp32 error bound
of the computation that fed the point, b = K u (|x| + rms(row of x)): u =
2^-24, K = the longest reduction of the forward (compare.kmax; 1024 at
v41-mini), the classical gamma_K bound of a K-term fp32 dot product scaled by
the row's magnitude (every such value is a short chain of normalized dot
products of the row's scale; cedar's measured error is ~sqrt(K) u, 30x less).
For a selection: cedar's set is a top-k of some scores s' with |s' - s| <= b.

Then, with every decision shared, the remaining differences are fp32
arithmetic, and the checks are tight:
  - no uncertified disagreement; no point of either side missing from the other;
  - tokens identical: each token cedar consumed, and its last pick, is the
    oracle's greedy pick (ties to the lower id) of the same row;
  - logits: |cedar - oracle| <= gamma_d sum_k |hn_k| |W_vk| per element
    (d = hidden; hn = the head's rounded RMSNorm output, the same on both
    sides once adopted): the rigorous bound of cedar's fp32 lm_head GEMV;
  - caches: every Main-KV / Indexer-K entry and SWA ring byte identical, the
    ring and tail positions equal (compare.structure).

Exit 0 = agree, 1 = disagree, 2 = usage or unreadable input.
"""
import argparse
import json
import math
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare as CMP  # noqa: E402
import formats as F  # noqa: E402
import oracle as O  # noqa: E402
import plan as P  # noqa: E402
import st as ST  # noqa: E402

U32 = 2.0 ** -24
MXFP8_BLOCK = O.MXFP8_BLOCK
SHOW = 12                # disagreements described in full


class Missing(Exception):
    pass


class Stop(Exception):
    """--stop-at-first: the first disagreement outside the bound ends the run."""


class Trace:
    """cedar's --dump-roundings: (point, layer, position) -> one row."""

    def __init__(self, path):
        f = ST.SafeTensors(path)
        names = f.meta.get('cedar.points', '').split(',')
        self.values, self.bytes = f['values'], f['bytes']
        self.at, self.dups = {}, 0
        for pt, l, p0, rows, cols, kind, off in np.array(f['index']).tolist():
            d = self.at.setdefault((names[pt], l), {})
            for r in range(rows):
                self.dups += (p0 + r) in d
                d[p0 + r] = (kind, off + r * cols, cols)
        self.used = {k: set() for k in self.at}

    def rows(self, pt, l, pos):
        d = self.at.get((pt, int(l)))
        if d is None:
            raise Missing('cedar recorded no %s at layer %d' % (pt, l))
        out = []
        for p in np.asarray(pos).tolist():
            if p not in d:
                raise Missing('cedar recorded no %s at layer %d, position %d' % (pt, l, p))
            kind, off, cols = d[p]
            out.append((self.bytes if kind else self.values)[off:off + cols])
            self.used[(pt, int(l))].add(p)
        return np.array(out)

    def unused(self):
        """Recorded rows the oracle never asked for, but an empty selection
        (all -1: a pool or Top-K over no entries, which the oracle skips)."""
        out = {}
        for k, d in self.at.items():
            n = 0
            for p, (kind, off, cols) in d.items():
                if p not in self.used[k] and not (k[0].startswith('idx.') and
                                                  np.all(self.values[off:off + cols] < 0)):
                    n += 1
            if n:
                out['%s@L%d' % k] = n
        return out


def _rowwise(x):
    """x as (rows, values): a point's rows are its first axis (positions)."""
    return x.reshape(len(x), -1)


class Follow:
    """Oracle.follow: the hooks oracle.py calls at its rounding points."""

    def __init__(self, trace, cedar, beta, stop=False):
        self.t, self.c, self.beta, self.stop = trace, cedar, beta, stop
        self.stats, self.bad = {}, []

    # ---------------------------------------------------------- bookkeeping
    def _st(self, pt):
        return self.stats.setdefault(pt, {'values': 0, 'ambiguous': 0, 'adopted': 0, 'refused': 0,
                                          'max_ratio': 0.0})

    def _refuse(self, pt, l, msg):
        self._st(pt)['refused'] += 1
        if len(self.bad) < SHOW:
            self.bad.append('%s L%d: %s' % (pt, l, msg))
        if self.stop:
            raise Stop(self.bad[-1])

    def _bound(self, x):
        """b = K u (|x| + rms of x's row), elementwise, the shape of x."""
        r = _rowwise(np.asarray(x, np.float64))
        fin = np.where(np.isfinite(r), r, 0.0)
        rms = np.sqrt(np.mean(fin * fin, axis=1, keepdims=True))
        return (self.beta * (np.abs(fin) + rms)).reshape(np.shape(x))

    def _cedar(self, pt, l, pos, shape):
        try:
            return self.t.rows(pt, l, pos).reshape(shape)
        except Missing as e:
            self._refuse(pt, l, str(e))
            return None

    # ---------------------------------------------------------- bf16
    def bf16(self, pt, l, pos, x, r):
        c = self._cedar(pt, l, pos, r.shape)
        if c is None:
            return r
        st = self._st(pt)
        b = self._bound(x)
        lo, hi = O.to_bf16(x - b), O.to_bf16(x + b)
        st['values'] += r.size
        st['ambiguous'] += int((lo != hi).sum())
        diff = ~((c == r) | (np.isnan(c) & np.isnan(r)))
        if not diff.any():
            return r
        ok = (lo <= c) & (c <= hi)
        take = diff & ok
        st['adopted'] += int(take.sum())
        if take.any():   # distance from the boundary (the midpoint of two neighbours) in units of b
            st['max_ratio'] = max(st['max_ratio'], float((np.abs(x - (r + c) / 2) / b)[take].max()))
        for i in zip(*np.nonzero(diff & ~ok)):
            self._refuse(pt, l, 'position %d element %s: oracle %.9g -> %.9g, cedar %.9g, bound %.3g'
                         % (pos[i[0]], i[1:], x[i], r[i], c[i], b[i]))
        return np.where(take, c, r)

    # ---------------------------------------------------------- MXFP8 (E4M3 + E8M0 per 32)
    @staticmethod
    def _mx_scale(amax):
        return np.ldexp(1.0, F.e8m0_floor_byte(np.maximum(amax, O.MXFP8_AMAX_FLOOR) / 448.0) - 127)

    @staticmethod
    def _mx_qdq(x, s):
        return np.sign(x) * F.e4m3_rne_magnitude(np.abs(x) / s) * s

    def mxfp8(self, pt, l, pos, x, r):
        c = self._cedar(pt, l, pos, r.shape)
        if c is None:
            return r
        st = self._st(pt)
        st['values'] += r.size
        diff = ~((c == r) | (np.isnan(c) & np.isnan(r)))
        if not diff.any():
            return r
        W = x.shape[-1]
        nb = -(-W // MXFP8_BLOCK)
        pad = nb * MXFP8_BLOCK - W

        def blocks(v):
            v = _rowwise(v)
            return np.pad(v, ((0, 0), (0, pad))).reshape(len(v), nb, MXFP8_BLOCK)
        xb, cb, b = blocks(x), blocks(c), blocks(self._bound(x))
        alo = np.max(np.maximum(np.abs(xb) - b, 0.0), axis=-1, keepdims=True)
        ahi = np.max(np.abs(xb) + b, axis=-1, keepdims=True)
        ok = np.zeros(xb.shape[:2], bool)
        for s in (self._mx_scale(alo), self._mx_scale(ahi)):
            lo, hi = self._mx_qdq(xb - b, s), self._mx_qdq(xb + b, s)
            ok |= np.all((lo <= cb) & (cb <= hi), axis=-1)
        okx = np.repeat(ok, MXFP8_BLOCK, axis=1)[:, :W].reshape(r.shape)
        take = diff & okx
        st['adopted'] += int(take.sum())
        for i in list(zip(*np.nonzero(diff & ~okx)))[:SHOW]:
            self._refuse(pt, l, 'position %d element %s: oracle %.9g -> %.9g, cedar %.9g'
                         % (pos[i[0]], i[1:], x[i], r[i], c[i]))
        return np.where(okx, c, r)

    # ---------------------------------------------------------- cache formats
    def _entry_ok(self, x, vc, fmt, sc_c=None):
        """Per row of x (rows, W): is vc what fmt's store gives for some x'
        within b of x?  sc_c: cedar's block scales (rows, nb), or None (values
        only: any scale the block's amax +- b gives)."""
        el, sc, B, rule, floor, r16 = F.resolve(fmt)
        n, W = x.shape
        nb = W // B
        b = self._bound(x)
        xl, xh = x - b, x + b
        rnd = F.bf16_round if r16 else (lambda v: np.asarray(v, np.float32).astype(np.float64))
        xl, xh = rnd(xl).reshape(n, nb, B), rnd(xh).reshape(n, nb, B)
        xb, bb = x.reshape(n, nb, B), b.reshape(n, nb, B)
        alo = rnd(np.max(np.maximum(np.abs(xb) - bb, 0.0), axis=-1)).reshape(n, nb, 1)
        ahi = rnd(np.max(np.abs(xb) + bb, axis=-1)).reshape(n, nb, 1)
        slo = F._block_scales(alo, el, sc, rule, floor)[1]
        shi = F._block_scales(ahi, el, sc, rule, floor)[1]
        enc, dec = (F.e2m1_encode, F.e2m1_decode) if el == 'e2m1' else (F.e4m3_encode, F.e4m3_decode)
        vcb = vc.reshape(n, nb, B)

        def elems_ok(s):
            lo = dec(enc(F._quotient(xl, s, sc))) * s[..., None]
            hi = dec(enc(F._quotient(xh, s, sc))) * s[..., None]
            return np.all((lo <= vcb) & (vcb <= hi), axis=-1)
        if sc_c is not None:
            ok = (slo <= sc_c) & (sc_c <= shi) & elems_ok(sc_c)
        else:
            ok = elems_ok(slo) | elems_ok(shi)
        return ok.all(axis=1)

    def store(self, pt, l, pos, x, fmt, nib, bo, vo):
        """A cache entry: cedar's bytes from the trace (SWA, by position) or
        from its dump (Main-KV, Indexer-K: pos = entry indices)."""
        if pt in ('main_kv', 'indexer_k'):
            full = self.c.get('L%d.%s' % (l, pt))
            if full is None or len(full) < int(pos[-1]) + 1:
                self._refuse(pt, l, 'cedar\'s dump lacks entries %d..%d' % (pos[0], pos[-1]))
                return bo, vo
            bc = np.asarray(full[pos])
        else:
            bc = self._cedar(pt, l, pos, bo.shape)
            if bc is None:
                return bo, vo
            bc = bc.astype(np.uint8)
        st = self._st(pt)
        st['values'] += vo.size
        rows = np.any(bc != bo, axis=1)
        if not rows.any():
            return bo, vo
        el, sc, B, _, _, _ = F.resolve(fmt)
        W = x.shape[-1]
        vc = F.unpack(bc, W, fmt, nib)
        payload = W // 2 if el == 'e2m1' else W
        sc_c = F._decode_scales(bc[:, payload:], W // B, sc)
        ok = np.zeros(len(bo), bool)
        ok[rows] = self._entry_ok(np.asarray(x, np.float64)[rows], vc[rows], fmt, sc_c[rows])
        st['adopted'] += int(((vc != vo) & ok[:, None]).sum())
        for i in np.nonzero(rows & ~ok)[0][:SHOW]:
            j = np.nonzero(bc[i] != bo[i])[0]
            self._refuse(pt, l, '%s %d: bytes %s differ (oracle %s, cedar %s)'
                         % ('entry' if pt != 'attn.swa' else 'position', pos[i], j[:6].tolist(),
                            bo[i][j[:6]].tolist(), bc[i][j[:6]].tolist()))
        take = rows & ok
        return np.where(take[:, None], bc, bo), np.where(take[:, None], vc, vo)

    def store_values(self, pt, l, pos, q, fmt, nib):
        """The indexer query's round trip through fmt (values only)."""
        shp = q.shape
        x = q.reshape(-1, shp[-1])
        vo = F.store(x, fmt, nib)[1]
        c = self._cedar(pt, l, pos, shp)
        if c is None:
            return vo.reshape(shp)
        c = c.reshape(x.shape)
        st = self._st(pt)
        st['values'] += vo.size
        rows = np.any(c != vo, axis=1)
        if not rows.any():
            return vo.reshape(shp)
        ok = np.zeros(len(x), bool)
        ok[rows] = self._entry_ok(x[rows], c[rows], fmt)
        st['adopted'] += int(((c != vo) & ok[:, None]).sum())
        for i in np.nonzero(rows & ~ok)[0][:SHOW]:
            self._refuse(pt, l, 'row %d (position %d, head %d) differs' % (i, pos[i // shp[1]], i % shp[1]))
        return np.where(ok[:, None], c, vo).reshape(shp)

    # ---------------------------------------------------------- selections
    def select(self, pt, l, pos, scores, cand, sel):
        c = self._cedar(pt, l, pos, sel.shape)
        if c is None:
            return sel
        c = c.astype(np.int64)
        st = self._st(pt)
        st['values'] += len(sel)
        out = sel.copy()
        for i in range(len(sel)):
            cs, os_ = set(c[i][c[i] >= 0].tolist()), set(sel[i][sel[i] >= 0].tolist())
            if cs == os_:
                continue
            s = np.asarray(scores[i], np.float64)
            m = np.asarray(cand[i], bool)
            fin = np.isfinite(s) & m
            rms = math.sqrt(float(np.mean(s[fin] ** 2))) if fin.any() else 0.0
            b = self.beta * (np.where(np.isfinite(s), np.abs(s), 0.0) + rms)
            inn = np.zeros(len(s), bool)
            idx = np.array(sorted(cs), np.int64)
            valid = len(cs) == len(os_) and len(idx) == (c[i] >= 0).sum() and np.all(idx < len(s)) \
                and np.all(m[idx])
            if valid:
                inn[idx] = True
                low = np.min((s + b)[inn]) if inn.any() else np.inf
                out_ = m & ~inn
                high = np.max((s - b)[out_]) if out_.any() else -np.inf
                valid = low >= high
            if valid:
                st['adopted'] += 1
                out[i] = c[i]
            else:
                gone, new = sorted(os_ - cs)[:4], sorted(cs - os_)[:4]
                self._refuse(pt, l, 'position %d: cedar takes %s (scores %s), the oracle %s (scores %s)'
                             % (pos[i], new, [float('%.6g' % s[j]) for j in new if j < len(s)], gone,
                                [float('%.6g' % s[j]) for j in gone]))
        return out


# ---------------------------------------------------------------- the comparison


def run(cedar_path, trace_path, plan_path, weights, out=None, stop=False):
    """Returns (ok, checks, report dict)."""
    c, _, cdt = CMP.load(cedar_path)
    try:
        trace = Trace(trace_path)
    except (OSError, ST.STError, KeyError, ValueError) as e:
        raise CMP.Usage('%s: %s' % (trace_path, e))
    plan = P.Plan(plan_path)
    K = CMP.kmax(plan)
    beta = K * U32
    S = CMP.n_steps(c)
    N = CMP.prompt_len(c)
    toks = [int(t) for t in c['tokens']]
    orc = O.Oracle(plan_path, weights)
    fol = Follow(trace, c, beta, stop)
    orc.follow = fol
    rep = {'kmax': K, 'beta': beta, 'points': fol.stats}
    try:
        r = orc.prefill(toks[:N])
        dl = [orc.decode(t) for t in toks[N:]]
    except Stop as e:
        return False, [(False, 'decisions', 'stopped at the first disagreement outside the fp32 bound: %s' % e)], rep
    path = out or os.path.join(tempfile.mkdtemp(prefix='follow_'), 'oracle.safetensors')
    O.dump(orc, r, dl, path)
    o, _, odt = CMP.load(path)
    checks = []
    bad = CMP.structure(c, cdt, o, odt)
    checks.append((not bad, 'structure', '; '.join(bad) if bad else 'the same tensors, prompt, ring and tail '
                   'positions'))
    if not bad:     # the final caches, byte for byte (rings in position order)
        diff = [n for n in sorted(o) if n.endswith(('.main_kv', '.indexer_k'))
                and not np.array_equal(c[n], o[n])]
        for l in CMP.layers_of(o, 'swa_pos'):
            k = 'L%d.swa' % l
            if not np.array_equal(c[k][np.argsort(c[k + '_pos'])], o[k][np.argsort(o[k + '_pos'])]):
                diff.append(k)
        checks.append((not diff, 'caches', 'every Main-KV, Indexer-K and ring entry byte-identical' if not diff
                       else 'differ: %s' % diff[:8]))
    refused = sum(v['refused'] for v in fol.stats.values())
    checks.append((refused == 0, 'decisions', '%d disagreement(s) outside the fp32 bound%s' % (
        refused, (': ' + ' | '.join(fol.bad)) if fol.bad else '')))
    unused = trace.unused()
    checks.append((not unused and not trace.dups, 'trace', 'every recorded point used once' if not unused and not
                   trace.dups else 'cedar recorded points the oracle does not have: %s; %d duplicate(s)'
                   % (dict(list(unused.items())[:8]), trace.dups)))
    # tokens: cedar's consumed tokens and its last pick are the oracle's greedy picks
    rows_c, rows_o = CMP.logit_rows(c), CMP.logit_rows(o)
    pc, po = rows_c.argmax(axis=1), rows_o.argmax(axis=1)
    consumed = toks[N:]
    own = [i for i, t in enumerate(consumed) if t != pc[i]]
    diff = [i for i in range(len(pc)) if pc[i] != po[i]]
    checks.append((not own, 'cedar greedy', 'consumed tokens are the argmax of cedar\'s own rows'
                   if not own else 'picks %s are not' % own))
    checks.append((not diff, 'tokens', '%d picks identical: %s' % (len(pc), ' '.join(map(str, pc.tolist())))
                   if not diff else 'picks %s differ: cedar %s, oracle %s' % (diff, pc[diff].tolist(),
                                                                              po[diff].tolist())))
    # logits within the rigorous bound of the lm_head GEMV on the shared hn
    d = plan.model['hidden']
    gamma = d * U32 / (1 - d * U32)
    Wabs = np.abs(orc.w('lm_head'))
    worst, nrows, over = 0.0, 0, []
    sections = [('prefill', c['prefill.positions'], c['prefill.logits'], o['prefill.logits'],
                 o['prefill.positions'])]
    if S:
        sections.append(('decode', np.arange(N, N + S), c['decode.logits'], o['decode.logits'], np.arange(N, N + S)))
    for name, pos_c, lc, lo, pos_o in sections:
        shared, ic, io = np.intersect1d(pos_c, pos_o, return_indices=True)
        hn = trace.rows('head.hn', orc.n_layers, shared) if orc.io_bf16 else None
        if hn is None:
            checks.append((False, 'logits', 'no head.hn in the trace (numerics.sublayer_io f32): no bound'))
            break
        bound = gamma * (np.abs(hn) @ Wabs.T)
        err = np.abs(lc[ic].astype(np.float64) - lo[io])
        ratio = err / np.maximum(bound, 1e-300)
        worst = max(worst, float(ratio.max(initial=0.0)))
        nrows += len(shared)
        over += ['%s position %d' % (name, p) for p in shared[np.any(err > bound, axis=1)]]
    checks.append((not over, 'logits', '%d rows, every element within gamma_%d sum|hn||W| (largest error %.3g of '
                   'its bound)%s' % (nrows, d, worst, '; over it: %s' % over[:6] if over else '')))
    rep.update(logit_bound_ratio=worst, picks=pc.tolist())
    return all(ch[0] for ch in checks), checks, rep


def report_text(checks, rep):
    out = ['flip accounting: bound b = K u (|x| + rms(row)), K = %d, K u = %.3g' % (rep['kmax'], rep['beta']),
           '%-12s %12s %10s %8s %8s %9s' % ('point', 'values', 'ambiguous', 'adopted', 'refused', 'max x/b')]
    for pt in sorted(rep['points']):
        s = rep['points'][pt]
        out.append('%-12s %12d %10s %8d %8d %9.3f' % (pt, s['values'], s['ambiguous'] or '-', s['adopted'],
                                                    s['refused'], s['max_ratio']))
    for ok, what, detail in checks:
        out.append('%s %-13s %s' % ('ok  ' if ok else 'FAIL', what, detail))
    return '\n'.join(out)


def tamper(path, pt, layer, pos, factor):
    """Test hook (tests/cli/oracle_released.sh): multiply the first value of
    cedar's record (pt, layer, pos) in a --dump-roundings file by factor, in
    place (1.0 for a zero): a decision no fp32 error explains."""
    t = Trace(path)
    kind, off, _ = t.at[(pt, layer)][pos]
    if kind:
        raise CMP.Usage('%s is a byte record' % pt)
    f = ST.SafeTensors(path)
    begin = f.base + f.entries['values'][2] + 4 * off
    v = float(t.values[off])
    del t, f
    with open(path, 'r+b') as fh:
        fh.seek(begin)
        fh.write(np.array([v * factor if v else 1.0], '<f4').tobytes())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('cedar_dump')
    ap.add_argument('roundings')
    ap.add_argument('--plan', required=True)
    ap.add_argument('--weights', required=True, help='the weights both ran on (oracle layout)')
    ap.add_argument('--out', help='also write the followed oracle\'s dump here')
    ap.add_argument('--json', action='store_true')
    ap.add_argument('--stop-at-first', action='store_true', help='end at the first disagreement outside the bound')
    ap.add_argument('--tamper', nargs=4, metavar=('POINT', 'LAYER', 'POS', 'FACTOR'),
                    help='test hook: change one recorded value of ROUNDINGS in place, then exit')
    a = ap.parse_args(argv)
    if a.tamper:
        tamper(a.roundings, a.tamper[0], int(a.tamper[1]), int(a.tamper[2]), float(a.tamper[3]))
        return 0
    try:
        ok, checks, rep = run(a.cedar_dump, a.roundings, a.plan, a.weights, a.out, a.stop_at_first)
    except CMP.Usage as e:
        print('follow.py: %s' % e, file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(CMP._plain({'ok': ok, 'checks': [{'ok': c[0], 'what': c[1], 'detail': c[2]} for c in checks],
                                     **rep}), indent=1))
    else:
        print(report_text(checks, rep))
        print('follow.py: %s' % ('cedar agrees with the oracle, decision for decision' if ok else 'DISAGREEMENT'))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
