"""train_drafter.py: trains the DSpark drafter on the frozen trained model.

    /usr/bin/python3 train/train_drafter.py --state DIR [--resume] [--minutes M | --until HH:MM | --steps N]

Reads DIR/best.pt (the main model, frozen), writes DIR/drafter.pt
(resumable: drafter weights, optimizer, data-order generator, step, curve;
atomically every --ckpt-minutes and at the end); `train.py --export` takes
the drafter from it when it exists. Each step: the main model runs a batch
of windows with its states captured (no gradient); at every --anchor-every
position P the drafter drafts the B bytes after P from the token at P and
the window of main rows before P; the loss is the cross entropy of each
draft row against the true byte, with the true bytes as the Markov inputs
(teacher forcing), plus a logistic loss teaching the confidence head
whether the row's greedy pick is right. Printed: draft cross entropy in
bits, and the mean accepted length on the batch: 1 (the token the target
itself gives) plus the run of leading draft rows whose greedy pick equals
the true byte, with teacher-forced Markov inputs.
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
from train import batch, save, LN2  # noqa: E402


def draft_batch(model, w, anchor_every):
    """The drafter's inputs for a batch of windows w (B, T + 1): main rows,
    validity, positions, y0, P, teacher-forced Markov inputs and targets."""
    cfg = model.cfg
    Bd, n = cfg.ds_draft, cfg.window
    x = w[:, :-1]
    T = x.shape[1]
    with torch.no_grad():
        _, ctx = model(x, model.engram_rows(x), hidden=True)
        rows = torch.stack([ctx.states[t].mean(dim=-2) for t in cfg.ds_targets], dim=-2)   # (B, T, nt, d)
    anchors = np.arange(anchor_every, T - Bd + 1, anchor_every)
    mpos = torch.as_tensor(anchors[:, None] - n + np.arange(n)[None, :])                   # (A, n)
    valid = mpos >= 0
    idx = mpos.clamp(min=0)
    R = rows[:, idx]                                                                        # (B, A, n, nt, d)
    G = w.shape[0] * len(anchors)
    P = torch.as_tensor(anchors).repeat(w.shape[0])
    seqs = w.repeat_interleave(len(anchors), 0)
    ar = torch.arange(Bd)
    prev = seqs.gather(1, P[:, None] + ar[None, :])                  # d_0 = y0, then the true bytes
    tgt = seqs.gather(1, P[:, None] + 1 + ar[None, :])
    return (R.flatten(0, 1), valid.repeat(w.shape[0], 1), mpos.repeat(w.shape[0], 1), prev[:, 0], P,
            prev, tgt, G)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--config', default=os.path.join(HERE, 'config.json'))
    ap.add_argument('--state', default=os.path.join(os.path.dirname(HERE), 'build', 'train'))
    ap.add_argument('--resume', action='store_true')
    ap.add_argument('--seed', type=int, default=2)
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--seq', type=int, default=128)
    ap.add_argument('--anchor-every', type=int, default=8)
    ap.add_argument('--lr', type=float, default=3e-3)
    ap.add_argument('--minutes', type=float, default=0)
    ap.add_argument('--until', default='')
    ap.add_argument('--steps', type=int, default=0)
    ap.add_argument('--ckpt-minutes', type=float, default=5)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = Config(a.config)
    tr, ho, info = corpus(os.path.join(a.state, 'corpus'))
    model = V41(cfg)
    model.cmap = engram_map(cfg.vocab)[0]
    src = os.path.join(a.state, 'best.pt')
    if not os.path.exists(src):
        raise SystemExit('train_drafter: %s does not exist (train the model first: train.py)' % src)
    model.load_state_dict(torch.load(src)['model'])
    fresh = V41(cfg)
    fresh.init_weights(a.seed)
    model.drafter.load_state_dict(fresh.drafter.state_dict())
    for p in model.parameters():
        p.requires_grad_(False)
    params = [p for p in model.drafter.parameters() if p.dim() > 0]
    for p in params:
        p.requires_grad_(True)
    for blk in model.drafter.blocks:
        blk.ffn.bias.requires_grad_(False)
    params = [p for p in model.drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    rng = np.random.default_rng(a.seed)
    st = {'step': 0, 'bytes': 0, 'wall': 0.0, 'curve': []}
    dpath = os.path.join(a.state, 'drafter.pt')
    if a.resume:
        if not os.path.exists(dpath):
            raise SystemExit('train_drafter: --resume: %s does not exist' % dpath)
        s = torch.load(dpath)
        model.drafter.load_state_dict(s['drafter'])
        opt.load_state_dict(s['opt'])
        rng.bit_generator.state = s['rng']
        st = s['st']
    stop_at = None
    if a.until:
        hh, mm = (int(x) for x in a.until.split(':'))
        now = time.gmtime()
        stop_at = time.time() + (((hh * 60 + mm) - (now.tm_hour * 60 + now.tm_min)) % 1440) * 60 - now.tm_sec
    t_run, t_ck = time.time(), time.time()

    def checkpoint():
        save(dpath, {'drafter': model.drafter.state_dict(), 'opt': opt.state_dict(),
                     'rng': rng.bit_generator.state, 'st': st})
        print('checkpoint %s: step %d' % (dpath, st['step']), flush=True)

    while not ((a.steps and st['step'] >= a.steps) or (a.minutes and time.time() - t_run > a.minutes * 60)
               or (stop_at and time.time() > stop_at)):
        t0 = time.time()
        w = batch(tr, rng, a.batch, a.seq)
        rows, valid, mpos, y0, P, prev, tgt, G = draft_batch(model, w, a.anchor_every)
        lg, conf, _ = model.drafter(model, rows, valid, mpos, y0, P, prev=prev)
        ce = F.cross_entropy(lg.flatten(0, 1), tgt.flatten())
        right = (lg.argmax(-1) == tgt).float()
        cl = F.binary_cross_entropy_with_logits(conf, right)
        opt.zero_grad(set_to_none=True)
        (ce + 0.1 * cl).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        acc_len = 1.0 + torch.cumprod(right, dim=1).sum(1).mean().item()
        dt = time.time() - t0
        st['step'] += 1
        st['bytes'] += w[:, :-1].numel()
        st['wall'] += dt
        st['curve'].append((st['step'], round(ce.item() / LN2, 4), round(acc_len, 3)))
        print('drafter step %d  draft CE %.3f bits  accepted length %.2f  conf loss %.3f  %.1f s' % (
            st['step'], ce.item() / LN2, acc_len, cl.item(), dt), flush=True)
        if time.time() - t_ck > a.ckpt_minutes * 60:
            checkpoint()
            t_ck = time.time()
    checkpoint()
    return 0


if __name__ == '__main__':
    sys.exit(main())
