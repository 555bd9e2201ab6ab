"""oracle_equal.py: the torch training model (train/model.py) equals the NumPy
oracle (tests/oracle/oracle.py) on the same weights.

The torch model draws its initial weights, writes them as a cedar weights
file (train/export.py), and the oracle reads that file with the plan
tests/oracle/plans/v41-byte-f32.yaml (plans/v41-byte.yaml with fp32
numerics, exact-float caches, own-source index keys: what the torch model
computes). The prompt is English bytes; the oracle prefills it (CED, its
replay covering the whole prompt, so every position runs every layer) and
runs greedy decode steps; the torch model runs the prompt plus the consumed
picks in one dense batched forward, whose rows must equal the oracle's.

Two comparisons:
- torch in float64: the same function, so the logits agree to float64
  rounding (bound below);
- torch in float32 (training's dtype) against the oracle's float64, within
  a bound derived from fp32's unit roundoff u = 2^-24: each logit is the
  end of a chain of 80 sublayers whose longest reduction is the mHC mix
  over hc x hidden = K values; a dot product of K terms carries a relative
  error of at most ~K u (Higham's gamma_K), and the residual stream adds
  one such error per sublayer, so |dlogit| <= 80 K u max|logit| (each
  sublayer's error passes through normalisations that do not amplify it
  by more than O(1); the measured ratio is printed).
Exit 0 = equal, 1 = differ, 77 = torch or numpy absent (CI may lack
python3-torch: `make train-deps` installs it).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, 'train'))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'oracle'))

try:
    import numpy as np
    import torch
except ImportError as e:
    print('skip: %s (install python3-torch: make train-deps)' % e)
    sys.exit(77)

from config import Config  # noqa: E402
from export import cedar_weights, engram_u8, write_safetensors  # noqa: E402
from model import V41, cedar_names  # noqa: E402
import oracle as O  # noqa: E402

PROMPT = (b'In the beginning God created the heaven and the earth. And the earth was without '
          b'form, and void; and darkness')                          # 110 bytes
STEPS = 4                                   # prompt + steps <= 128: the replay covers all of it


def main():
    torch.set_num_threads(1)
    work = sys.argv[1] if len(sys.argv) > 1 else '/tmp/train_oracle_equal'
    os.makedirs(work, exist_ok=True)
    cfg = Config(os.path.join(ROOT, 'train', 'config.json'))
    m = V41(cfg)
    m.init_weights(7)
    with torch.no_grad():                   # the oracle reads FP8 Engram rows: use their values
        for blk in m.layers:
            if blk.L.engram:
                blk.engram.table.copy_(torch.as_tensor(engram_u8(blk.engram.table.double().numpy())[1]))
        for blk in m.layers:                # a nonzero router bias: the selection-only rule is exercised
            blk.ffn.bias[0].copy_(torch.linspace(-0.05, 0.05, cfg.n_routed))
    wpath = os.path.join(work, 'w.safetensors')
    write_safetensors(wpath, cedar_weights(cedar_names(m)))
    plan = os.path.join(ROOT, 'tests', 'oracle', 'plans', 'v41-byte-f32.yaml')
    o = O.Oracle(plan, wpath)
    toks = list(PROMPT)
    r = o.prefill(toks)
    rows, y = [r.logits], o.greedy(r.last)
    for _ in range(STEPS):
        toks.append(y)
        lg = o.decode(y)
        rows.append(lg[None])
        y = o.greedy(lg)
    ref = np.concatenate(rows)                             # (len(toks), V): every position
    assert ref.shape[0] == len(toks), ref.shape
    seq = torch.as_tensor([toks])
    eng = m.engram_rows(seq)
    ok = True
    with torch.no_grad():
        for dt in (torch.float64, torch.float32):
            md = m.to(dt)
            md.store = V41.store_f32                # the oracle's caches hold float32 values
            lg = md(seq, eng)[0][0].double().numpy()
            err = np.abs(lg - ref).max()
            scale = np.abs(ref).max()
            K = cfg.hc * cfg.d
            if dt == torch.float64:
                bound = 80 * K * 2.0 ** -53 * scale
            else:
                bound = 80 * K * 2.0 ** -24 * scale
            same = (lg.argmax(1) == ref.argmax(1)).mean()
            good = err <= bound
            ok &= good
            print('%s: max |torch - oracle| %.3g, bound %.3g (ratio %.3g), max |logit| %.3g, '
                  'argmax agreement %.3f over %d positions: %s'
                  % (dt, err, bound, err / bound, scale, same, len(toks), 'ok' if good else 'DIFFER'))
    ok &= qmx_equal(m, wpath, toks[:len(PROMPT)])
    ok &= drafter_equal(m, cfg, plan, wpath, list(PROMPT))
    print('oracle_equal: %s' % ('ok' if ok else 'FAILED'))
    return 0 if ok else 1


def qmx_equal(m, wpath, toks):
    """The indexer query through MXFP4 (the model's q_mxfp4 option, Appendix
    V #11), float64 torch against the oracle on v41-byte-f32-qmx. The codec
    rounds, so the float64 run is the comparison (an fp32 run could land on
    the other side of a rounding boundary)."""
    o = O.Oracle(os.path.join(ROOT, 'tests', 'oracle', 'plans', 'v41-byte-f32-qmx.yaml'), wpath)
    ref = o.prefill(toks).logits
    md = m.to(torch.float64)
    md.store, md.q_mxfp4 = V41.store_f32, True
    seq = torch.as_tensor([toks])
    with torch.no_grad():
        lg = md(seq, md.engram_rows(seq))[0][0].numpy()
    md.q_mxfp4 = False
    err = np.abs(lg - ref).max()
    bound = 80 * md.cfg.hc * md.cfg.d * 2.0 ** -53 * np.abs(ref).max()
    print('q_mxfp4: max |torch - oracle| %.3g, bound %.3g: %s' % (err, bound, 'ok' if err <= bound else 'DIFFER'))
    return err <= bound


def drafter_equal(m, cfg, plan, wpath, toks):
    """The DSpark draft block (Appendix V #24) after a prefill of toks: the
    captured rows (the mean over the streams of the state entering each
    target layer), then the block's logits and confidences with greedy
    Markov inputs, torch (float64) against tests/oracle/drafter.py."""
    import drafter as D
    o = D.Capture(plan, wpath)
    r = o.prefill(toks)
    P = len(toks)
    n = min(P, cfg.window)
    y0 = o.greedy(r.last)
    ref = D.Drafter(o).block(o.rows(P - n, P), np.arange(P - n, P), y0, P)
    md = m.to(torch.float64)
    md.store = V41.store_f32
    seq = torch.as_tensor([toks])
    with torch.no_grad():
        _, ctx = md(seq, md.engram_rows(seq), hidden=True)
        rows = torch.stack([ctx.states[t].mean(dim=-2) for t in cfg.ds_targets], dim=-2)[:, P - n:P]
        lg, conf, _ = md.drafter(md, rows, torch.ones(1, n, dtype=torch.bool), torch.arange(P - n, P)[None],
                                 torch.as_tensor([y0]), torch.as_tensor([P]))
    ok = True
    for name, a, b in (('captured rows', rows[0].numpy(), o.rows(P - n, P)),
                       ('draft logits', lg[0].numpy(), ref['logits']), ('confidence', conf[0].numpy(), ref['conf'])):
        err, scale = np.abs(a - b).max(), np.abs(b).max()
        bound = 80 * cfg.hc * cfg.d * 2.0 ** -53 * max(scale, 1.0)
        good = err <= bound
        ok &= good
        print('drafter %s: max |torch - oracle| %.3g, bound %.3g: %s' % (name, err, bound, 'ok' if good else 'DIFFER'))
    same = (lg[0].argmax(-1).numpy() == ref['tokens']).all()
    print('drafter greedy drafts %s (oracle %s)' % ('equal' if same else 'DIFFER', list(ref['tokens'])))
    return ok and same


if __name__ == '__main__':
    sys.exit(main())
