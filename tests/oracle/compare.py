"""Compare `cedar run --dump` with the oracle's `--out`, to tolerances the
model itself gives (README.md, "Comparing cedar with the oracle").

    compare.py CEDAR_DUMP ORACLE_DUMP --weights W [--plan P] [--json] [--work DIR]
    compare.py --self-test --weights W [--oracle-dump O] [--plan P] [--work DIR]

What it checks:
  1. structure: every tensor the oracle wrote is in cedar's dump with the same
     shape and dtype (logits may be F32), the same prompt, the same SWA ring
     positions and compressor tail positions;
  2. greedy tokens: cedar's consumed tokens are the greedy picks of its own
     logits, and equal the oracle's, except at a step whose oracle top-2 gap
     is within twice that step's tolerance (a near tie: reported, and then the
     reference oracle is rerun on cedar's tokens so every step still counts);
  3. logits: the rows both have (prefill by position, decode by step);
  4. caches (SWA rings, Main-KV, Indexer-K): per layer, how many FP8 / FP4
     codes differ and the RMS difference of the decoded values.

The tolerances come from the oracle itself: it is rerun RUNS times on the
same weights and tokens with every op-boundary value multiplied by
(1 + sigma z), z ~ N(0, 1), sigma = K u (u = 2^-24, K the longest reduction:
the worst-case relative error of a K-term fp32 dot product), and every
quantity may exceed the spread of those runs by FACTOR at most.  Derivation
and measurements: README.md.  Reruns are kept in --work DIR and reused.

This file does not run cedar (tests/cli/oracle_run.sh does) and does not test
the oracle (test_oracle_self.py does).  Exit 0 = agree, 1 = disagree, 2 =
usage or unreadable input.
"""
import argparse
import hashlib
import json
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import formats as F  # noqa: E402
import oracle as O  # noqa: E402
import plan as P  # noqa: E402
import st as ST  # noqa: E402

U32 = 2.0 ** -24        # unit roundoff of float32
FACTOR = 1.5            # how far beyond the perturbed runs' spread cedar may go (README.md)
RUNS = 4                # perturbed oracle runs
P_BUDGET = 0.999        # quantile of the jump-row count (README.md)
KINDS = ('swa', 'main_kv', 'indexer_k')


class Usage(Exception):
    pass


# ---------------------------------------------------------------- dumps


def load(path):
    """({name: ndarray}, metadata, {name: dtype}) of a dump."""
    try:
        f = ST.SafeTensors(path)
    except (OSError, ST.STError, ValueError) as e:
        raise Usage('%s: %s' % (path, e))
    return {n: np.array(f[n]) for n in f.names}, dict(f.meta), {n: f.dtype(n) for n in f.names}


def n_steps(d):
    return len(d['decode.logits']) if 'decode.logits' in d else 0


def prompt_len(d):
    """N: `tokens` holds the prompt and then the S tokens decode consumed."""
    return len(d['tokens']) - n_steps(d)


def logit_rows(d):
    """The rows that pick the generated tokens: the last prefill row, then one
    per decode step (the last pick is not in `tokens`)."""
    rows = [d['prefill.logits'][-1:]] + ([d['decode.logits']] if n_steps(d) else [])
    return np.concatenate(rows).astype(np.float64)


def margins(rows):
    s = np.sort(np.asarray(rows, np.float64), axis=-1)
    return s[..., -1] - s[..., -2]


def layers_of(d, suffix):
    return sorted(int(n[1:].split('.')[0]) for n in d if n.endswith('.' + suffix))


# ---------------------------------------------------------------- cache codes


def codes_of(b, fmt, W, nibble):
    """Signed ordinals of an entry's element codes (neighbouring representable
    values differ by 1; +0 and -0 are both 0) and its scales."""
    b = np.asarray(b, np.uint8)
    if fmt['element'] == 'e2m1':
        c = F._unpack_nibbles(b[:, :W // 2], nibble).astype(np.int64)
        mag, neg, sb = c & 7, c >> 3, b[:, W // 2:]
        s = F.e4m3_decode(sb) if fmt['scale'] == 'e4m3' else F.e8m0_decode(sb)
    elif fmt['element'] == 'e4m3':
        c = b[:, :W].astype(np.int64)
        mag, neg = c & 0x7F, c >> 7
        s = (np.ascontiguousarray(b[:, W:]).view('<f4').astype(np.float64) if fmt['scale'] == 'f32'
             else F.e8m0_decode(b[:, W:]))
    else:
        raise Usage('cache element %r: compare.py reads e2m1 and e4m3 entries' % fmt['element'])
    return np.where(neg == 1, -mag, mag), s


def cache_stats(bc, bo, fmt, W, nibble):
    """How two caches of equal shape (entries, bytes) differ."""
    st = {'entries': int(len(bo)), 'codes': 0, 'flips': 0, 'flip_frac': 0.0, 'far': 0,
          'scale_diffs': 0, 'rel': 0.0}
    if len(bo) == 0:
        return st
    oc, sc = codes_of(bc, fmt, W, nibble)
    oo, so = codes_of(bo, fmt, W, nibble)
    vc, vo = F.unpack(bc, W, fmt, nibble), F.unpack(bo, W, fmt, nibble)
    den = math.sqrt(float(np.mean(vo * vo)))
    st.update(codes=int(oo.size), flips=int((oc != oo).sum()), far=int((np.abs(oc - oo) > 1).sum()),
              scale_diffs=int((sc != so).sum()))
    st['flip_frac'] = st['flips'] / st['codes']
    st['rel'] = (math.sqrt(float(np.mean((vc - vo) ** 2))) / den if den > 0 else float(np.any(vc != vo)))
    if not np.all(np.isfinite(vc)):
        st['rel'] = float('inf')
    return st


# ---------------------------------------------------------------- one comparison


def structure(c, cdt, o, odt):
    """Problems that make the two dumps incomparable (a list of strings)."""
    bad = []
    for n in sorted(o):
        if n not in c:
            bad.append('missing tensor %s %s %s' % (n, odt[n], list(o[n].shape)))
            continue
        want = ('F32', 'F64') if odt[n] == 'F64' else (odt[n],)
        if cdt[n] not in want:
            bad.append('%s: dtype %s, expected %s' % (n, cdt[n], ' or '.join(want)))
        if n == 'prefill.logits':
            if c[n].ndim != 2 or c[n].shape[1] != o[n].shape[1] or len(c[n]) != len(c['prefill.positions']):
                bad.append('%s: shape %s (rows must match prefill.positions, columns the vocab %d)'
                           % (n, list(c[n].shape), o[n].shape[1]))
        elif n != 'prefill.positions' and c[n].shape != o[n].shape:
            bad.append('%s: shape %s, the oracle has %s' % (n, list(c[n].shape), list(o[n].shape)))
    if bad:
        return bad
    N = prompt_len(o)
    if not np.array_equal(c['tokens'][:N], o['tokens'][:N]):
        bad.append('the prompts differ')
    if N - 1 not in c['prefill.positions']:
        bad.append('prefill.positions: no row for the last prompt position %d' % (N - 1))
    pos = c['prefill.positions']
    if np.any(np.diff(pos) <= 0) or not np.all(np.isin(pos, np.arange(N))):
        bad.append('prefill.positions must be increasing prompt positions')
    for l in layers_of(o, 'swa_pos'):
        k = 'L%d.swa_pos' % l
        if not np.array_equal(np.sort(c[k]), np.sort(o[k])):
            bad.append('%s: ring positions %s.. differ from the oracle\'s %s..'
                       % (k, np.sort(c[k])[:4].tolist(), np.sort(o[k])[:4].tolist()))
    for l in layers_of(o, 'tail_pos'):
        k = 'L%d.tail_pos' % l
        if not np.array_equal(c[k], o[k]):
            bad.append('%s: %s, the oracle has %s' % (k, c[k].tolist(), o[k].tolist()))
    return bad


def measure(c, o, plan):
    """How dump c differs from the reference o (numbers, no verdicts).  The
    two must have passed structure() and consumed the same tokens."""
    N, S = prompt_len(o), n_steps(o)
    shared, ic, io = np.intersect1d(c['prefill.positions'], o['prefill.positions'],
                                    return_indices=True)
    m = {'prefill': {'positions': shared,
                     'err': np.abs(c['prefill.logits'][ic].astype(np.float64)
                                   - o['prefill.logits'][io]).max(axis=1)}}
    dc = c['decode.logits'].astype(np.float64) if S else np.zeros((0, 1))
    m['decode'] = {'err': np.abs(dc - o['decode.logits']).max(axis=1) if S else np.zeros(0)}
    gc, go = logit_rows(c).argmax(axis=1), logit_rows(o).argmax(axis=1)
    m['tokens'] = {'cedar': gc.tolist(), 'oracle': go.tolist(),
                   'differ': [int(i) for i in np.nonzero(gc != go)[0]],
                   'consumed': [int(t) for t in c['tokens'][N:]]}
    nib = plan.formats.get('nibble', 'low_first')
    at = plan.model['attention']
    width = {'swa': at['head_dim'], 'main_kv': at['head_dim'], 'indexer_k': plan.model['indexer']['head_dim']}
    cache = {}
    for l in layers_of(o, 'swa_pos'):
        k = 'L%d.swa' % l
        sc, so = np.argsort(c[k + '_pos']), np.argsort(o[k + '_pos'])
        cache[k] = cache_stats(c[k][sc], o[k][so], plan.formats['swa'], width['swa'], nib)
    for l in layers_of(o, 'main_kv'):
        for kind in ('main_kv', 'indexer_k'):
            k = 'L%d.%s' % (l, kind)
            cache[k] = cache_stats(c[k], o[k], plan.formats[kind], width[kind], nib)
    m['cache'] = cache
    return m


# ---------------------------------------------------------------- the oracle, rerun


def kmax(plan):
    """The longest reduction that feeds one op boundary of the forward."""
    m = plan.model
    at, mo, e = m['attention'], m['moe'], m['engram']
    return max(m['mhc']['streams'] * m['hidden'], plan.window + int(m['indexer']['topk']) + 1,
               at['heads'] * at['head_dim'] // at['o_groups'], at['o_groups'] * at['o_rank'],
               at['q_rank'], mo['inter_dim'], mo['shared_inter_dim'], m['hidden'],
               len(e['orders']) * e['heads'] * e['head_dim'])


# The op boundaries: the outputs of these module functions and Oracle methods.
_FUNCS = ('rms', 'softmax', 'sigmoid', 'silu', 'rope')
_METHODS = ('_hc_mix', 'index_scores', '_attention', '_moe', '_engram', '_logits', '_sublayer')


def oracle_dump(plan_path, weights, tokens, n_prompt, out, sigma=None, seed=0, steps=0,
                opts=None, tweak=None):
    """Run the oracle on tokens[:n_prompt], decode consuming the rest of tokens
    (forced, not its own picks), then `steps` more steps on its own greedy
    picks; write its dump to out.  sigma: None = the
    oracle as it is, 'round' = every op-boundary value rounded to float32, a
    number = every such value x replaced by x (1 + sigma z), z ~ N(0, 1).
    opts go to Oracle(); tweak = (attribute, value) is set on it before it runs."""
    rng = np.random.default_rng(seed)

    def pert(x):
        if isinstance(x, tuple):                   # _sublayer: (new state, old state)
            return (pert(x[0]),) + x[1:]
        if not isinstance(x, np.ndarray) or x.dtype != np.float64:
            return x
        if sigma == 'round':
            return x.astype(np.float32).astype(np.float64)
        return x * (1.0 + sigma * rng.standard_normal(x.shape))

    def wrap(f):
        return lambda *a, **k: pert(f(*a, **k))

    saved = [] if sigma is None else ([(O, n, getattr(O, n)) for n in _FUNCS] +
                                      [(O.Oracle, n, getattr(O.Oracle, n)) for n in _METHODS])
    try:
        for owner, n, f in saved:
            setattr(owner, n, wrap(f))
        orc = O.Oracle(plan_path, weights, **(opts or {}))
        if tweak:
            setattr(orc, *tweak)
        r = orc.prefill([int(t) for t in tokens[:n_prompt]])
        dl = [orc.decode(int(t)) for t in tokens[n_prompt:]]
        for _ in range(steps):
            dl.append(orc.decode(orc.greedy(dl[-1] if dl else r.last)))
    finally:
        for owner, n, f in saved:
            setattr(owner, n, f)
    O.dump(orc, r, dl, out)
    return out


def cache_path(work, plan_path, weights, tokens, n_prompt, sigma, seed):
    key = hashlib.sha256(repr((os.path.abspath(plan_path), os.path.abspath(weights),
                               os.path.getmtime(weights), [int(t) for t in tokens], n_prompt,
                               sigma, seed)).encode()).hexdigest()[:16]
    return os.path.join(work, 'oracle-%s.safetensors' % key)


def cached_run(work, plan_path, weights, tokens, n_prompt, sigma, seed):
    """oracle_dump() (forced on tokens) kept in work/, named by everything that
    determines it, and reused."""
    out = cache_path(work, plan_path, weights, tokens, n_prompt, sigma, seed)
    if not os.path.exists(out):
        oracle_dump(plan_path, weights, tokens, n_prompt, out + '.part', sigma, seed)
        os.replace(out + '.part', out)
    return out


def run_all(jobs):
    """[fn(*args, **kwargs)] for jobs of (fn, args, kwargs), on every CPU."""
    n = min(len(jobs), os.cpu_count() or 1)
    if n <= 1:
        return [fn(*a, **k) for fn, a, k in jobs]
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context('fork')) as ex:
        futures = [ex.submit(fn, *a, **k) for fn, a, k in jobs]
        return [f.result() for f in futures]


def poisson_quantile(mu, p):
    k, term = 0, math.exp(-mu)
    cdf = term
    while cdf < p:
        k += 1
        term *= mu / k
        cdf += term
    return k


def calibrate(ref, plan_path, weights, work, runs=RUNS, factor=FACTOR, log=None):
    """The tolerances: the spread of RUNS perturbed oracle runs around ref."""
    plan = P.Plan(plan_path)
    sigma = kmax(plan) * U32
    members = []
    paths = run_all([(cached_run, (work, plan_path, weights, ref['tokens'], prompt_len(ref), sigma,
                                   1000 + k), {}) for k in range(runs)])
    for k, path in enumerate(paths):
        members.append(measure(load(path)[0], ref, plan))
        if log:
            log('perturbed oracle %d/%d: prefill max %.3g, decode max %.3g'
                % (k + 1, runs, members[-1]['prefill']['err'].max(),
                   members[-1]['decode']['err'].max() if n_steps(ref) else 0))
    env = {'runs': runs, 'sigma': sigma, 'kmax': kmax(plan), 'factor': factor}
    jumps = rows = 0
    for part in ('prefill', 'decode'):
        E = np.array([mm[part]['err'] for mm in members])              # (runs, rows)
        if E.shape[1] == 0:
            env[part] = {'tol': 0.0, 'row': np.zeros(0), 'jumps': []}
            continue
        tol = factor * float(np.median(E, axis=1).max())
        env[part] = {'tol': tol, 'row': E.max(axis=0), 'jumps': (E > tol).sum(axis=1).tolist()}
        jumps, rows = jumps + int((E > tol).sum()), rows + E.size
    env['jump_rate'] = (jumps + 1.0) / max(rows, 1)                     # per row, add-one
    env['ceiling'] = factor * max(float(env[p]['row'].max(initial=0.0)) for p in ('prefill', 'decode'))
    for kind in KINDS:
        ks = [k for k in members[0]['cache'] if k.endswith('.' + kind)]
        lay = {k: max(mm['cache'][k]['flip_frac'] for mm in members) for k in ks}
        floor = float(np.median(list(lay.values()))) if ks else 0.0
        env[kind] = {
            'flip_frac': factor * max((sum(mm['cache'][k]['flips'] for k in ks) /
                                       max(1, sum(mm['cache'][k]['codes'] for k in ks)))
                                      for mm in members) if ks else 0.0,
            'rel': factor * max((mm['cache'][k]['rel'] for mm in members for k in ks), default=0.0),
            'layer_flip_frac': {k: factor * max(v, floor) for k, v in lay.items()}}
    env['prefill_positions'] = ref['prefill.positions']
    env['margins'] = margins(logit_rows(ref))
    return env


# ---------------------------------------------------------------- verdicts


def judge(m, env):
    """[(ok, what, detail)] and notes (reported, not failures)."""
    checks, notes = [], []
    rows = {}
    for part in ('prefill', 'decode'):
        e, err = env[part], m[part]['err']
        if not len(err):
            continue
        row = (e['row'][np.searchsorted(env['prefill_positions'], m['prefill']['positions'])]
               if part == 'prefill' else e['row'])
        rows[part] = np.maximum(e['tol'], env['factor'] * row)     # per-row tolerance, for ties
        jump = np.nonzero(~(err <= e['tol']))[0]
        budget = poisson_quantile(env['factor'] * env['jump_rate'] * len(err), P_BUDGET)
        med = float(np.median(err))
        ok = med <= e['tol'] and len(jump) <= budget and bool(np.all(err <= env['ceiling']))
        checks.append((ok, '%s logits' % part,
                       '%d rows: median err %.3g (tol %.3g), %d rows above tol (allowed %d), max %.3g '
                       '(ceiling %.3g)' % (len(err), med, e['tol'], len(jump), budget, err.max(),
                                           env['ceiling'])))
        for i in jump[:12]:
            where = ('position %d' % m['prefill']['positions'][i] if part == 'prefill'
                     else 'step %d' % i)
            seen = 'seen' if env['factor'] * row[i] >= err[i] else 'not seen'
            notes.append('%s logits at %s: err %.3g > tol %.3g (a jump of this size at this row was %s '
                         'in the perturbed runs)' % (part, where, err[i], e['tol'], seen))
        if len(jump) > 12:
            notes.append('%s logits: %d more rows above tol' % (part, len(jump) - 12))
    # tokens: pick i comes from the last prefill row (i = 0) or decode row i - 1
    t = m['tokens']
    tol = np.concatenate([rows['prefill'][-1:], rows.get('decode', np.zeros(0))])
    bad = [i for i in t['differ'] if env['margins'][i] > 2 * tol[i]]
    checks.append((not bad, 'greedy tokens',
                   '%d picks, %d differ%s' % (len(t['oracle']), len(t['differ']),
                                             ' where the oracle\'s top-2 gap is clear: picks %s' % bad
                                             if bad else '')))
    err = np.concatenate([m['prefill']['err'][-1:], m['decode']['err']])
    for i in bad:
        notes.append('pick %d: cedar %d, oracle %d, the oracle\'s top-2 gap %.3g > 2 tol = %.3g; '
                     'cedar\'s row is off by %.3g%s' % (
                         i, t['cedar'][i], t['oracle'][i], env['margins'][i], 2 * tol[i], err[i],
                         ' (a jump: if it were a routing flip the perturbed runs missed, more '
                         'runs, --runs 8, would show the oracle\'s row moving as much)'
                         if err[i] > tol[i] else ''))
    for i in range(len(t['oracle'])):
        if env['margins'][i] <= 2 * tol[i]:
            notes.append('NEAR TIE at pick %d: the oracle\'s top-2 gap %.3g is within 2 tol = %.3g, '
                         'so rounding alone may pick either token (cedar %d, oracle %d)'
                         % (i, env['margins'][i], 2 * tol[i], t['cedar'][i], t['oracle'][i]))
    for kind in KINDS:
        ks = [k for k in m['cache'] if k.endswith('.' + kind)]
        if not ks:
            continue
        e = env[kind]
        flips, codes = sum(m['cache'][k]['flips'] for k in ks), sum(m['cache'][k]['codes'] for k in ks)
        rel = max(m['cache'][k]['rel'] for k in ks)
        over = [k for k in ks if m['cache'][k]['flip_frac'] > e['layer_flip_frac'][k]]
        ok = flips <= e['flip_frac'] * codes and rel <= e['rel'] and not over
        checks.append((ok, '%s caches' % kind,
                       '%d layers: %d of %d codes differ (%.3g%%, tol %.3g%%), %d by more than one '
                       'step; value rms diff max %.3g (tol %.3g)%s'
                       % (len(ks), flips, codes, 100.0 * flips / max(codes, 1), 100.0 * e['flip_frac'],
                          sum(m['cache'][k]['far'] for k in ks), rel, e['rel'],
                          '; layers over tol: ' + ' '.join(over[:8]) + (' ...' if len(over) > 8 else '')
                          if over else '')))
    return checks, notes


def compare(cedar_path, oracle_path, plan_path, weights, work, runs=RUNS, factor=FACTOR, log=None):
    """Returns (measure, envelope, checks, notes)."""
    c, _, cdt = load(cedar_path)
    o, _, odt = load(oracle_path)
    bad = structure(c, cdt, o, odt)
    if bad:
        return None, None, [(False, 'structure', s) for s in bad], []
    notes = ['tensors the oracle does not write (not compared): ' + ', '.join(sorted(set(c) - set(o)))
             ] if set(c) - set(o) else []
    N = prompt_len(o)
    ref = o
    if not np.array_equal(c['tokens'], o['tokens']):
        # compare with the oracle fed cedar's tokens (judge() still checks every pick);
        # the tolerances stay those of the oracle's own path: they do not depend on it
        i = int(np.nonzero(c['tokens'] != o['tokens'])[0][0]) - N
        notes.append('cedar consumed other tokens from pick %d on; the reference is the oracle '
                     'rerun on cedar\'s tokens' % i)
        ref = load(cached_run(work, plan_path, weights, c['tokens'], N, None, 0))[0]
    plan = P.Plan(plan_path)
    m = measure(c, ref, plan)
    env = calibrate(o, plan_path, weights, work, runs, factor, log)
    if ref is not o:
        m['tokens']['oracle_greedy'] = logit_rows(o).argmax(axis=1).tolist()
        env['margins'] = margins(logit_rows(ref))
    checks, n2 = judge(m, env)
    own = logit_rows(c).argmax(axis=1)[:n_steps(c)]
    inconsistent = [i for i, (a, b) in enumerate(zip(m['tokens']['consumed'], own)) if a != b]
    checks.insert(0, (not inconsistent, 'cedar greedy',
                      'cedar\'s consumed tokens are %s picks of its own logits%s'
                      % ('not the' if inconsistent else 'the',
                         ' (picks %s)' % inconsistent if inconsistent else '')))
    return m, env, checks, notes + n2


# ---------------------------------------------------------------- reports


def report_text(m, env, checks, notes):
    out = []
    if env:
        out.append('tolerances: %d perturbed oracle runs, sigma = K u = %d x 2^-24 = %.3g, factor %g'
                   % (env['runs'], env['kmax'], env['sigma'], env['factor']))
    if m:
        t = m['tokens']
        out.append('tokens: cedar  %s' % ' '.join(map(str, t['cedar'])))
        out.append('        oracle %s%s' % (' '.join(map(str, t['oracle'])),
                                           '   (rerun on cedar\'s tokens; its own greedy run: %s)'
                                           % ' '.join(map(str, t['oracle_greedy']))
                                           if 'oracle_greedy' in t else ''))
    for ok, what, detail in checks:
        out.append('%s %-17s %s' % ('ok  ' if ok else 'FAIL', what, detail))
    out.extend('note: ' + n for n in notes)
    return '\n'.join(out)


def _plain(x):
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else str(float(x))
    if isinstance(x, np.integer):
        return int(x)
    return x


def report_json(m, env, checks, notes):
    return json.dumps(_plain({'ok': all(c[0] for c in checks),
                              'checks': [{'ok': c[0], 'what': c[1], 'detail': c[2]} for c in checks],
                              'notes': notes, 'measured': m, 'tolerances': env}), indent=1)


# ---------------------------------------------------------------- self-test

# The CI prompt (tests/cli/oracle_run.sh): 705 bytes of English, token = byte.  Long
# enough that L20 (ratio 1) holds more entries than top-k (512), so the decoder
# layers' Top-K selection is exercised; the encoder sources (ratio 2) stay below.
PROMPT = ('It was the best of times, it was the worst of times, it was the age of wisdom, it was '
          'the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it '
          'was the season of Light, it was the season of Darkness, it was the spring of hope, it was '
          'the winter of despair, we had everything before us, we had nothing before us, we were '
          'all going direct to Heaven, we were all going direct the other way - in short, the '
          'period was so far like the present period, that some of its noisiest authorities '
          'insisted on its being received, for good or for evil, in the superlative degree of '
          'comparison only. There were a king with a large jaw and a queen with a plain face, on '
          'the throne of England.')
STEPS = 16


def _like_cedar(o, out, change=None):
    """Write dump o as cedar would (F32 logits), after change(d) edits a copy."""
    d = {k: (v.astype(np.float32) if v.dtype == np.float64 else v.copy()) for k, v in o.items()}
    if change:
        change(d)
    ST.write(out, d, {'cedar.selftest': '1'})
    return out


def _swap_top2(r):
    a, b = np.argsort(-r.astype(np.float64))[:2]
    r[a], r[b] = r[b], r[a]


def _swap_pick(row, d, step):
    """Make decode row `row` pick its 5th-best token and cedar consume it."""
    r = d['decode.logits'][row]
    order = np.argsort(-r.astype(np.float64))
    r[order[0]], r[order[4]] = r[order[4]], r[order[0]]
    N = prompt_len(d)
    d['tokens'][N + step] = order[4]


def self_test(plan_path, weights, oracle_path, work, full=False, log=print):
    """compare.py against dumps it must accept and dumps it must refuse.
    Returns 0 when every case comes out as expected."""
    if not oracle_path:
        toks = list(PROMPT.encode())
        oracle_path = oracle_dump(plan_path, weights, toks, len(toks),
                                  os.path.join(work, 'selftest-oracle.safetensors'), steps=STEPS)
    o = load(oracle_path)[0]
    N, S = prompt_len(o), n_steps(o)
    K = kmax(P.Plan(plan_path))
    tmp = tempfile.mkdtemp(prefix='selftest_', dir=work)

    def nibbles(d):
        b = d['L20.main_kv'][:, :d['L20.main_kv'].shape[1] * 8 // 9]
        b[:] = ((b & 0xF) << 4) | (b >> 4)

    def rotate_rings(d):
        for l in layers_of(d, 'swa_pos'):
            for k in ('L%d.swa' % l, 'L%d.swa_pos' % l):
                d[k] = np.roll(d[k], 37, axis=0)

    def last_row(d):
        d['prefill.logits'], d['prefill.positions'] = d['prefill.logits'][-1:], d['prefill.positions'][-1:]

    def set_(name, i, v):
        return lambda d: d[name].__setitem__(i, v)

    def mul(name, i, v):
        return lambda d: d[name].__setitem__(i, d[name][i] * np.float32(v))

    # (what, expected: True = accept, False = refuse, None = report only, how):
    # how is an edit of the oracle's dump, or the oracle rerun with these arguments
    cases = [
        ('the oracle itself, logits as F32', True, None),
        ('only the last prefill row', True, last_row),
        ('SWA rings in slot order (rotated)', True, rotate_rings),
        ('op outputs rounded to float32', True, {'sigma': 'round'}),
        ('perturbed, sigma = sqrt(K) u', True, {'sigma': math.sqrt(K) * U32, 'seed': 7}),
        ('perturbed, sigma = K u, unseen seed', True, {'sigma': K * U32, 'seed': 99}),
        ('a consumed decode token changed', False, set_('tokens', N + 3, (o['tokens'][N + 3] + 1) % 256)),
        ('decode row 2 picks its 5th best', False, lambda d: _swap_pick(2, d, 3)),
        ('every decode row x 1.02', False, mul('decode.logits', slice(None), 1.02)),
        ('last prefill row x 2', False, mul('prefill.logits', -1, 2)),
        ('NaN in decode row 5', False, set_('decode.logits', (5, 7), np.nan)),
        ('L20 Main-KV nibbles swapped', False, nibbles),
        ('L20 Indexer-K one entry late', False,
         lambda d: d.__setitem__('L20.indexer_k', np.roll(d['L20.indexer_k'], 1, 0))),
        ('L5 ring positions + 1', False, lambda d: d['L5.swa_pos'].__iadd__(1)),
        ('no decode.logits', False, lambda d: d.pop('decode.logits')),
        ('Engram multipliers from splitmix64', False, {'steps': S, 'opts': {'multipliers': 'splitmix64'}}),

        ('no qI MXFP4 round trip', None, {'steps': S, 'tweak': ('q_mxfp4', False)}),
        ('newest pool block not pinned', None, {'steps': S, 'tweak': ('pin', False)}),
        ('norm_eps 1e-6 instead of 1e-20', None, {'steps': S, 'tweak': ('eps', 1e-6)}),
        ('no attention sink (sinks are 0 here)', None, {'steps': S, 'tweak': ('sink', False)}),
    ]
    cases = [c for c in cases if full or c[1] is not None]
    # every oracle run first, on every CPU: the calibration, the reruns, and the
    # references for edits that change the consumed tokens
    sigma = K * U32
    jobs = [(cached_run, (work, plan_path, weights, o['tokens'], N, sigma, 1000 + k), {})
            for k in range(RUNS)]
    paths = []
    for i, (what, _, how) in enumerate(cases):
        out = os.path.join(tmp, 'case%d.safetensors' % i)
        paths.append(out)
        if isinstance(how, dict):
            toks = o['tokens'][:N] if 'steps' in how else o['tokens']
            jobs.append((oracle_dump, (plan_path, weights, toks, N, out), how))
        else:
            _like_cedar(o, out, how)
            toks = load(out)[0].get('tokens', o['tokens'])
            if not np.array_equal(toks, o['tokens']):
                jobs.append((cached_run, (work, plan_path, weights, toks, N, None, 0), {}))
    run_all(jobs)
    # a pick the tolerances call a near tie, taken the other way, must pass; the
    # nearest clear one taken the other way must not (the rest of the run
    # follows the other token, as cedar's would)
    env = calibrate(o, plan_path, weights, work)
    tol = np.concatenate([[env['prefill']['tol']], np.maximum(env['decode']['tol'],
                                                               env['factor'] * env['decode']['row'])])
    ratio = env['margins'][1:S] / (2 * tol[1:S])               # picks 1 .. S-1 are consumed
    picks = []
    if np.any(ratio <= 1):
        picks.append(('near tie at pick %d', True, 1 + int(np.argmax(ratio <= 1))))
    if np.any(ratio > 1):
        clear = np.where(ratio > 1, env['margins'][1:S], np.inf)
        picks.append(('clear pick %d', False, 1 + int(np.argmin(clear))))
    jobs = []
    for what, expect, i in picks:
        toks = np.append(o['tokens'][:N + i], np.argsort(-logit_rows(o)[i])[1])
        out = os.path.join(tmp, 'alt%d.safetensors' % i)
        cases.append((what % i + ' (gap %.3g) taken the other way' % env['margins'][i], expect, i))
        paths.append(out)
        jobs.append((oracle_dump, (plan_path, weights, toks, N, out), {'steps': S - i - 1}))
    run_all(jobs)
    for (_, _, i), path in zip(cases[len(cases) - len(picks):], paths[len(paths) - len(picks):]):
        d = load(path)[0]      # the oracle's own run on this path is also compare()'s reference
        shutil.copy(path, cache_path(work, plan_path, weights, d['tokens'], N, None, 0))
        _like_cedar(d, path, lambda d, i=i: _swap_top2(d['decode.logits'][i - 1]))
    failures = 0
    for (what, expect, how), path in zip(cases, paths):
        if isinstance(how, dict):
            _like_cedar(load(path)[0], path)
        m, env, checks, notes = compare(path, oracle_path, plan_path, weights, work)
        ok = all(c[0] for c in checks)
        why = '; '.join('%s: %s' % (c[1], c[2]) for c in checks if not c[0])
        verdict = 'info' if expect is None else 'ok  ' if ok == expect else 'FAIL'
        failures += verdict == 'FAIL'
        log('%s %-36s %s%s' % (verdict, what, 'accepted' if ok else 'refused',
                                ' (' + why[:160] + ')' if why else ''))
    shutil.rmtree(tmp, ignore_errors=True)
    log('compare.py self-test: %s' % ('%d case(s) came out wrong' % failures if failures
                                      else 'every case came out as expected'))
    return 1 if failures else 0


# ---------------------------------------------------------------- command line


def default_plan(oracle_path):
    name = load(oracle_path)[1].get('oracle.plan', 'v41-mini')
    for d in (os.path.join(ROOT, 'plans'), os.path.join(HERE, 'plans'), os.path.join(ROOT, 'tests', 'plans')):
        p = os.path.join(d, name + '.yaml')
        if os.path.exists(p):
            return p
    raise Usage('cannot find plan %r of %s; pass --plan' % (name, oracle_path))


def main(argv=None):
    ap = argparse.ArgumentParser(usage=__doc__.split('\n\n')[1], description=__doc__.split('\n\n')[0])
    ap.add_argument('cedar_dump', nargs='?')
    ap.add_argument('oracle_dump', nargs='?')
    ap.add_argument('--weights', help='the weights both ran on (the oracle is rerun on them)')
    ap.add_argument('--plan', help='default: plans/<plan name in the oracle dump>.yaml')
    ap.add_argument('--json', action='store_true', help='print the whole comparison as JSON')
    ap.add_argument('--work', help='keep the oracle reruns here and reuse them (default: a temp dir)')
    ap.add_argument('--runs', type=int, default=RUNS, help='perturbed oracle reruns (default %d)' % RUNS)
    ap.add_argument('--self-test', action='store_true', help='check that compare.py accepts and refuses '
                    'what it should (with --oracle-dump O: O\'s prompt and steps)')
    ap.add_argument('--oracle-dump', help='for --self-test')
    ap.add_argument('--full', action='store_true', help='--self-test: also the readings it cannot tell apart')
    ap.add_argument('--print-prompt', action='store_true', help='print the CI prompt\'s token ids')
    a = ap.parse_args(argv)
    if a.print_prompt:
        print(','.join(str(b) for b in PROMPT.encode()))
        return 0
    work = a.work or tempfile.mkdtemp(prefix='compare_')
    os.makedirs(work, exist_ok=True)
    try:
        if not a.weights:
            raise Usage('--weights W is needed (the oracle is rerun on them)')
        if a.self_test:
            plan = a.plan or (default_plan(a.oracle_dump) if a.oracle_dump
                              else os.path.join(ROOT, 'plans', 'v41-mini.yaml'))
            return self_test(plan, a.weights, a.oracle_dump, work, a.full)
        if not (a.cedar_dump and a.oracle_dump):
            raise Usage('give CEDAR_DUMP and ORACLE_DUMP')
        plan = a.plan or default_plan(a.oracle_dump)
        m, env, checks, notes = compare(a.cedar_dump, a.oracle_dump, plan, a.weights, work, a.runs,
                                        log=None if a.json else print)
    except Usage as e:
        print('compare.py: %s' % e, file=sys.stderr)
        return 2
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    ok = all(c[0] for c in checks)
    if a.json:
        print(report_json(m, env, checks, notes))
    else:
        print(report_text(m, env, checks, notes))
        print('compare.py: %s' % ('cedar agrees with the oracle' if ok else 'DISAGREEMENT'))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
