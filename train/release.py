"""release.py: the trained model as a released-layout checkpoint with its manifest.

`train.py --state DIR --export OUT` calls `export`: it loads DIR/best.pt
(the state with the best held-out bits per byte), writes OUT/config.json,
the shards in the release's formats and their index (export.py), the
tokenizer files (tokenizer.py) and OUT/manifest.json: the corpus (source,
license, sha256, split), the seed, steps, bytes seen, wall time, the loss
curve, and held-out bits per byte before and after quantization to the
released formats (the model rerun on the dequantized values a loader gets
back, on --export-windows evenly spaced held-out windows of the training
context).
"""
import json
import os
import time

import numpy as np
import torch

import export as X
import tokenizer as TK
from model import cedar_names


def heldout_bpb(model, ho, T, n):
    """Bits per byte over n evenly spaced held-out windows of T + 1 bytes
    (n T bytes scored; the whole held-out text takes ~10 min on a loaded 2-core CPU)."""
    from train import evaluate, heldout_windows
    return evaluate(model, heldout_windows(ho, T, n)), n * T


def export(model, cfg, a, info, ho):
    src = os.path.join(a.state, 'best.pt')
    if not os.path.exists(src):
        raise SystemExit('train: --export: %s does not exist (train first: make train)' % src)
    s = torch.load(src)
    model.load_state_dict(s['model'])
    st = s['st']
    drafter = 'mtp.* tensors seeded, not trained (docs/training.md)'
    dpath = os.path.join(a.state, 'drafter.pt')
    if model.drafter is not None and os.path.exists(dpath):      # train_drafter.py's
        d = torch.load(dpath)
        model.drafter.load_state_dict(d['drafter'])
        c = d['st']['curve']
        drafter = {'steps': d['st']['step'], 'bytes_seen': d['st']['bytes'], 'wall_s': round(d['st']['wall'], 1),
                   'curve_draft_ce_bits_accepted_length': c[::10] + c[-1:]}
    elif model.drafter is not None:     # its seeded initial values (states before the drafter's
        fresh = type(model)(cfg)        # mHC-init fix held uninitialised memory there)
        fresh.init_weights(st['seed'])
        model.drafter.load_state_dict(fresh.drafter.state_dict())
    full = os.path.join(a.state, 'state.pt')
    curve = torch.load(full)['st'] if os.path.exists(full) else st
    named = cedar_names(model)
    t0 = time.time()
    before, nb = heldout_bpb(model, ho, a.seq, a.export_windows)
    meta = {'format': 'pt', 'model': 'v41-byte', 'step': str(st['step'])}
    deq = X.released(named, cfg.raw, a.export, meta=meta)
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(torch.as_tensor(deq[name]))
    after, _ = heldout_bpb(model, ho, a.seq, a.export_windows)
    TK.write(a.export)
    size = sum(os.path.getsize(os.path.join(a.export, f)) for f in os.listdir(a.export))
    man = {
        'model': 'v41-byte', 'plan': 'plans/v41-byte.yaml', 'corpus': info,
        'seed': st['seed'], 'batch': st['batch'], 'seq': st['seq'], 'lr': st['lr'],
        'steps': st['step'], 'bytes_seen': st['bytes'], 'train_wall_s': round(st['wall'], 1),
        'steps_total_run': curve['step'], 'bytes_seen_total_run': curve['bytes'],
        'heldout_bpb_f32': round(before, 4), 'heldout_bpb_released_formats': round(after, 4),
        'heldout_bytes_scored': nb,
        'heldout_curve': curve['heldout'],
        'loss_curve_train_bpb': [c[:3] for c in curve['curve'][::10]],
        'drafter': drafter,
        'size_bytes': size, 'export_s': round(time.time() - t0, 1),
        'torch': torch.__version__,
    }
    with open(os.path.join(a.export, 'manifest.json'), 'w') as f:
        json.dump(man, f, indent=1)
    print('exported step %d to %s: %d bytes; held-out %.4f bpb (f32), %.4f bpb (released formats)'
          % (st['step'], a.export, size, before, after))
    return 0
