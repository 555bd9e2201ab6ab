"""export.py: the model's tensors as files cedar and the oracle read.

- `write_safetensors`: the safetensors container (an 8-byte header length, a
  JSON header of dtype / shape / data_offsets, then the data: the tensors
  tile it, in name order, with no gaps, as the official writer does).
- `cedar_weights`: a cedar weights file (docs/weights.md names, F32; the
  Engram tables as U8 rows of FP8 values then E8M0 scales), what the NumPy
  oracle reads.
- `released`: a checkpoint directory in the released DeepSeek-V4.1 layout
  (docs/checkpoints.md): config.json, the shards and their index, each
  tensor in the release's format: FP8 E4M3 with an E8M0 scale per 32 x 32
  tile for the projections, FP4 E2M1 experts with an E8M0 scale per 32 of a
  row, FP8 Engram rows, F32 for the mHC tensors, sinks and router biases,
  BF16 for the rest.
"""
import json
import os

import numpy as np

import quant as Q

ST_DTYPE = {np.dtype(np.float32): 'F32', np.dtype(np.uint8): 'U8', np.dtype(np.int8): 'I8',
            np.dtype(np.uint16): 'BF16', np.dtype(np.int64): 'I64', np.dtype(np.float64): 'F64'}


def write_safetensors(path, tensors, meta=None, dtypes=None):
    """tensors {name: array}; dtypes {name: safetensors dtype} overrides the
    array's (F8_E4M3 / F8_E8M0 for uint8 codes, BF16 for uint16 bits)."""
    dtypes = dtypes or {}
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        b = a.tobytes()
        header[name] = {'dtype': dtypes.get(name, ST_DTYPE[a.dtype]), 'shape': list(a.shape),
                        'data_offsets': [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta:
        header['__metadata__'] = {k: str(v) for k, v in meta.items()}
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * ((-len(h)) % 8)
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        f.write(len(h).to_bytes(8, 'little'))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return 8 + len(h) + off


def engram_u8(table):
    """An Engram table (rows, hd) as cedar's U8 rows: hd E4M3 codes, hd/32 E8M0 scales."""
    q, sc, deq = Q.fp8_rows(table)
    return np.concatenate([q, sc], axis=1).astype(np.uint8), deq


def cedar_weights(named):
    """{name: F32 array (Engram tables U8)} from {name: tensor}."""
    out = {}
    for name, p in named.items():
        a = p.detach().cpu().double().numpy()
        out[name] = engram_u8(a)[0] if name.endswith('engram.table') else a.astype(np.float32)
    return out


FP8 = ('attn.wq_a', 'attn.wq_b', 'attn.wkv', 'attn.wo_b', 'attn.indexer.wq_b', 'engram.wkv', 'main_proj')
SHARED = {'ffn.shared.w_gate': 'ffn.shared_experts.w1', 'ffn.shared.w_up': 'ffn.shared_experts.w3',
          'ffn.shared.w_down': 'ffn.shared_experts.w2'}
EXPERTS = {'ffn.experts.w_gate': 'w1', 'ffn.experts.w_up': 'w3', 'ffn.experts.w_down': 'w2'}
RENAMED = {'embed': 'embed.weight', 'norm': 'norm.weight', 'lm_head': 'head.weight',
           'attn.sink': 'attn.attn_sink', 'engram.q_w': 'engram.q_weight', 'engram.k_w': 'engram.k_weight'}
F32 = ('attn.sink',)


def released_tensors(named):
    """({released name: array}, {name: dtype}, {cedar name: dequantized float64}):
    every tensor in its release format, and the values a loader gets back."""
    out, dt, deq = {}, {}, {}

    def bf16(n, a):
        out[n] = Q.bf16_bits(a)
        dt[n] = 'BF16'
        return Q.bf16_value(out[n]).astype(np.float64)

    def fp8(n, a):
        q, sc, d = Q.fp8_tiles(a)
        out[n + '.weight'], out[n + '.scale'] = q, sc
        dt[n + '.weight'], dt[n + '.scale'] = 'F8_E4M3', 'F8_E8M0'
        return d

    for name, p in named.items():
        a = p.detach().cpu().double().numpy()
        pre, rest = '', name
        if name.startswith(('layers.', 'mtp.')):
            i = name.index('.', name.index('.') + 1) + 1
            pre, rest = name[:i], name[i:]
        if rest.startswith(('hc_attn.', 'hc_ffn.')) or rest in F32:
            n = pre + (rest.replace('.', '_') if rest.startswith('hc_') else RENAMED[rest])
            out[n] = a.astype(np.float32)
            deq[name] = out[n].astype(np.float64)
        elif rest in FP8:
            deq[name] = fp8(pre + rest, a)
        elif rest == 'attn.wo_a':
            G, o, k = a.shape
            deq[name] = fp8(pre + rest, a.reshape(G * o, k)).reshape(G, o, k)
        elif rest in SHARED:
            deq[name] = fp8(pre + SHARED[rest], a)
        elif rest in EXPERTS:
            ds = []
            for e in range(a.shape[0]):
                n = '%sffn.experts.%d.%s' % (pre, e, EXPERTS[rest])
                packed, sc, d = Q.fp4_rows(a[e])
                out[n + '.weight'], out[n + '.scale'] = packed, sc
                dt[n + '.weight'], dt[n + '.scale'] = 'I8', 'F8_E8M0'
                ds.append(d)
            deq[name] = np.stack(ds)
        elif rest == 'ffn.bias':
            out[pre + 'ffn.gate.bias'] = a[0].astype(np.float32)
            out[pre + 'ffn.gate.bias_vl'] = a[1].astype(np.float32)
            deq[name] = a.astype(np.float32).astype(np.float64)
        elif rest == 'engram.table':
            q, sc, d = Q.fp8_rows(a)
            out[pre + 'engram.embed.weight'], out[pre + 'engram.embed.scale'] = q, sc
            dt[pre + 'engram.embed.weight'], dt[pre + 'engram.embed.scale'] = 'F8_E4M3', 'F8_E8M0'
            deq[name] = d
        else:
            deq[name] = bf16(pre + RENAMED.get(rest, rest + '.weight'), a)
    return out, dt, deq


def released(named, config, outdir, shard_bytes=8 << 20, meta=None):
    """Writes config.json, model-0000k-of-0000n.safetensors and the index into outdir."""
    out, dt, deq = released_tensors(named)
    os.makedirs(outdir, exist_ok=True)
    for f in os.listdir(outdir):
        if f.endswith('.safetensors') or f == 'model.safetensors.index.json':
            os.remove(os.path.join(outdir, f))
    names = sorted(out)
    shards, cur, size = [], [], 0
    for n in names:
        b = out[n].nbytes
        if cur and size + b > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(n)
        size += b
    shards.append(cur)
    wm, total = {}, 0
    for i, group in enumerate(shards):
        fn = 'model-%05d-of-%05d.safetensors' % (i + 1, len(shards))
        write_safetensors(os.path.join(outdir, fn), {n: out[n] for n in group}, meta,
                          {n: dt[n] for n in group if n in dt})
        for n in group:
            wm[n] = fn
            total += out[n].nbytes
    with open(os.path.join(outdir, 'model.safetensors.index.json'), 'w') as f:
        json.dump({'metadata': {'total_size': total}, 'weight_map': wm}, f, indent=1, sort_keys=True)
    with open(os.path.join(outdir, 'config.json'), 'w') as f:
        json.dump(config, f, indent=2)
    return deq
