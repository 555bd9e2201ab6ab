"""train.py: trains the V4.1 byte model (train/model.py) on the corpus (train/data.py).

    /usr/bin/python3 train/train.py [--state DIR] [--resume] [--until HH:MM] [--minutes M]
    /usr/bin/python3 train/train.py --state DIR --export models/v41-byte

Seeded (--seed: weights, batch order), resumable from its own state file
(DIR/state.pt, written atomically every --ckpt-minutes and at the end:
weights, optimizer, data-order generator, step, bytes seen, loss curve,
wall time), printing one line per step. The loss is next-byte cross
entropy plus, for each index layer, the KL of its scores against the dense
attention (model.py): the indexer learns from that term only. Held-out
bits per byte are measured on fixed held-out windows every --eval-every
steps; the state with the best held-out figure is kept as DIR/best.pt.
`--export` writes the released-layout checkpoint of DIR/best.pt
(train/release.py).
"""
import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from config import Config  # noqa: E402
from data import corpus  # noqa: E402
from model import V41  # noqa: E402
from tokenizer import engram_map  # noqa: E402

LN2 = math.log(2.0)


def batch(data, rng, B, T):
    off = rng.integers(0, len(data) - T - 1, size=B)
    return torch.as_tensor(np.stack([data[o:o + T + 1] for o in off]).astype(np.int64))


def heldout_windows(ho, T, n):
    """n fixed, evenly spaced windows of T + 1 held-out bytes."""
    step = (len(ho) - T - 1) // n
    return torch.as_tensor(np.stack([ho[i * step:i * step + T + 1] for i in range(n)]).astype(np.int64))


def evaluate(model, windows, bs=16):
    """Held-out bits per byte: mean next-byte cross entropy / ln 2 over every
    predicted position of the windows (positions 1..T given 0..T-1)."""
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(windows), bs):
            w = windows[i:i + bs]
            x = w[:, :-1]
            lg, _ = model(x, model.engram_rows(x))
            tot += F.cross_entropy(lg.flatten(0, 1).float(), w[:, 1:].flatten(), reduction='sum').item()
            n += x.numel()
    return tot / n / LN2


def save(path, obj):
    tmp = path + '.tmp'
    torch.save(obj, tmp)
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--config', default=os.path.join(HERE, 'config.json'))
    ap.add_argument('--state', default=os.path.join(os.path.dirname(HERE), 'build', 'train'))
    ap.add_argument('--resume', action='store_true', help='continue from STATE/state.pt')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--seq', type=int, default=128)
    ap.add_argument('--lr', type=float, default=3e-3)
    ap.add_argument('--warmup', type=int, default=30)
    ap.add_argument('--kl-weight', type=float, default=1.0)
    ap.add_argument('--bias-rate', type=float, default=1e-3, help='MoE router bias step (aux-loss-free balance)')
    ap.add_argument('--minutes', type=float, default=0, help='stop after this many minutes of this run')
    ap.add_argument('--until', default='', help='stop at this UTC time HH:MM')
    ap.add_argument('--steps', type=int, default=0, help='stop at this total step count')
    ap.add_argument('--eval-every', type=int, default=50)
    ap.add_argument('--eval-windows', type=int, default=64)
    ap.add_argument('--ckpt-minutes', type=float, default=5)
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--export-windows', type=int, default=256, help='held-out windows the export scores')
    ap.add_argument('--export', metavar='DIR', help='write the best state as a released checkpoint and stop')
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    os.makedirs(a.state, exist_ok=True)
    cfg = Config(a.config)
    tr, ho, info = corpus(os.path.join(a.state, 'corpus'))
    model = V41(cfg)
    cmap, nkeys = engram_map(cfg.vocab)
    if cfg.engram_layers and nkeys != cfg.engram_cv:
        raise SystemExit('train: %s: engram_compressed_vocab_size is %d but the byte tokenizer\'s Engram '
                         'map has %d keys (set it to %d)' % (a.config, cfg.engram_cv, nkeys, nkeys))
    model.cmap = cmap                   # what cedar builds from the checkpoint's tokenizer.json
    if a.export:
        from release import export
        return export(model, cfg, a, info, ho)
    model.init_weights(a.seed)
    params = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith('drafter.')]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    st = {'step': 0, 'bytes': 0, 'wall': 0.0, 'curve': [], 'heldout': [], 'best': None,
          'seed': a.seed, 'batch': a.batch, 'seq': a.seq, 'lr': a.lr}
    rng = np.random.default_rng(a.seed)
    spath = os.path.join(a.state, 'state.pt')
    if a.resume:
        if not os.path.exists(spath):
            raise SystemExit('train: --resume: %s does not exist (run without --resume first)' % spath)
        s = torch.load(spath)
        model.load_state_dict(s['model'])
        opt.load_state_dict(s['opt'])
        rng.bit_generator.state = s['rng']
        st = s['st']
        print('resumed at step %d (%d bytes seen, %.0f s trained)' % (st['step'], st['bytes'], st['wall']))
    windows = heldout_windows(ho, a.seq, a.eval_windows)
    stop_at = None
    if a.until:
        hh, mm = (int(x) for x in a.until.split(':'))
        now = time.gmtime()
        left = ((hh * 60 + mm) - (now.tm_hour * 60 + now.tm_min)) % (24 * 60)   # the next HH:MM
        stop_at = time.time() + left * 60 - now.tm_sec
    t_run, t_ck = time.time(), time.time()

    def checkpoint(tag=''):
        save(spath, {'model': model.state_dict(), 'opt': opt.state_dict(), 'rng': rng.bit_generator.state,
                     'st': st, 'config': cfg.raw})
        print('checkpoint %s: step %d%s' % (spath, st['step'], tag), flush=True)

    while True:
        if a.steps and st['step'] >= a.steps:
            break
        if a.minutes and time.time() - t_run > a.minutes * 60:
            break
        if stop_at and time.time() > stop_at:
            break
        t0 = time.time()
        lr = a.lr * min(1.0, (st['step'] + 1) / a.warmup)
        for g in opt.param_groups:
            g['lr'] = lr
        w = batch(tr, rng, a.batch, a.seq)
        x = w[:, :-1]
        logits, ctx = model(x, model.engram_rows(x), index_kl=True)
        ce = F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten())
        kl = sum(ctx.kl.values()) / max(1, len(ctx.kl))
        opt.zero_grad(set_to_none=True)
        (ce + a.kl_weight * kl).backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0).item()
        opt.step()
        with torch.no_grad():                  # aux-loss-free balance: bias toward underloaded experts
            for blk in model.layers:
                ld = blk.ffn.load.float()
                blk.ffn.bias[0] += a.bias_rate * torch.sign(ld.mean() - ld)
        dt = time.time() - t0
        st['step'] += 1
        st['bytes'] += x.numel()
        st['wall'] += dt
        st['curve'].append((st['step'], st['bytes'], round(ce.item() / LN2, 4), round(kl.item(), 4)))
        print('step %d  bytes %d  train %.3f bpb  index-KL %.3f  |g| %.2f  lr %.2g  %.0f B/s' % (
            st['step'], st['bytes'], ce.item() / LN2, kl.item(), gn, lr, x.numel() / dt), flush=True)
        if st['step'] % a.eval_every == 0:
            hb = evaluate(model, windows)
            st['heldout'].append((st['step'], st['bytes'], round(hb, 4)))
            print('heldout step %d: %.4f bpb' % (st['step'], hb), flush=True)
            if st['best'] is None or hb < st['best'][2]:
                st['best'] = (st['step'], st['bytes'], hb)
                save(os.path.join(a.state, 'best.pt'), {'model': model.state_dict(), 'st': dict(st)})
        if time.time() - t_ck > a.ckpt_minutes * 60:
            checkpoint()
            t_ck = time.time()
    checkpoint(' (end)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
