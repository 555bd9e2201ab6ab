"""cedar_equal.py: cedar reads the trained checkpoint as the torch model computes it.

Three readings of one checkpoint directory in the released layout (the
committed models/v41-byte, or DIR): cedar (`cedar run --model DIR --plan
tests/oracle/plans/v41-byte-f32.yaml --dump`, fp32 numerics, exact caches,
own-source index keys: the forms the torch model computes), the oracle's
own reader of the released formats (tests/oracle/released.py: FP8, FP4,
BF16 dequantized, independent of train/export.py, which wrote them) and
the torch model (train/model.py, float64) on those values with the Engram
token map of the checkpoint's tokenizer (train/tokenizer.py; cedar builds
its own from tokenizer.json). The prompt is English bytes; cedar prefills
it (every position runs every layer: it is shorter than the decoder
replay) and decodes 4 greedy steps; torch runs the prompt and the consumed
picks in one forward. Every row of logits must agree within the bound
80 K 2^-24 max|logit| (cedar computes in fp32; K = hc x hidden, the
longest reduction; 80 sublayers: oracle_equal.py says why), and every
greedy pick must be torch's argmax.

    /usr/bin/python3 tests/train/cedar_equal.py CEDAR [DIR] [WORK]

Exit 0 = agree, 1 = differ, 77 = torch or numpy absent, or no DIR.
"""
import os
import subprocess
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
from model import V41, cedar_names  # noqa: E402
from tokenizer import engram_map  # noqa: E402
import formats as FM  # noqa: E402
import released as R  # noqa: E402
import st as ST  # noqa: E402

PROMPT = b'And God said, Let there be light: and there was light. And God saw the light, that it was good'
STEPS = 4


def main():
    cedar = sys.argv[1]
    d = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, 'models', 'v41-byte')
    work = sys.argv[3] if len(sys.argv) > 3 else '/tmp/train_cedar_equal'
    if not os.path.exists(os.path.join(d, 'config.json')):
        print('skip: %s has no config.json' % d)
        return 77
    os.makedirs(work, exist_ok=True)
    plan = os.path.join(ROOT, 'tests', 'oracle', 'plans', 'v41-byte-f32.yaml')
    dump = os.path.join(work, 'cedar.safetensors')
    ids = ','.join(str(b) for b in PROMPT)
    r = subprocess.run([cedar, 'run', '--model', d, '--plan', plan, '--tokens', ids,
                        '--max-new', str(STEPS + 1), '--dump', dump], capture_output=True, text=True)
    if r.returncode != 0:
        print('cedar run failed:\n%s%s' % (r.stdout, r.stderr))
        return 1
    if "the tokenizer's normalized token map" not in r.stdout:
        print('cedar did not use the checkpoint tokenizer\'s Engram map:\n%s' % r.stdout)
        return 1
    cfg = Config(os.path.join(d, 'config.json'))
    m = V41(cfg)
    m.cmap = engram_map(cfg.vocab)[0]
    ts, missing, unused = R.convert(d, plan, None)
    if missing or unused:
        print('released.py: missing %s, unused %s' % (missing[:3], unused[:3]))
        return 1
    with torch.no_grad():
        for n, p in cedar_names(m).items():
            a = ts[n]
            if n.endswith('engram.table'):
                a = FM.engram_row_unpack(a, cfg.engram_hd)
            p.copy_(torch.as_tensor(np.asarray(a, np.float64)))
    m = m.double()
    m.store = V41.store_f32
    f = ST.SafeTensors(dump)
    toks = np.array(f["tokens"], np.int64)
    pos = np.asarray(f['prefill.positions'])
    rows = [np.asarray(f['prefill.logits'], np.float64)]
    if 'decode.logits' in f.names:
        rows.append(np.asarray(f['decode.logits'], np.float64))
    ref = np.concatenate(rows)
    at = np.concatenate([pos, np.arange(len(PROMPT), len(toks))])
    torch.set_num_threads(1)
    with torch.no_grad():
        seq = torch.as_tensor(toks[None])
        lg = m(seq, m.engram_rows(seq))[0][0].numpy()[at]
    err = np.abs(lg - ref).max()
    scale = np.abs(ref).max()
    bound = 80 * cfg.hc * cfg.d * 2.0 ** -24 * scale
    picks = toks[len(PROMPT):]                        # the consumed greedy picks
    torch_picks = lg[len(pos) - 1:len(pos) - 1 + len(picks)].argmax(1)
    ok = err <= bound and (picks == torch_picks).all() and len(at) == len(PROMPT) + STEPS
    print('cedar vs torch on %s: %d rows (%d prefill, %d decode), max |diff| %.3g, bound %.3g (ratio %.3g), '
          'max |logit| %.3g, greedy picks %s: %s' % (d, len(at), len(pos), len(at) - len(pos), err, bound,
                                                      err / bound, scale, 'equal' if (picks == torch_picks).all()
                                                      else 'DIFFER', 'ok' if ok else 'FAILED'))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
