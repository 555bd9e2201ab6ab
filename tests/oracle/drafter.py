"""The DSpark drafter (Appendix V #24) in NumPy, for comparing cedar's draft
block with it (tests/cli/oracle_mtp.sh).

Written from ../shared/SPEC-V41.md (Appendix V #24, "Checkpoint layout",
config.json's dspark_*) and the readings runtime/model/mtp.h's header states in
words where #24 is terse (positions of the draft rows, the window of main
rows, keys through the SWA storage format, the confidence read raw); not
from cedar's C code.  Float64 throughout, the oracle's storage and
numerics points (oracle.py) where the drafter has them.

    draft = Drafter(oracle)                     # an Oracle built with capture=True (Capture)
    out = draft.block(rows, rpos, y0, P, tokens=None, sigma=0, rng=None)

  rows (n, T, d): the mean over the streams of the state entering each target
      layer (after Engram) at the committed positions rpos = [P - n, P);
  main_j = RMSNorm(mtp.0.main_proj . cat_t rows[j, t]; mtp.0.main_norm);
  draft rows: ids [y0, noise x (B - 1)] at positions P .. P + B - 1, the
      embedding in every stream, the one-hot pre (#2);
  blocks mtp.0..: mHC-wrapped attention over keys = main rows and draft rows
      through the block's wkv / kv_norm, RoPE (model.rope.swa) at their
      positions, stored in formats.swa, no mask; then the block's own MoE
      (dspark.routed_experts, top dspark.active_experts, + shared);
  x_i = the streams collapsed with the last FFN's pre; base_i = lm_head .
      RMSNorm(x_i; mtp.{last}.norm); logits_i = base_i + markov.head .
      markov.embed[d_i] with d_0 = y0 and d_{i+1} = argmax logits_i (greedy;
      with `tokens` the Markov inputs are cedar's drafts: teacher forcing);
  conf_i = confidence_head.proj . [x_i, markov.embed[d_i]] (no bias, no sigmoid).

sigma > 0 multiplies every op-boundary value by (1 + sigma z), z ~ N(0, 1)
(compare.py's perturbed reruns, for the tolerances).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import formats as F  # noqa: E402
import oracle as O  # noqa: E402


class Capture(O.Oracle):
    """The oracle, recording mean_i X_i of the state entering each DSpark
    target layer (after Engram) for every position a forward runs."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.ds = O.dspark(self.m)
        self.targets = [int(t) for t in self.ds['target_layers']]
        self.cap = {}

    def _run_layers(self, X, P, pos, layers, fw):
        for l in layers:
            if self.plan.layers[l]['engram']:
                X = self._engram(l, X, pos)
            if l in self.targets:
                mean = X.mean(axis=1)
                for i, p in enumerate(pos):
                    self.cap.setdefault(int(p), {})[l] = mean[i].copy()
            X, P = self._sublayer(X, P, 'layers.%d.hc_attn' % l, 'layers.%d.attn_norm' % l,
                                  lambda a, l=l: self._attention(l, a, pos, fw))
            X, P = self._sublayer(X, P, 'layers.%d.hc_ffn' % l, 'layers.%d.ffn_norm' % l,
                                  lambda x, l=l: self._moe(l, x))
            self.token_layers[l] += len(pos)
        return X, P

    def rows(self, lo, P):
        """(n, T, d) captured rows of positions [lo, P)."""
        return np.stack([np.stack([self.cap[p][t] for t in self.targets]) for p in range(lo, P)])


class Drafter:
    def __init__(self, o):
        self.o = o
        self.ds = O.dspark(o.m)
        self.B = int(self.ds['draft'])
        self.nb = int(self.ds['blocks'])
        self.noise = int(self.ds['noise_token'])
        self.k_active = int(self.ds['active_experts'])
        self.window = int(self.ds['window'])

    # perturbation (sigma = 0: none)
    def _p(self, x):
        if not self.sigma:
            return x
        return x * (1.0 + self.sigma * self.rng.standard_normal(np.shape(x)))

    def _w(self, k, name):
        return self.o.w('mtp.%d.%s' % (k, name))

    def _attention(self, k, a, main, mpos, dpos):
        o = self.o
        B, H, dh = len(dpos), o.H, o.dh
        fr = o.freqs['swa']                                   # window-only: model.rope.swa
        aq = o._lin(a)
        cq = o._lin(self._p(O.rms(aq @ self._w(k, 'attn.wq_a').T, self._w(k, 'attn.q_norm'), o.eps)))
        q = self._p(O.rope((cq @ self._w(k, 'attn.wq_b').T).reshape(B, H, dh), dpos, fr, o.rd, 'last'))
        kd = O.rope(O.rms(aq @ self._w(k, 'attn.wkv').T, self._w(k, 'attn.kv_norm'), o.eps), dpos, fr, o.rd, 'last')
        keys = kd
        if len(mpos):
            km = O.rope(O.rms(o._lin(main) @ self._w(k, 'attn.wkv').T, self._w(k, 'attn.kv_norm'), o.eps),
                        mpos, fr, o.rd, 'last')
            keys = np.concatenate([km, kd])
        Kv = F.store(self._p(keys), o.fmt['swa'], o.nib)[1]    # the window's storage format
        z = np.matmul(q * o.scale, Kv.T)                      # (B, H, nk): every draft row sees every key
        m = z.max(axis=2)
        sink = self._w(k, 'attn.sink') if o.sink else None
        if sink is not None:
            m = np.maximum(m, sink[None, :])
        e = np.exp(z - m[:, :, None])
        Z = e.sum(axis=2) + (np.exp(sink[None, :] - m) if sink is not None else 0.0)
        out = self._p(np.matmul(e, Kv) / Z[:, :, None])
        out = O.rope(out, dpos, fr, o.rd, 'last', inverse=True)
        og = o._lin(out.reshape(B, H * dh)).reshape(B, o.G, H * dh // o.G)
        zz = self._p(np.einsum('pgk,gok->pgo', og, self._w(k, 'attn.wo_a')).reshape(B, -1))
        return self._p(o._lin(zz) @ self._w(k, 'attn.wo_b').T)

    def _moe(self, k, x):
        o = self.o
        mo = o.m['moe']
        logits = self._p(x @ self._w(k, 'ffn.gate').T)
        sf = mo.get('score', 'sqrtsoftplus')
        s = (np.sqrt(np.logaddexp(0.0, logits)) if sf == 'sqrtsoftplus' else
             O.softmax(logits, axis=-1) if sf == 'softmax' else O.sigmoid(logits))
        sel = np.argsort(-(s + self._w(k, 'ffn.bias')[0]), axis=1, kind='stable')[:, :self.k_active]
        ws = np.take_along_axis(s, sel, axis=1)
        if mo.get('norm_topk', True):
            ws = ws / ws.sum(axis=1, keepdims=True)
        ws = ws * float(mo['route_scale'])
        lim = float(mo.get('swiglu_limit', 0) or 0)

        def ffn(xx, wg, wu, wd, scale=None, q=lambda v: v):
            xx = q(xx)
            g, u = self._p(xx @ wg.T), self._p(xx @ wu.T)
            if lim > 0:
                g, u = np.minimum(g, lim), np.clip(u, -lim, lim)
            h = O.silu(g) * u
            if scale is not None:
                h = h * scale[:, None]
            return self._p(q(h) @ wd.T)

        y = np.zeros_like(x)
        if mo['shared_experts'] > 0:
            y += ffn(x, self._w(k, 'ffn.shared.w_gate'), self._w(k, 'ffn.shared.w_up'), self._w(k, 'ffn.shared.w_down'),
                     q=o._lin)
        pf = 'mtp.%d.ffn.experts.' % k
        WG, WU, WD = o.w.raw(pf + 'w_gate'), o.w.raw(pf + 'w_up'), o.w.raw(pf + 'w_down')
        for e in np.unique(sel):
            rows, slot = np.nonzero(sel == e)
            y[rows] += ffn(x[rows], WG[e].astype(np.float64), WU[e].astype(np.float64), WD[e].astype(np.float64),
                           ws[rows, slot])
        return y

    def block(self, rows, rpos, y0, P, tokens=None, sigma=0.0, rng=None):
        """One draft block (module docstring). Returns dict: logits (B, V),
        conf (B), tokens (B) (the oracle's greedy picks of its rows), x (B, d)."""
        o = self.o
        self.sigma, self.rng = sigma, rng
        B, d, hc = self.B, o.d, o.hc
        n = len(rpos)
        mpos = np.asarray(rpos, np.int64)
        dpos = P + np.arange(B, dtype=np.int64)
        main = np.zeros((0, d))
        if n:
            cat = o._lin(np.asarray(rows, np.float64).reshape(n, -1))       # main_proj is FP8
            main = o._rio(self._p(O.rms(cat @ self.o.w('mtp.0.main_proj').T, self.o.w('mtp.0.main_norm'), o.eps)))
        ids = [int(y0)] + [self.noise] * (B - 1)
        X = o._embed(ids)
        Pc = o._onehot(B)
        for k in range(self.nb):
            X, Pc = o._sublayer(X, Pc, 'mtp.%d.hc_attn' % k, 'mtp.%d.attn_norm' % k,
                                lambda a, k=k: self._attention(k, a, main, mpos, dpos))
            X = self._p(X)
            X, Pc = o._sublayer(X, Pc, 'mtp.%d.hc_ffn' % k, 'mtp.%d.ffn_norm' % k,
                                lambda x, k=k: self._moe(k, x))
            X = self._p(X)
        last = 'mtp.%d.' % (self.nb - 1)
        h = o._rio(np.matmul(Pc[:, None, :], X)[:, 0])
        base = self._p(o._rio(O.rms(h, o.w(last + 'norm'), o.eps)) @ o.w('lm_head').T)
        E, U = o.w(last + 'markov_head.embed'), o.w(last + 'markov_head.head')
        logits, picks, conf = np.zeros_like(base), [], np.zeros(B)
        prev = int(y0)
        wc = o.w(last + 'confidence_head.proj')[0]
        for i in range(B):
            logits[i] = base[i] + self._p(U @ E[prev])
            conf[i] = self._p(np.dot(wc, np.concatenate([h[i], E[prev]])))
            picks.append(int(np.argmax(logits[i])))
            prev = picks[-1] if tokens is None else int(tokens[i])
        return {'logits': logits, 'conf': conf, 'tokens': np.asarray(picks, np.int64), 'x': h}


# ---------------------------------------------------------------- comparison with cedar

U32 = 2.0 ** -24   # unit roundoff of float32
FACTOR = 1.5       # as compare.py: how far beyond the perturbed runs' spread cedar may go
RUNS = 4
_RUNS = {}         # the oracle's target run per dump


def compare(plan, weights, dump, steps, inject=None, verbose=True):
    """cedar's draft block (test_mtp --dump) against the oracle. Returns the
    list of failures (empty: agree)."""
    import st as ST
    f = ST.SafeTensors(dump)
    d = {n: np.array(f[n]) for n in f.names}
    if inject == 'logits':
        d['draft.logits'][1] *= 1.01
    elif inject == 'conf':
        d['draft.conf'][2] += 1e-3 * max(1.0, abs(float(d['draft.conf'][2])))
    elif inject == 'capture':      # the state after the first target layer instead of entering it
        d['capture.rows'][:, 0] = d['capture.rows'][:, 1]
    toks = [int(t) for t in d['tokens']]
    P = len(toks) - 1
    N = P - steps
    key = (plan, weights, tuple(toks), steps)
    if key not in _RUNS:                # the target once per dump (--self-test judges four dumps)
        o = Capture(plan, weights)
        tnotes = []
        r = o.prefill(toks[:N])
        lg = r.last
        for i in range(steps + 1):        # the target's greedy picks against cedar's consumed ids (reported)
            if int(np.argmax(lg)) != toks[N + i]:
                tnotes.append('target pick %d: oracle %d, cedar %d (top-2 gap %.3g)' %
                              (i, int(np.argmax(lg)), toks[N + i], float(np.diff(np.sort(lg)[-2:])[0])))
            if i < steps:
                lg = o.decode(toks[N + i])  # teacher-forced on cedar's ids
        _RUNS[key] = (o, tnotes)
    o, tnotes = _RUNS[key]
    dr = Drafter(o)
    fails, notes = [], list(tnotes)
    # 1. the capture: cedar's rows against the oracle's own (teacher-forced on
    # cedar's ids), per row and target layer the relative RMS difference.
    # What it checks is that cedar captured the right state (entering the
    # right layer, after Engram, mean over the streams, at the right position);
    # the target's own fp32 fidelity is cli_oracle_run's. A few rows carry the
    # target's discrete flips (routing, Top-K, FP8/FP4 codes: compare.py's jump
    # rows), so the statistic is the median over the window per target layer.
    # Tolerance [derived from the model]: half the smallest structural error,
    # one layer's update: the median relative RMS between the states entering
    # consecutive target layers in the oracle. (A row off by one position
    # differs by O(1).)
    rpos = [int(p) for p in d['capture.pos']]
    if rpos != list(range(P - len(rpos), P)):
        fails.append('capture positions are not the window before %d: %s..%s' % (P, rpos[:1], rpos[-1:]))
    T = len(dr.ds['target_layers'])
    ref_rows = o.rows(rpos[0], P) if rpos else np.zeros((0, T, o.d))
    crow = d['capture.rows'].astype(np.float64)

    def rel_rms(a, b):
        return np.sqrt(np.mean((a - b) ** 2, axis=-1)) / np.sqrt(np.mean(b ** 2, axis=-1))

    rel = np.median(rel_rms(crow, ref_rows), axis=0) if rpos else np.zeros(T)
    step = float(np.median(rel_rms(ref_rows[:, 1:], ref_rows[:, :-1]))) if T > 1 and rpos else 1.0
    bound = 0.5 * step
    for t in range(T):
        if not rel[t] <= bound:
            fails.append('captured rows of target layer %d: median relative RMS difference %.3g > %.3g (half of '
                         'one layer\'s update, %.3g)' % (dr.ds['target_layers'][t], rel[t], bound, step))
    m = o.m
    hc = o.hc
    # 2. the draft block on cedar's rows (the same inputs), teacher-forced on cedar's drafts
    ctok = [int(t) for t in d['draft.tokens']]
    y0 = toks[P]
    ref = dr.block(crow, rpos, y0, P, tokens=ctok)
    at = m['attention']
    hid = o.d
    Kd = max(hc * hid, len(dr.ds['target_layers']) * hid, hid + int(dr.ds['markov_rank']), m['moe']['inter_dim'],
             m['moe']['shared_inter_dim'], at['q_rank'], at['heads'] * at['head_dim'] // at['o_groups'])
    sigma = Kd * U32
    rng = np.random.default_rng(24)
    runs = [dr.block(crow, rpos, y0, P, tokens=ctok, sigma=sigma, rng=rng) for _ in range(RUNS)]
    for key in ('logits', 'x'):
        spread = np.max([np.max(np.abs(x[key] - ref[key]), axis=1) for x in runs], axis=0)
        err = np.max(np.abs(d['draft.' + key].astype(np.float64) - ref[key]), axis=1)
        for i in range(dr.B):
            ok = err[i] <= FACTOR * spread[i]
            if verbose:
                print('draft %s row %d: |cedar - oracle| %.3g, tolerance %.3g (%.2f of it)' %
                      (key, i, err[i], FACTOR * spread[i], err[i] / (FACTOR * spread[i])))
            if not ok:
                fails.append('draft %s row %d: %.3g > tolerance %.3g' % (key, i, err[i], FACTOR * spread[i]))
        if key == 'logits':
            tol_l = FACTOR * spread
    spread = np.max([np.abs(x['conf'] - ref['conf']) for x in runs], axis=0)
    err = np.abs(d['draft.conf'].astype(np.float64) - ref['conf'])
    for i in range(dr.B):
        if verbose:
            print('draft conf %d: cedar %.6g oracle %.6g, |diff| %.3g, tolerance %.3g' %
                  (i, float(d['draft.conf'][i]), ref['conf'][i], err[i], FACTOR * spread[i]))
        if not err[i] <= FACTOR * spread[i]:
            fails.append('draft conf %d: %.3g > tolerance %.3g' % (i, err[i], FACTOR * spread[i]))
    for i in range(dr.B):              # greedy picks, except at a near tie (within twice the row's tolerance)
        s = np.sort(ref['logits'][i])
        if ref['tokens'][i] != ctok[i]:
            if s[-1] - s[-2] <= 2 * tol_l[i]:
                notes.append('draft %d: near tie (gap %.3g), oracle %d, cedar %d' % (i, s[-1] - s[-2], ref['tokens'][i], ctok[i]))
            else:
                fails.append('draft %d: oracle picks %d, cedar %d (gap %.3g)' % (i, ref['tokens'][i], ctok[i], s[-1] - s[-2]))
    # 3. reported, not judged: the oracle's drafter on its own capture (the whole chain)
    own = dr.block(ref_rows, rpos, y0, P)
    notes.append('whole chain (oracle capture + oracle drafter): drafts %s vs cedar %s, max |logit diff| %.3g' %
                 (list(own['tokens']), ctok, float(np.max(np.abs(own['logits'] - d['draft.logits'])))))
    if verbose:
        print('capture rows: %d positions, median relative RMS difference per target layer %s (tolerance %.3g, '
              'half of one layer\'s update %.3g)' % (len(rpos), ' '.join('%.3g' % x for x in rel), bound, step))
        for n_ in notes:
            print('note: ' + n_)
    return fails


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description='compare cedar\'s DSpark draft block with the oracle')
    ap.add_argument('plan')
    ap.add_argument('weights')
    ap.add_argument('dump', help='test_mtp --dump output')
    ap.add_argument('--steps', type=int, required=True, help='decode steps before the draft (as --dump)')
    ap.add_argument('--self-test', action='store_true',
                    help='also judge the dump corrupted three ways (a draft logit row x 1.01, a confidence + 1e-3, '
                         'the first target\'s rows taken after it): each must be refused')
    a = ap.parse_args(argv)
    fails = compare(a.plan, a.weights, a.dump, a.steps)
    for x in fails:
        print('FAIL: ' + x)
    print('drafter: %s' % ('agree' if not fails else 'DISAGREE (%d)' % len(fails)))
    bad = bool(fails)
    for inj in (('logits', 'conf', 'capture') if a.self_test else ()):
        f2 = compare(a.plan, a.weights, a.dump, a.steps, inj, verbose=False)
        print('self-test %s: %s' % (inj, 'refused (%s)' % f2[0] if f2 else 'ACCEPTED'))
        bad |= not f2
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
