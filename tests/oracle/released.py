"""The oracle's own reader of a checkpoint directory in the released
DeepSeek-V4.1 layout, written from the safetensors format description
(st.py) and Appendix V's "Checkpoint layout" (../shared/SPEC-V41.md), not
from cedar's C.

Directory: config.json, model.safetensors.index.json (weight_map: tensor ->
shard file) and the shards, or one model.safetensors.  Released dtypes:
  F8_E4M3  sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
           subnormal (m/8 * 2^-6); S.1111.111 is NaN; no infinities.
  F8_E8M0  2^(code - 127); 0xFF is NaN.
  I8 experts: two E2M1 codes per byte, the even column in the low nibble;
           E2M1 = sign, 2 exponent bits (bias 1), 1 mantissa bit:
           magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
  FP8 weight `X.weight` [r, c] with `X.scale` F8_E8M0 [ceil(r/32), ceil(c/32)]:
           w = e4m3 * 2^(s - 127) per 32 x 32 tile.
  FP4 expert `...{e}.wN.weight` I8 [r, c/2] with `.scale` [r, c/32]: per row,
           32 columns share a scale.
  Engram `engram.embed.weight` F8_E4M3 [rows, hd] + `engram.embed.scale`
           F8_E8M0 [rows, hd/32]; cedar's row layout (docs/weights.md) is the
           hd E4M3 bytes followed by the hd/32 E8M0 bytes.
Names (docs/weights.md's on the left):
  embed/norm/lm_head <- embed.weight/norm.weight/head.weight;
  layers.L.X         <- layers.L.X.weight, except hc_attn.fn <- hc_attn_fn (and
                        .scale/.base, hc_ffn), attn.sink <- attn.attn_sink,
                        ffn.bias <- [ffn.gate.bias; ffn.gate.bias_vl],
                        ffn.experts.w_gate/w_up/w_down <- ffn.experts.{e}.w1/w3/w2,
                        ffn.shared.* <- ffn.shared_experts.w1/w3/w2,
                        engram.table <- engram.embed.{weight,scale},
                        engram.q_w/k_w <- engram.q_weight/k_weight;
  attn.wo_a (G, o_rank, H dh / G) is the released [G o_rank, H dh / G] viewed 3-D.
The release has no head.hc.* (Appendix V #4): those are reported missing.

    python3 tests/oracle/released.py DIR --plan P.yaml --out W.safetensors

writes the tensors of plan P as a cedar weights file (F32, Engram U8) for
oracle.py; the checkpoint's tensors the plan does not use are listed.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle as O  # noqa: E402
import plan as P  # noqa: E402
import st as ST  # noqa: E402

RAW = {'BF16': '<u2', 'F8_E4M3': 'u1', 'F8_E8M0': 'u1'}  # read as raw codes, decoded below


def e4m3(code):
    c = code.astype(np.int64)
    s = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 15
    m = c & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    return (s * v).astype(np.float32)


def e8m0(code):
    c = code.astype(np.int64)
    return np.where(c == 255, np.nan, 2.0 ** (c - 127)).astype(np.float32)


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def bf16(u):
    return (u.astype(np.uint32) << 16).view(np.float32)


class Checkpoint:
    def __init__(self, d):
        self.dir = d
        idx = os.path.join(d, 'model.safetensors.index.json')
        if os.path.exists(idx):
            wm = json.load(open(idx))['weight_map']
        else:
            wm = None
        self.files, self.where = {}, {}
        shards = sorted(set(wm.values())) if wm else ['model.safetensors']
        for s in shards:
            if '/' in s or s.startswith('.') or not s.endswith('.safetensors'):
                raise ValueError('%s: shard name %r leaves the directory' % (idx, s))
            self.files[s] = _open(os.path.join(d, s))
            for n in self.files[s].names:
                if wm is not None and wm.get(n) != s:
                    raise ValueError('%s: tensor %r is not where the index says' % (s, n))
                self.where[n] = s
        if wm is not None and set(wm) != set(self.where):
            raise ValueError('%s: index and shards list different tensors' % d)
        self.used = set()

    def raw(self, name, dtype, shape):
        if name not in self.where:
            raise KeyError(name)
        f = self.files[self.where[name]]
        dt, sh = f.dtype(name), tuple(f.shape(name))
        ok = dt in dtype if isinstance(dtype, tuple) else dt == dtype
        if not ok or sh != tuple(shape):
            raise ValueError('%s: %s %s, expected %s %s' % (name, dt, sh, dtype, tuple(shape)))
        self.used.add(name)
        return dt, f[name]

    def floats(self, name, shape):
        dt, a = self.raw(name, ('F32', 'BF16'), shape)
        return a.astype(np.float32) if dt == 'F32' else bf16(a)

    def fp8(self, name, rows, cols):
        _, q = self.raw(name + '.weight', 'F8_E4M3', (rows, cols))
        _, s = self.raw(name + '.scale', 'F8_E8M0', (-(-rows // 32), -(-cols // 32)))
        sc = np.repeat(np.repeat(e8m0(s), 32, axis=0), 32, axis=1)[:rows, :cols]
        return e4m3(q) * sc

    def fp4(self, name, rows, cols):
        _, q = self.raw(name + '.weight', 'I8', (rows, cols // 2))
        _, s = self.raw(name + '.scale', 'F8_E8M0', (rows, cols // 32))
        b = q.view(np.uint8)
        codes = np.empty((rows, cols), dtype=np.uint8)
        codes[:, 0::2] = b & 15
        codes[:, 1::2] = b >> 4
        return E2M1[codes] * np.repeat(e8m0(s), 32, axis=1)


def _open(path):
    for k, v in RAW.items():
        ST.DTYPES.setdefault(k, v)  # reading only; st.write keeps its own name table
    return ST.SafeTensors(path)


FP8 = ('attn.wq_a', 'attn.wq_b', 'attn.wkv', 'attn.wo_b', 'attn.indexer.wq_b', 'engram.wkv', 'main_proj')
SHARED = {'ffn.shared.w_gate': 'ffn.shared_experts.w1', 'ffn.shared.w_up': 'ffn.shared_experts.w3',
          'ffn.shared.w_down': 'ffn.shared_experts.w2'}
EXPERTS = {'ffn.experts.w_gate': 'w1', 'ffn.experts.w_up': 'w3', 'ffn.experts.w_down': 'w2'}
RENAMED = {'embed': 'embed.weight', 'norm': 'norm.weight', 'lm_head': 'head.weight', 'attn.sink': 'attn.attn_sink',
           'engram.q_w': 'engram.q_weight', 'engram.k_w': 'engram.k_weight'}


def tensor(ck, name, shape):
    """One of docs/weights.md's tensors from the checkpoint."""
    pre, rest = '', name
    if name.startswith(('layers.', 'mtp.')):          # a block, or the drafter's (Appendix V #24)
        i = name.index('.', name.index('.') + 1) + 1
        pre, rest = name[:i], name[i:]
    if rest.startswith('head.hc.'):
        raise KeyError('%s (the release has none: Appendix V #4)' % name)
    if rest.startswith(('hc_attn.', 'hc_ffn.')):
        return ck.floats(pre + rest.replace('.', '_'), shape)
    if rest in FP8:
        return ck.fp8(pre + rest, shape[0], shape[1])
    if rest == 'attn.wo_a':
        return ck.fp8(pre + rest, shape[0] * shape[1], shape[2]).reshape(shape)
    if rest in SHARED:
        return ck.fp8(pre + SHARED[rest], shape[0], shape[1])
    if rest in EXPERTS:
        return np.stack([ck.fp4('%sffn.experts.%d.%s' % (pre, e, EXPERTS[rest]), shape[1], shape[2])
                         for e in range(shape[0])])
    if rest == 'ffn.bias':
        return np.stack([ck.floats(pre + 'ffn.gate.bias', (shape[1],)), ck.floats(pre + 'ffn.gate.bias_vl', (shape[1],))])
    if rest == 'engram.table':
        hd = (shape[1] * 32) // 33
        _, q = ck.raw(pre + 'engram.embed.weight', 'F8_E4M3', (shape[0], hd))
        _, s = ck.raw(pre + 'engram.embed.scale', 'F8_E8M0', (shape[0], hd // 32))
        return np.concatenate([q, s], axis=1).astype(np.uint8)
    return ck.floats(pre + RENAMED.get(rest, rest + '.weight'), shape)


def convert(d, plan_path, out):
    plan = P.load(plan_path)
    ck = Checkpoint(d)
    tensors, missing = {}, []
    for name, (_, shape) in O.weight_shapes(plan).items():
        if name.startswith('head.hc.') and not plan.model['mhc'].get('merge') == 'learned':
            continue
        try:
            tensors[name] = tensor(ck, name, shape)
        except KeyError as e:
            missing.append(str(e))
    unused = sorted(n for n in set(ck.where) - ck.used if not n.startswith(('mtp.', 'vision.', 'aligner.', 'image_')))
    if out:
        ST.write(out, tensors)
    return tensors, missing, unused


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('dir')
    ap.add_argument('--plan', required=True)
    ap.add_argument('--out')
    a = ap.parse_args(argv)
    _, missing, unused = convert(a.dir, a.plan, a.out)
    for m in missing:
        print('missing: %s' % m, file=sys.stderr)
    for u in unused:
        print('not used by the plan: %s' % u, file=sys.stderr)
    return 1 if missing or unused else 0


if __name__ == '__main__':
    sys.exit(main())
