"""An independent NumPy oracle of the forward pass cedar computes.

Written from /work/shared/SPEC.md (s1-4, s6, Appendix R), docs/model.md,
docs/weights.md, docs/formats.md, docs/plans.md and docs/safetensors.md only;
it shares no code with cedar.  Arithmetic is float64 everywhere except at the
points docs/model.md marks "store" (SWA ring entries, Main-KV and Indexer-K
global entries): there a value is packed to the plan's storage format and
read back, exactly as docs/formats.md defines the codecs (formats.py), so the
oracle attends over the same values cedar's caches hold.

    from oracle import Oracle
    o = Oracle('plans/v41-mini.yaml', 'weights.safetensors')
    r = o.prefill(tokens)          # r.last: logits of the last position
    logits = o.decode(next_tok)    # one decode step (all layers)

See README.md for the flows, counters and the list of readings of the docs.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import formats as F  # noqa: E402
import plan as P  # noqa: E402
import st as ST  # noqa: E402

MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------- small math


def rms(x, w=None, eps=1e-6):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def silu(x):
    return x * sigmoid(x)


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def topk_lower_index(scores, cand, k):
    """Per row: indices of the top min(k, #cand) scores among cand (ties to the
    lower index), padded with -1.  Returns (rows, k) int64."""
    S = np.where(cand, scores, -np.inf)
    order = np.argsort(-S, axis=1, kind='stable')[:, :k]
    cnt = np.minimum(cand.sum(axis=1), k)
    out = order.astype(np.int64)
    if out.shape[1] < k:
        out = np.concatenate([out, np.full((out.shape[0], k - out.shape[1]), -1, np.int64)], axis=1)
    out[np.arange(k)[None, :] >= cnt[:, None]] = -1
    return out


def mask_from_indices(idx, n):
    m = np.zeros((idx.shape[0], n + 1), bool)
    np.put_along_axis(m, np.where(idx < 0, n, idx), True, axis=1)
    return m[:, :n]


# ---------------------------------------------------------------- RoPE (SPEC 1.1, R.2)


def yarn_correction_range(beta_fast, beta_slow, dim, base, orig_len):
    def cdim(rot):
        return dim * math.log(orig_len / (rot * 2 * math.pi)) / (2 * math.log(base))
    low = math.floor(cdim(beta_fast))
    high = math.ceil(cdim(beta_slow))
    return max(low, 0), min(high, dim - 1)


def rope_freqs(p, rope_dim):
    """Angular frequency of each adjacent pair (2i, 2i+1) of a rope_dim slice."""
    theta = float(p['theta'])
    i = np.arange(rope_dim // 2, dtype=np.float64)
    freqs = 1.0 / theta ** (2.0 * i / rope_dim)
    if p.get('yarn'):
        if p.get('yarn_mscale'):
            raise NotImplementedError('yarn_mscale: docs/model.md does not define it')
        low, high = yarn_correction_range(float(p['yarn_beta_fast']), float(p['yarn_beta_slow']),
                                          rope_dim, theta, float(p['yarn_original_len']))
        if low == high:
            high += 0.001
        ramp = np.clip((i - low) / (high - low), 0.0, 1.0)
        smooth = 1.0 - ramp
        factor = float(p['yarn_factor'])
        freqs = freqs / factor * (1.0 - smooth) + freqs * smooth
    if p.get('angle', 'f64') == 'f32':      # Appendix V #8 (plans default to f32: plan.py): the vendor's fp32 t*freq products
        return freqs.astype(np.float32)
    return freqs


def rope(x, pos, freqs, rope_dim, where='last', inverse=False):
    """Rotate adjacent pairs of the last (or first) rope_dim channels of x
    (..., width) by pos * freq; pos has x's first axis.  Angles in float64,
    except for a float32 table (rope_freqs with `angle: f32`): then the angle
    is the float32 product float32(pos) * freq, and cos/sin are float64 of it."""
    x = np.array(x, dtype=np.float64, copy=True)
    sl = slice(x.shape[-1] - rope_dim, None) if where == 'last' else slice(0, rope_dim)
    if freqs.dtype == np.float32:
        ang = (np.asarray(pos).astype(np.float32)[:, None] * freqs[None, :]).astype(np.float64)
    else:
        ang = np.asarray(pos, np.float64)[:, None] * freqs[None, :]
    if inverse:
        ang = -ang
    shape = (ang.shape[0],) + (1,) * (x.ndim - 2) + (ang.shape[1],)
    c, s = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
    r = x[..., sl]
    x0, x1 = r[..., 0::2].copy(), r[..., 1::2].copy()
    r[..., 0::2] = x0 * c - x1 * s
    r[..., 1::2] = x0 * s + x1 * c
    x[..., sl] = r
    return x


# ---------------------------------------------------------------- Engram addresses (R.8)


# ---------------------------------------------------------------- activation numerics
# Appendix V #22 (SPEC-V41.md): the vendor keeps activations in bf16 between
# sublayers and runs its FP8 linears as MXFP8 (weights static, activations
# quantized per 32 with an E8M0 scale).  docs/model.md s7 names the points.

MXFP8_BLOCK = 32          # values per E8M0 scale of an FP8 linear's input (#22)
MXFP8_AMAX_FLOOR = 1e-4   # s = 2^ceil(log2(max(amax, 1e-4) / 448)): #21's PYP/ATOM floor (open)


def to_bf16(x):
    """x as the vendor holds it between sublayers: the float32 value rounded
    to the nearest bf16, ties to even (formats.bf16_round)."""
    return F.bf16_round(x)


def mxfp8(x, block=MXFP8_BLOCK):
    """Quantize-dequantize along the last axis in blocks of `block` values
    (a last, shorter block when block does not divide it): per block
    s = 2^ceil(log2(max(amax, 1e-4) / 448)), x = RNE_E4M3(x / s) * s with
    E4M3 saturating at 448; x / s is exact (s a power of two)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    W = x.shape[-1]
    for b0 in range(0, W, block):
        xb = x[..., b0:b0 + block]
        amax = np.max(np.abs(xb), axis=-1, keepdims=True)
        s = np.ldexp(1.0, F.e8m0_floor_byte(np.maximum(amax, MXFP8_AMAX_FLOOR) / 448.0) - 127)
        out[..., b0:b0 + block] = np.sign(xb) * F.e4m3_rne_magnitude(np.abs(xb) / s) * s
    return out


def splitmix64_stream(seed, n):
    s = seed & MASK64
    out = []
    for _ in range(n):
        s = (s + 0x9E3779B97F4A7C15) & MASK64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        out.append(z ^ (z >> 31))
    return out


def engram_multipliers_splitmix64(seed, layer, n):
    """cedar's older scheme (plan `multipliers: splitmix64`): splitmix64(seed + 10007 l), made odd."""
    return [m | 1 for m in splitmix64_stream(seed + 10007 * layer, n)]


def engram_multipliers(layer, n, compressed_vocab):
    """Appendix V #18, the vendor's: numpy's own default_rng(10007 l) (PCG64
    seeded through SeedSequence), integers(0, (INT64_MAX // Vc) // 2, n,
    int64) * 2 + 1 with Vc the compressed vocabulary. Returned as uint64 bit
    patterns (all are positive here)."""
    hi = (np.iinfo(np.int64).max // int(compressed_vocab)) // 2
    m = np.random.default_rng(10007 * layer).integers(0, hi, size=n, dtype=np.int64) * 2 + 1
    return [int(x) & MASK64 for x in m]


def engram_row(h, prime, hash_mod):
    """One hash (uint64 bits of the int64 XOR) to a row: Appendix V #18's int64
    floor modulo ('signed_floor', Python's %), or the older uint64 modulo."""
    if hash_mod == 'unsigned':
        return h % np.uint64(prime)
    return np.mod(h.view(np.int64), np.int64(prime)).astype(np.uint64)


def is_prime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    i = 3
    while i * i <= n:
        if n % i == 0:
            return False
        i += 2
    return True


def engram_primes(model, engram_layers):
    """SPEC 3.15 / R.8 prime rule, one increasing run across modules in layer
    order, then orders, then heads, starting above table_base - 1.
    Returns {layer: [[prime per head] per order]}."""
    e = model['engram']
    cur = int(e['table_base']) - 1
    out = {}
    for l in engram_layers:
        per = []
        for _ in e['orders']:
            hp = []
            for _ in range(int(e['heads'])):
                cur += 1
                while not is_prime(cur):
                    cur += 1
                hp.append(cur)
            per.append(hp)
        out[l] = per
    return out


# ---------------------------------------------------------------- weights (docs/weights.md)


def weight_shapes(plan):
    """{name: (dtype, shape)} of every tensor the plan needs."""
    m = plan.model
    d, V, hc = m['hidden'], m['vocab'], m['mhc']['streams']
    at = m['attention']
    H, dh, qr, G, orank = at['heads'], at['head_dim'], at['q_rank'], at['o_groups'], at['o_rank']
    ix = m['indexer']
    HI, dI = ix['heads'], ix['head_dim']
    mo = m['moe']
    R, I = mo['routed_experts'], mo['inter_dim']
    S = mo['shared_experts'] * mo['shared_inter_dim']
    mm = (2 + hc) * hc
    w = {'embed': ('F32', (V, d)), 'norm': ('F32', (d,)), 'lm_head': ('F32', (V, d))}
    if m['mhc'].get('merge', 'carried') == 'learned':      # V4's hc_head; V4.1 has none (Appendix V #4)
        w.update({'head.hc.fn': ('F32', (hc, hc * d)), 'head.hc.scale': ('F32', (1,)),
                  'head.hc.base': ('F32', (hc,))})
    eg = [L['at'] for L in plan.layers if L['engram']]
    primes = engram_primes(m, eg)
    for L in plan.layers:
        p = 'layers.%d.' % L['at']
        w.update({p + 'attn_norm': ('F32', (d,)), p + 'ffn_norm': ('F32', (d,))})
        for s in ('hc_attn', 'hc_ffn'):
            w.update({p + s + '.fn': ('F32', (mm, hc * d)), p + s + '.scale': ('F32', (3,)),
                      p + s + '.base': ('F32', (mm,))})
        w.update({p + 'attn.wq_a': ('F32', (qr, d)), p + 'attn.q_norm': ('F32', (qr,)),
                  p + 'attn.wq_b': ('F32', (H * dh, qr)), p + 'attn.wkv': ('F32', (dh, d)),
                  p + 'attn.kv_norm': ('F32', (dh,)),
                  p + 'attn.wo_a': ('F32', (G, orank, H * dh // G)),
                  p + 'attn.wo_b': ('F32', (d, G * orank)),
                  p + 'ffn.gate': ('F32', (R, d)), p + 'ffn.bias': ('F32', (2, R)),
                  p + 'ffn.experts.w_gate': ('F32', (R, I, d)),
                  p + 'ffn.experts.w_up': ('F32', (R, I, d)),
                  p + 'ffn.experts.w_down': ('F32', (R, d, I))})
        if at.get('sink', True):
            w[p + 'attn.sink'] = ('F32', (H,))
        if mo['shared_experts'] > 0:
            w.update({p + 'ffn.shared.w_gate': ('F32', (S, d)), p + 'ffn.shared.w_up': ('F32', (S, d)),
                      p + 'ffn.shared.w_down': ('F32', (d, S))})
        if L['mode'] in ('full', 'reindex'):
            w.update({p + 'attn.indexer.wq_b': ('F32', (HI * dI, qr)),
                      p + 'attn.indexer.weights_proj': ('F32', (HI, d))})
        if L['mode'] == 'full':
            w.update({p + 'attn.compressor.wkv': ('F32', (dh, d)),
                      p + 'attn.compressor.norm': ('F32', (dh,)),
                      p + 'attn.indexer.wk': ('F32', (dI, dh))})
            if L['ratio'] > 1:
                w[p + 'attn.compressor.wgate'] = ('F32', (dh, d))
            if ix.get('k_norm'):
                w[p + 'attn.indexer.k_norm'] = ('F32', (dI,))
        if L['engram']:
            e = m['engram']
            hd = e['head_dim']
            rows = sum(sum(h) for h in primes[L['at']])
            n_in = len(e['orders']) * e['heads'] * hd
            w.update({p + 'engram.table': ('U8', (rows, hd + hd // 32)),
                      p + 'engram.wkv': ('F32', ((hc + 1) * d, n_in)),
                      p + 'engram.q_w': ('F32', (hc, d)), p + 'engram.k_w': ('F32', (hc, d))})
    w.update(drafter_shapes(plan))
    return w


def dspark(m):
    """model.dspark with SPEC 1.5's defaults (Appendix V #24, config.json's dspark_*)."""
    ds = {'blocks': 3, 'window': 128, 'draft': 5, 'markov_rank': 256, 'routed_experts': 128,
          'active_experts': 3, 'noise_token': 128799, 'target_layers': [37, 38, 39]}
    ds.update(m.get('dspark') or {})
    return ds


def drafter_shapes(plan):
    """The DSpark drafter's tensors (Appendix V #24, docs/weights.md): blocks
    mtp.{k} with every layer's tensors (window-only: no indexer, no
    compressor) and dspark.routed_experts experts; main_proj (d, targets d)
    and main_norm on mtp.0; norm, the Markov head (V, rank) x 2 and the
    confidence head (1, d + rank) on the last block."""
    m = plan.model
    ds = dspark(m)
    nb = int(ds['blocks'])
    if nb <= 0:
        return {}
    d, V, hc = m['hidden'], m['vocab'], m['mhc']['streams']
    at = m['attention']
    H, dh, qr, G, orank = at['heads'], at['head_dim'], at['q_rank'], at['o_groups'], at['o_rank']
    mo = m['moe']
    R, I, S = int(ds['routed_experts']), mo['inter_dim'], mo['shared_experts'] * mo['shared_inter_dim']
    mm, rank = (2 + hc) * hc, int(ds['markov_rank'])
    w = {}
    for k in range(nb):
        p = 'mtp.%d.' % k
        w.update({p + 'attn_norm': ('F32', (d,)), p + 'ffn_norm': ('F32', (d,))})
        for s in ('hc_attn', 'hc_ffn'):
            w.update({p + s + '.fn': ('F32', (mm, hc * d)), p + s + '.scale': ('F32', (3,)),
                      p + s + '.base': ('F32', (mm,))})
        w.update({p + 'attn.wq_a': ('F32', (qr, d)), p + 'attn.q_norm': ('F32', (qr,)),
                  p + 'attn.wq_b': ('F32', (H * dh, qr)), p + 'attn.wkv': ('F32', (dh, d)),
                  p + 'attn.kv_norm': ('F32', (dh,)), p + 'attn.wo_a': ('F32', (G, orank, H * dh // G)),
                  p + 'attn.wo_b': ('F32', (d, G * orank)), p + 'ffn.gate': ('F32', (R, d)),
                  p + 'ffn.bias': ('F32', (2, R)), p + 'ffn.experts.w_gate': ('F32', (R, I, d)),
                  p + 'ffn.experts.w_up': ('F32', (R, I, d)), p + 'ffn.experts.w_down': ('F32', (R, d, I))})
        if at.get('sink', True):
            w[p + 'attn.sink'] = ('F32', (H,))
        if S > 0:
            w.update({p + 'ffn.shared.w_gate': ('F32', (S, d)), p + 'ffn.shared.w_up': ('F32', (S, d)),
                      p + 'ffn.shared.w_down': ('F32', (d, S))})
    last = 'mtp.%d.' % (nb - 1)
    w.update({'mtp.0.main_proj': ('F32', (d, len(ds['target_layers']) * d)), 'mtp.0.main_norm': ('F32', (d,)),
              last + 'norm': ('F32', (d,)), last + 'markov_head.embed': ('F32', (V, rank)),
              last + 'markov_head.head': ('F32', (V, rank)), last + 'confidence_head.proj': ('F32', (1, d + rank))})
    return w


class Weights:
    """Tensors of a safetensors file, checked against the plan, read as float64
    (routed-expert banks stay float32 and are cast per expert on use)."""

    def __init__(self, path, plan):
        self.f = ST.SafeTensors(path)
        self.expected = weight_shapes(plan)
        errs = []
        for name, (dt, shape) in self.expected.items():
            if name not in self.f:
                errs.append('missing tensor %s %s' % (name, shape))
            elif self.f.dtype(name) != dt or tuple(self.f.shape(name)) != tuple(shape):
                errs.append('tensor %s is %s %s, expected %s %s' % (
                    name, self.f.dtype(name), self.f.shape(name), dt, shape))
        if errs:
            raise ValueError('%s does not fit plan %s:\n  %s' % (path, plan.name, '\n  '.join(errs)))
        self.extra = sorted(set(self.f.names) - set(self.expected))
        self.meta = self.f.meta
        self._c = {}

    def __call__(self, name):
        a = self._c.get(name)
        if a is None:
            a = self.f[name]
            if a.dtype != np.uint8:
                a = a.astype(np.float64)
            self._c[name] = a
        return a

    def raw(self, name):
        return self.f[name]


# ---------------------------------------------------------------- per-forward context


class Forward:
    def __init__(self, kind, positions, r0):
        self.kind, self.r0 = kind, r0
        self.positions = (int(positions[0]), int(positions[-1]) + 1)
        self.topk = {}        # Top-K bus: layer -> (nP, topk) entry indices, -1 padded
        self.pool = {}        # candidate-pool bus: layer -> (nP, n_entries) bool
        self.layers = {}      # layer -> stats


class PrefillResult:
    def __init__(self, logits, positions):
        self.logits = logits              # (n, V): every position that ran through all layers
        self.positions = positions        # (n,) their absolute positions
        self.last = logits[-1]            # the last prompt position: gives the first token


class Oracle:
    """Options (readings where docs/model.md leaves a choice; README.md):
    hash_mod: 'signed_floor' (default, Appendix V #18) -- the XOR hash is an
        int64, floor modulo the prime; 'unsigned' -- uint64 modulo (older).
    multipliers: None (the plan's model.engram.multipliers, default 'numpy')
        or 'numpy' / 'splitmix64' to override it.
    query_block: queries per attention/indexer block (memory only)."""

    def __init__(self, plan_path, weights_path, hash_mod='signed_floor', query_block=256, keep_buses=False,
                 multipliers=None):
        self.plan = P.Plan(plan_path)
        self.w = Weights(weights_path, self.plan)
        if hash_mod not in ('unsigned', 'signed_floor'):
            raise ValueError(hash_mod)
        self.hash_mod = hash_mod
        self.qb, self.keep_buses = int(query_block), keep_buses
        m = self.plan.model
        self.m = m
        self.d, self.V, self.hc = m['hidden'], m['vocab'], m['mhc']['streams']
        at = m['attention']
        self.H, self.dh, self.rd = at['heads'], at['head_dim'], at['rope_dim']
        self.G = at['o_groups']
        self.scale = float(at.get('softmax_scale') or 0.0) or 1.0 / math.sqrt(self.dh)
        self.sink = bool(at.get('sink', True))
        ix = m['indexer']
        self.HI, self.dI, self.rdI = ix['heads'], ix['head_dim'], ix['rope_dim']
        self.ipos = ix.get('rope_position', 'last')
        self.topk = int(ix['topk'])
        self.eps = float(m['norm_eps'])
        self.hc_eps = float(m['mhc']['eps'])
        self.W = self.plan.window
        self.fmt = self.plan.formats
        self.nib = self.fmt.get('nibble', 'low_first')
        if self.nib not in ('low_first', 'high_first'):
            raise ValueError('formats.nibble %r' % self.nib)
        # Appendix V #1-#4: pairing v41 carries each sublayer's own pre to the
        # next (one-hot start, head from the last FFN's); v4: own pre, head.hc
        self.pairing = m['mhc'].get('pairing', 'v41')
        self.merge = m['mhc'].get('merge', 'carried')
        if (self.pairing, self.merge) not in (('v41', 'carried'), ('v4', 'learned'), ('v4', 'sum')):
            raise ValueError('model.mhc pairing %r with merge %r' % (self.pairing, self.merge))
        self.q_head_norm = bool(at.get('q_head_norm', False))      # Appendix V #6
        self.k_norm = bool(ix.get('k_norm', True))                 # #11
        self.q_mxfp4 = bool(ix.get('q_mxfp4', True))               # #11
        self.pin = bool(m['candidates'].get('pin_newest', True))   # #12
        # #25: 'vendor' -- index layers score the Indexer-K of one shared slot,
        # which a KV source republishes only in a forward that completes one
        # of its groups; 'own_source' -- each its KV source's own keys
        self.key_slot = ix.get('key_slot', 'vendor')
        if self.key_slot not in ('vendor', 'own_source'):
            raise ValueError('model.indexer.key_slot %r' % self.key_slot)
        nm = m.get('numerics', {})                                 # #22 (docs/model.md s7)
        self.act_bf16 = nm.get('activations', 'bf16') == 'bf16'
        self.io_bf16 = nm.get('sublayer_io', 'bf16') == 'bf16'
        self.lin_mx = nm.get('linear_inputs', 'mxfp8') == 'mxfp8'
        self.follow, self._at = None, (0, np.zeros(0, np.int64))   # follow.py
        self.freqs = {'swa': rope_freqs(m['rope']['swa'], self.rd),
                      'csa': rope_freqs(m['rope']['csa'], self.rd)}
        self.ifreqs = {'swa': rope_freqs(m['rope']['swa'], self.rdI),
                       'csa': rope_freqs(m['rope']['csa'], self.rdI)}
        self.n_layers = len(self.plan.layers)
        self.enc = self.plan.encoder_layers
        self.dec = self.plan.decoder_layers
        self.first_dec = self.dec[0] if self.dec else None
        eg = [L['at'] for L in self.plan.layers if L['engram']]
        self.primes = engram_primes(m, eg)
        e = m['engram']
        scheme = multipliers or e.get('multipliers', 'numpy')
        if scheme not in ('numpy', 'splitmix64'):
            raise ValueError('model.engram.multipliers %r' % scheme)
        if scheme == 'numpy':
            self.mult = {l: engram_multipliers(l, max(e['orders']), e['compressed_vocab']) for l in eg}
        else:
            self.mult = {l: engram_multipliers_splitmix64(int(e.get('seed', 0)), l, max(e['orders'])) for l in eg}
        self.reset()

    # ------------------------------------------------------------ state
    def reset(self):
        self.tokens = []
        self.n = 0
        self.rings = {l: {'pos': np.zeros(0, np.int64), 'val': np.zeros((0, self.dh)),
                          'bytes': np.zeros((0, F.entry_bytes(self.dh, self.fmt['swa'])), np.uint8)}
                      for l in range(self.n_layers)}
        self.src = {}
        for L in self.plan.layers:
            if L['mode'] == 'full':
                self.src[L['at']] = {
                    'ratio': L['ratio'], 'main': np.zeros((0, self.dh)), 'ik': np.zeros((0, self.dI)),
                    'main_bytes': np.zeros((0, F.entry_bytes(self.dh, self.fmt['main_kv'])), np.uint8),
                    'ik_bytes': np.zeros((0, F.entry_bytes(self.dI, self.fmt['indexer_k'])), np.uint8),
                    'latent': np.zeros((0, self.dh)),
                    'tail_v': np.zeros((0, self.dh)), 'tail_g': np.zeros((0, self.dh)),
                    'tail_pos': np.zeros(0, np.int64), 'appends': 0}
        self.token_layers = np.zeros(self.n_layers, np.int64)
        self.log = []
        self.slot = None       # #25: the source whose Indexer-K the shared slot holds (outlives a forward)

    def entries(self, l):
        return len(self.src[l]['main'])

    def tail(self, l):
        return len(self.src[l]['tail_pos'])

    @property
    def total_token_layers(self):
        return int(self.token_layers.sum())

    # ------------------------------------------------------------ layer parts
    def lw(self, l, name):
        return self.w('layers.%d.%s' % (l, name))

    # numerics (Appendix V #22): the three rounding points' switches.  pt names
    # a point whose input carries rounding error, for the flip accounting
    # (follow.py: with self.follow set, a value within the fp32 error bound of a
    # rounding boundary takes cedar's side of it; self._at = (layer, positions))
    def _rx(self, X, pt=None):
        """numerics.activations: the residual streams after each update."""
        r = to_bf16(X) if self.act_bf16 else X
        return self.follow.bf16(pt, *self._at, X, r) if self.follow and pt and self.act_bf16 else r

    def _rio(self, x, pt=None):
        """numerics.sublayer_io: a sublayer's mixed input, normed input, output."""
        r = to_bf16(x) if self.io_bf16 else x
        return self.follow.bf16(pt, *self._at, x, r) if self.follow and pt and self.io_bf16 else r

    def _lin(self, x, pt=None):
        """numerics.linear_inputs: what an FP8-weight linear reads."""
        r = mxfp8(x) if self.lin_mx else x
        return self.follow.mxfp8(pt, *self._at, x, r) if self.follow and pt and self.lin_mx else r

    def _store(self, pt, l, pos, x, fmt):
        """F.store (a cache entry), or cedar's where follow certifies it."""
        b, v = F.store(x, fmt, self.nib)
        return self.follow.store(pt, l, pos, x, fmt, self.nib, b, v) if self.follow else (b, v)

    def _pick(self, pt, scores, cand, sel):
        """A selection (MoE experts, Top-K, pool blocks), or cedar's where follow certifies it."""
        return self.follow.select(pt, *self._at, scores, cand, sel) if self.follow else sel

    def _rope_kind(self, l):
        return 'swa' if self.plan.layers[l]['mode'] == 'swa_only' else 'csa'

    def _hc_mix(self, state, fn):
        xf = state.reshape(state.shape[0], -1)
        return (xf @ fn.T) / np.sqrt(np.mean(xf * xf, axis=1, keepdims=True) + self.eps)

    def _hc_pre(self, state, pfx):
        """R.7 H_pre of one sublayer from one state (nP, hc, d)."""
        hc = self.hc
        fn, sc, base = self.w(pfx + '.fn'), self.w(pfx + '.scale'), self.w(pfx + '.base')
        return sigmoid(self._hc_mix(state, fn[:hc]) * sc[0] + base[:hc]) + self.hc_eps

    def _hc_post_res(self, state, pfx):
        """R.7 H_post and H_res (Sinkhorn, R.7's order) of one sublayer from one state."""
        hc = self.hc
        fn, sc, base = self.w(pfx + '.fn'), self.w(pfx + '.scale'), self.w(pfx + '.base')
        mix = self._hc_mix(state, fn[hc:])
        post = 2.0 * sigmoid(mix[:, :hc] * sc[1] + base[hc:2 * hc])
        C = (mix[:, hc:] * sc[2] + base[2 * hc:]).reshape(-1, hc, hc)
        C = softmax(C, axis=-1) + self.hc_eps
        C = C / (C.sum(axis=-2, keepdims=True) + self.hc_eps)
        for _ in range(int(self.m['mhc']['sinkhorn_iters']) - 1):
            C = C / (C.sum(axis=-1, keepdims=True) + self.hc_eps)
            C = C / (C.sum(axis=-2, keepdims=True) + self.hc_eps)
        return post, C

    def _sublayer(self, X, P, pfx, norm_name, fn):
        """One mHC-wrapped sublayer on state X with carried pre P (nP, hc).
        Its own pre, post and C come from its own fn on X (Appendix V 1-5);
        pairing v41 mixes with P, v4 with its own.  Returns (X', own pre):
        the pre the next sublayer (or the head) mixes with under v41."""
        own = self._hc_pre(X, pfx)
        post, C = self._hc_post_res(X, pfx)
        pre = P if self.pairing == 'v41' else own
        k = 'attn' if 'hc_attn' in pfx else 'ffn'
        u = self._rio(np.matmul(pre[:, None, :], X)[:, 0], k + '.u')
        y = self._rio(fn(self._rio(rms(u, self.w(norm_name), self.eps), k + '.a')), k + '.y')
        Xn = post[:, :, None] * y[:, None, :] + np.matmul(C.transpose(0, 2, 1), X)
        return self._rx(Xn, k + '.x'), own

    def _a_in(self, l, X, P):
        """Layer l's attention input from the state entering it and the pre it
        carries in (v41) or its own (v4): what a decoder KV source compresses
        under CED (Appendix V #10; for the first decoder layer exactly its own
        attention input, for a later one (alt plans) the same rule on X^(E))."""
        pre = P if self.pairing == 'v41' else self._hc_pre(X, 'layers.%d.hc_attn' % l)
        u = self._rio(np.matmul(pre[:, None, :], X)[:, 0], 'dec.u')
        return self._rio(rms(u, self.lw(l, 'attn_norm'), self.eps), 'dec.a')

    def _onehot(self, n):
        """Appendix V #2: layer 0's attention mixes stream 0 only."""
        P = np.zeros((n, self.hc))
        P[:, 0] = 1.0
        return P

    # ------------------------------------------------------------ Engram (s5)
    def _engram(self, l, X, pos):
        e = self.m['engram']
        hd, cv, pad = e['head_dim'], int(e['compressed_vocab']), int(e['pad_id'])
        toks = np.array(self.tokens, dtype=np.int64) % cv          # compressed ids (synthetic cmap)
        pad = pad % cv                                             # pad = map[engram_pad_token_id]
        mult = [np.uint64(m) for m in self.mult[l]]
        table = self.w('layers.%d.engram.table' % l)
        rows_all = []
        for oi, n in enumerate(e['orders']):
            h = np.zeros(len(pos), np.uint64)
            for k in range(n):
                q = pos - k
                t = np.where(q >= 0, toks[np.maximum(q, 0)], pad).astype(np.uint64)
                h ^= t * mult[k]
            off = sum(sum(x) for x in self.primes[l][:oi])
            for hi, prime in enumerate(self.primes[l][oi]):
                z = engram_row(h, prime, self.hash_mod)
                rows_all.append(z.astype(np.int64) + off)
                off += prime
        R = np.stack(rows_all, axis=1)                                  # (nP, orders*heads)
        ev = F.engram_row_unpack(table[R], hd).reshape(len(pos), -1)    # (nP, 6144 at flash)
        kv = self._lin(ev) @ self.lw(l, 'engram.wkv').T          # engram.wkv is FP8
        d, hc = self.d, self.hc
        keys, val = kv[:, :hc * d].reshape(-1, hc, d), kv[:, hc * d:]
        qw, kw = self.lw(l, 'engram.q_w'), self.lw(l, 'engram.k_w')
        t = np.sum(rms(X, None, self.eps) * qw * rms(keys, None, self.eps) * kw, axis=-1) / math.sqrt(d)
        gate = sigmoid(np.sign(t) * np.sqrt(np.maximum(np.abs(t), 1e-6)))
        return self._rx(X + gate[:, :, None] * val[:, None, :], 'engram.x')

    # ------------------------------------------------------------ MoE (s4)
    def _moe(self, l, x):
        mo = self.m['moe']
        logits = x @ self.lw(l, 'ffn.gate').T
        sf = mo.get('score', 'sqrtsoftplus')
        if sf == 'sqrtsoftplus':
            s = np.sqrt(np.logaddexp(0.0, logits))
        elif sf == 'softmax':
            s = softmax(logits, axis=-1)
        elif sf == 'sigmoid':
            s = sigmoid(logits)
        else:
            raise ValueError('moe.score %r' % sf)
        k = int(mo['active_experts'])
        sb = s + self.lw(l, 'ffn.bias')[0]
        sel = self._pick('ffn.sel', sb, np.ones(sb.shape, bool), np.argsort(-sb, axis=1, kind='stable')[:, :k])
        ws = np.take_along_axis(s, sel, axis=1)
        if mo.get('norm_topk', True):
            ws = ws / ws.sum(axis=1, keepdims=True)
        ws = ws * float(mo['route_scale'])
        lim = float(mo.get('swiglu_limit', 0) or 0)

        def ffn(xx, wg, wu, wd, scale=None, q=lambda v, pt=None: v):
            xx = q(xx, 'ffn.sx')
            g, u = xx @ wg.T, xx @ wu.T
            if lim > 0:
                g, u = np.minimum(g, lim), np.clip(u, -lim, lim)
            h = silu(g) * u
            if scale is not None:
                h = h * scale[:, None]
            return q(h, 'ffn.sh') @ wd.T

        y = np.zeros_like(x)
        if mo['shared_experts'] > 0:
            y += ffn(x, self.lw(l, 'ffn.shared.w_gate'), self.lw(l, 'ffn.shared.w_up'),
                     self.lw(l, 'ffn.shared.w_down'), q=self._lin)   # shared expert: FP8 weights
        pf = 'layers.%d.ffn.experts.' % l
        WG, WU, WD = self.w.raw(pf + 'w_gate'), self.w.raw(pf + 'w_up'), self.w.raw(pf + 'w_down')
        for e in np.unique(sel):
            rows, slot = np.nonzero(sel == e)
            y[rows] += ffn(x[rows], WG[e].astype(np.float64), WU[e].astype(np.float64),
                           WD[e].astype(np.float64), ws[rows, slot])
        return y

    # ------------------------------------------------------------ global entries (s3.1)
    def _append_entries(self, l, a, pos):
        """Compressor of KV source l on inputs a at positions pos (ascending,
        continuing the source's stream); appends every completed group."""
        S = self.src[l]
        r = S['ratio']
        seen = len(S['main']) * r + len(S['tail_pos'])
        if len(pos) and pos[0] != seen:
            raise AssertionError('source L%d: appending position %d, expected %d (each position '
                                 'is appended exactly once, in order)' % (l, pos[0], seen))
        v = a @ self.lw(l, 'attn.compressor.wkv').T
        g = a @ self.lw(l, 'attn.compressor.wgate').T if r > 1 else np.zeros_like(v)
        v = np.concatenate([S['tail_v'], v])
        g = np.concatenate([S['tail_g'], g])
        ps = np.concatenate([S['tail_pos'], np.asarray(pos, np.int64)])
        ng = len(ps) // r
        S['tail_v'], S['tail_g'], S['tail_pos'] = v[ng * r:], g[ng * r:], ps[ng * r:]
        S['appends'] += len(pos)
        if ng == 0:
            return
        vg = v[:ng * r].reshape(ng, r, self.dh)
        gg = g[:ng * r].reshape(ng, r, self.dh)
        chat = np.sum(softmax(gg, axis=1) * vg, axis=1) if r > 1 else vg[:, 0]
        c = rms(chat, self.lw(l, 'attn.compressor.norm'), self.eps)
        epos = ps[:ng * r:r]                                   # r j: the group's first token
        kind = self._rope_kind(l)
        kI = c @ self.lw(l, 'attn.indexer.wk').T
        if self.k_norm:
            kI = rms(kI, self.lw(l, 'attn.indexer.k_norm'), self.eps)
        kI = rope(kI, epos, self.ifreqs[kind], self.rdI, self.ipos)
        e0 = len(S['main'])                                    # entries e0 .. e0 + ng - 1
        kb, kv = self._store('indexer_k', l, np.arange(e0, e0 + ng), kI, self.fmt['indexer_k'])
        kM = rope(c, epos, self.freqs[kind], self.rd, 'last')
        mb, mv = self._store('main_kv', l, np.arange(e0, e0 + ng), kM, self.fmt['main_kv'])
        S['main'] = np.concatenate([S['main'], mv])
        S['main_bytes'] = np.concatenate([S['main_bytes'], mb])
        S['ik'] = np.concatenate([S['ik'], kv])
        S['ik_bytes'] = np.concatenate([S['ik_bytes'], kb])
        S['latent'] = np.concatenate([S['latent'], c])

    def _publish(self, l, fw):
        """#25: source l writes its keys into the shared slot when this forward
        completes one of its groups (the vendor's compressor returns a latent):
        a decode step at p when (p + 1) % r == 0; a prefill when its positions
        [a, end) -- the whole prompt: the vendor prefills it in one forward --
        complete a group, floor(end / r) > floor(a / r)."""
        r = self.src[l]['ratio']
        a, end = fw.span
        if end // r > a // r:
            self.slot = l

    def _index_keys(self, l, src, pos):
        """The Indexer-K layer l scores for queries pos.  own_source, or a slot
        that holds its own source's keys: that source's.  Else (a forward that
        left its source's group filling) the tensor the slot holds -- usually
        the last ratio-1 source's from the step before -- of which the reader
        takes the first floor((p + 1) / r) rows, r its own ratio; rows past
        them are never visible (zeros here)."""
        own = self.src[src]['ik']
        if self.key_slot == 'own_source' or self.slot is None or self.slot == src:
            return own
        r = self.plan.layers[l]['ratio']
        need = min(len(own), (int(np.max(pos)) + 1) // r)
        held = self.src[self.slot]['ik']
        if need > len(held):
            raise AssertionError('L%d at %d: the slot (L%d) holds %d key rows, %d are read'
                                 % (l, int(np.max(pos)), self.slot, len(held), need))
        k = np.zeros_like(own)
        k[:need] = held[:need]
        return k

    def _visible(self, l_src, pos):
        """(nP, E) visibility of source entries: r j + r - 1 <= p."""
        r = self.src[l_src]['ratio']
        E = len(self.src[l_src]['main'])
        j = np.arange(E)
        return (r * j[None, :] + r - 1) <= np.asarray(pos)[:, None]

    def index_scores(self, qI, wI, kI):
        """I[p, s] = sum_h w[p, h] relu(qI[p, h] . kI[s])."""
        dots = np.matmul(qI, kI.T)                                   # (nP, HI, E)
        return np.matmul(wI[:, None, :], np.maximum(dots, 0.0))[:, 0]

    def _pool(self, scores, vis):
        cb = self.m['candidates']
        B, nb_top = int(cb['block']), int(cb['top_blocks'])
        nP, E = scores.shape
        if E == 0:
            return vis.copy()
        nb = -(-E // B)
        pad = nb * B - E
        S = np.pad(np.where(vis, scores, -np.inf), ((0, 0), (0, pad)), constant_values=-np.inf)
        Vb = np.pad(vis, ((0, 0), (0, pad)))
        bs = S.reshape(nP, nb, B).max(axis=2)
        bvis = Vb.reshape(nP, nb, B).any(axis=2)
        if self.pin:       # Appendix V #12: the newest visible block := +inf
            nv = vis.sum(axis=1)
            rows = np.nonzero(nv > 0)[0]
            bs[rows, (nv[rows] - 1) // B] = np.inf
        sel = self._pick('idx.pool', bs, bvis, topk_lower_index(bs, bvis, nb_top))
        bm = mask_from_indices(sel, nb)
        return vis & np.repeat(bm, B, axis=1)[:, :E]

    # ------------------------------------------------------------ attention (s3)
    def _attention(self, l, a, pos, fw):
        L = self.plan.layers[l]
        mode = L['mode']
        nP = len(pos)
        kind = self._rope_kind(l)
        H, dh = self.H, self.dh
        aq = self._lin(a)                    # wq_a, wkv, wq_b, indexer.wq_b, wo_a, wo_b: FP8 (#22)
        cq = self._lin(rms(aq @ self.lw(l, 'attn.wq_a').T, self.lw(l, 'attn.q_norm'), self.eps), 'attn.cq')
        q = (cq @ self.lw(l, 'attn.wq_b').T).reshape(nP, H, dh)
        if self.q_head_norm:                                     # V4's; V4.1 has none (#6)
            q = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True) + self.eps)
        q = rope(q, pos, self.freqs[kind], self.rd, 'last')
        kS = rope(rms(aq @ self.lw(l, 'attn.wkv').T, self.lw(l, 'attn.kv_norm'), self.eps),
                  pos, self.freqs[kind], self.rd, 'last')
        kb, kv = self._store('attn.swa', l, pos, kS, self.fmt['swa'])
        ring = self.rings[l]
        if len(ring['pos']) and ring['pos'][-1] >= pos[0]:
            raise AssertionError('L%d: ring already holds position %d' % (l, pos[0]))
        ring['pos'] = np.concatenate([ring['pos'], pos])
        ring['val'] = np.concatenate([ring['val'], kv])
        ring['bytes'] = np.concatenate([ring['bytes'], kb])
        st = {'queries': nP}
        # global path
        gsel = None
        if mode != 'swa_only':
            src = L['kv']
            if mode == 'full' and fw.append(l):
                self._append_entries(l, a, pos)
            if mode == 'full':
                self._publish(l, fw)
            if mode in ('full', 'reindex'):
                qI = rope((cq @ self.lw(l, 'attn.indexer.wq_b').T).reshape(nP, self.HI, self.dI),
                          pos, self.ifreqs[kind], self.rdI, self.ipos)
                if self.q_mxfp4:   # #11: qI through MXFP4 (E2M1, E8M0 per block) and back
                    qI = F.store(qI.reshape(-1, self.dI), self.fmt['indexer_k'], self.nib)[1].reshape(qI.shape) \
                        if not self.follow else self.follow.store_values(
                            'idx.qI', l, pos, qI, self.fmt['indexer_k'], self.nib)
                wI = (a @ self.lw(l, 'attn.indexer.weights_proj').T) * (self.HI * self.dI) ** -0.5
                scores = self.index_scores(qI, wI, self._index_keys(l, src, pos))
                vis = self._visible(src, pos)
                if mode == 'full':
                    cand = vis
                    if L['candidates'] == 'build':
                        fw.pool[l] = self._pool(scores, vis)
                        st['pool_sizes'] = fw.pool[l].sum(axis=1)
                elif L['candidates'] == 'read':
                    cand = fw.pool[L['pool']]
                else:
                    cand = vis
                gsel = self._pick('idx.topk', scores, cand, topk_lower_index(scores, cand, self.topk))
                fw.topk[l] = gsel
                st['scores'] = scores if self.keep_buses else None
            else:
                gsel = fw.topk[L['topk']]
            G = self.src[src]['main']
            gmask = mask_from_indices(gsel, len(G))
            if len(G) == 0:
                gsel = None
        # local path: the layer's own ring, max(p - W + 1, r0) <= s <= p
        lo = max(int(pos[0]) - self.W + 1, fw.r0)
        i0 = np.searchsorted(ring['pos'], lo)
        rpos, Sv = ring['pos'][i0:], ring['val'][i0:]
        smask = ((rpos[None, :] >= np.maximum(pos[:, None] - self.W + 1, fw.r0)) &
                 (rpos[None, :] <= pos[:, None]))
        read = smask.any(axis=0)
        st['swa_min_read'] = int(rpos[read].min()) if read.any() else None
        st['swa_counts'] = smask.sum(axis=1)
        st['swa_max_entries'] = int(st['swa_counts'].max())
        st['global_max_entries'] = int(gmask.sum(axis=1).max()) if gsel is not None else 0
        st['global_counts'] = gmask.sum(axis=1) if gsel is not None else np.zeros(nP, np.int64)
        # one softmax over Global u SWA u sink (shared K = V)
        sink = self.lw(l, 'attn.sink') if self.sink else None
        o = np.empty((nP, H, dh))
        for b0 in range(0, nP, self.qb):
            b = slice(b0, b0 + self.qb)
            qq = q[b] * self.scale
            zs = np.where(smask[b][:, None, :], np.matmul(qq, Sv.T), -np.inf)
            m = zs.max(axis=2)
            if gsel is not None:
                zg = np.where(gmask[b][:, None, :], np.matmul(qq, G.T), -np.inf)
                m = np.maximum(m, zg.max(axis=2))
            if sink is not None:
                m = np.maximum(m, sink[None, :])
            es = np.exp(zs - m[:, :, None])
            Z = es.sum(axis=2)
            num = np.matmul(es, Sv)
            if gsel is not None:
                eg = np.exp(zg - m[:, :, None])
                Z = Z + eg.sum(axis=2)
                num = num + np.matmul(eg, G)
            if sink is not None:
                Z = Z + np.exp(sink[None, :] - m)
            o[b] = num / Z[:, :, None]
        o = rope(o, pos, self.freqs[kind], self.rd, 'last', inverse=True)
        og = self._lin(o.reshape(nP, H * dh), 'attn.o').reshape(nP, self.G, H * dh // self.G)
        z = np.einsum('pgk,gok->pgo', og, self.lw(l, 'attn.wo_a')).reshape(nP, -1)
        fw.layers.setdefault(l, []).append(st)
        return self._lin(z, 'attn.z') @ self.lw(l, 'attn.wo_b').T

    # ------------------------------------------------------------ layers
    def _run_layers(self, X, P, pos, layers, fw):
        """Layers in order on (X, carried pre P); returns the final (X, P)."""
        for l in layers:
            self._at = (l, pos)
            if self.plan.layers[l]['engram']:
                X = self._engram(l, X, pos)
            X, P = self._sublayer(X, P, 'layers.%d.hc_attn' % l, 'layers.%d.attn_norm' % l,
                                  lambda a, l=l: self._attention(l, a, pos, fw))
            X, P = self._sublayer(X, P, 'layers.%d.hc_ffn' % l, 'layers.%d.ffn_norm' % l,
                                  lambda x, l=l: self._moe(l, x))
            self.token_layers[l] += len(pos)
        self._at = (self.n_layers, pos)       # the head, when one follows
        return X, P

    def _logits(self, X, P):
        if self.merge == 'carried':      # Appendix V #4: the last FFN's own pre, no hc_head
            h = np.matmul(P[:, None, :], X)[:, 0]
        elif self.merge == 'sum':
            h = X.sum(axis=1)
        else:
            hc = self.hc
            xf = X.reshape(X.shape[0], -1)
            mix = (xf @ self.w('head.hc.fn').T) / np.sqrt(np.mean(xf * xf, axis=1, keepdims=True) + self.eps)
            pre = sigmoid(mix * self.w('head.hc.scale')[0] + self.w('head.hc.base')) + self.hc_eps
            h = np.einsum('pi,pid->pd', pre, X[:, :hc])
        h = self._rio(h, 'head.h')
        return self._rio(rms(h, self.w('norm'), self.eps), 'head.hn') @ self.w('lm_head').T

    def _embed(self, toks):
        e = self.w('embed')[np.asarray(toks, np.int64)]
        return self._rx(np.repeat(e[:, None, :], self.hc, axis=1))

    def _fw(self, kind, pos, r0, writes, span=None):
        if self.log and not self.keep_buses:
            self.log[-1].topk = self.log[-1].pool = None     # transient: per forward
        fw = Forward(kind, pos, r0)
        fw.append = writes
        fw.span = span or fw.positions      # #25: the vendor's forward this one is part of
        self.log.append(fw)
        return fw

    def _dec_sources_append(self, XE, PE, pos, fw):
        for l in self.dec:
            if self.plan.layers[l]['mode'] == 'full':
                self._at = (l, pos)
                self._append_entries(l, self._a_in(l, XE, PE), pos)
                self._publish(l, fw)

    # ------------------------------------------------------------ flows (SPEC 6)
    def prefill(self, tokens, chunk=None, replay_chunk=None):
        """Cold prefill of a prompt.  CED on: encoder layers on every position
        (in chunks), every decoder KV source appends each position once from
        the encoder final hidden, then the last R = min(N, replay.decoder)
        positions replay the decoder layers with r0 = N - R and no global
        writes.  CED off: every position through every layer, in chunks.
        Returns a PrefillResult: logits of every position that ran through
        all layers (the replayed ones under CED), .last for the last one."""
        if self.n:
            raise RuntimeError('prefill on a non-empty state (reset() first)')
        toks = [int(t) for t in tokens]
        N = len(toks)
        if N == 0:
            raise ValueError('empty prompt')
        if min(toks) < 0 or max(toks) >= self.V:
            raise ValueError('token id out of range')
        chunk = int(chunk or self.plan.serving.get('prefill_chunk') or N)
        if not self.plan.ced:
            outs = []
            for c0 in range(0, N, chunk):
                pos = np.arange(c0, min(N, c0 + chunk))
                self.tokens.extend(toks[c0:pos[-1] + 1])
                fw = self._fw('dense', pos, 0, lambda l: True, (0, N))
                X0 = self._embed(toks[c0:pos[-1] + 1])
                X, P = self._run_layers(X0, self._onehot(len(pos)), pos, range(self.n_layers), fw)
                outs.append(self._logits(X, P))
                self.n = int(pos[-1]) + 1
            return PrefillResult(np.concatenate(outs), np.arange(N))
        XE = np.zeros((N, self.hc, self.d))
        PE = np.zeros((N, self.hc))              # the pre X^(E) carries into the decoder (Appendix V 1-5)
        for c0 in range(0, N, chunk):
            pos = np.arange(c0, min(N, c0 + chunk))
            self.tokens.extend(toks[c0:pos[-1] + 1])
            fw = self._fw('encoder', pos, 0, lambda l: True, (0, N))
            X0 = self._embed(toks[c0:pos[-1] + 1])
            X, P = self._run_layers(X0, self._onehot(len(pos)), pos, self.enc, fw)
            XE[pos], PE[pos] = X, P
            self._dec_sources_append(X, P, pos, fw)        # decoder global: once per position
            self.n = int(pos[-1]) + 1
        R = min(N, self.plan.replay_decoder())
        r0 = N - R
        for l in self.dec:   # decoder SWA is rebuilt by every prefill, never cached
            assert len(self.rings[l]['pos']) == 0
        rc = int(replay_chunk or R)
        outs = []
        for c0 in range(r0, N, rc):
            pos = np.arange(c0, min(N, c0 + rc))
            fw = self._fw('replay', pos, r0, lambda l: False, (0, N))
            X, P = self._run_layers(XE[pos], PE[pos], pos, self.dec, fw)
            outs.append(self._logits(X, P))
        self.replay_start = r0
        return PrefillResult(np.concatenate(outs), np.arange(r0, N))

    def decode(self, token):
        """Consume one token at position n through every layer; returns its logits."""
        t = int(token)
        if not 0 <= t < self.V:
            raise ValueError('token id out of range')
        pos = np.array([self.n])
        self.tokens.append(t)
        X0 = self._embed([t])
        if self.plan.ced:
            fw = self._fw('decode', pos, 0, lambda l: self.plan.layers[l]['region'] == 'encoder')
            X, P = self._run_layers(X0, self._onehot(1), pos, self.enc, fw)
            self._dec_sources_append(X, P, pos, fw)
            X, P = self._run_layers(X, P, pos, self.dec, fw)
        else:
            fw = self._fw('decode', pos, 0, lambda l: True)
            X, P = self._run_layers(X0, self._onehot(1), pos, range(self.n_layers), fw)
        self.n += 1
        return self._logits(X, P)[0]

    @staticmethod
    def greedy(logits):
        return int(np.argmax(logits))          # ties to the lower id

    def generate(self, prompt, steps):
        """Greedy: prefill, then `steps` decode steps.  Returns the sampled ids."""
        y = self.greedy(self.prefill(prompt).last)
        out = [y]
        for _ in range(steps):
            y = self.greedy(self.decode(y))
            out.append(y)
        return out


# ---------------------------------------------------------------- command line


def dump(o, prefill_result, decode_logits, path):
    """Write what a comparison with cedar needs: logits, tokens, and every cache
    (Main-KV / Indexer-K bytes per source, SWA ring bytes and positions per layer)."""
    t = {'prefill.logits': np.asarray(prefill_result.logits, np.float64),
         'prefill.positions': np.asarray(prefill_result.positions, np.int64),
         'tokens': np.asarray(o.tokens, np.int64)}
    if decode_logits:
        t['decode.logits'] = np.asarray(decode_logits, np.float64)
    for l, S in o.src.items():
        t['L%d.main_kv' % l] = S['main_bytes']
        t['L%d.indexer_k' % l] = S['ik_bytes']
        t['L%d.tail_pos' % l] = S['tail_pos']
    for l, r in o.rings.items():
        keep = slice(max(0, len(r['pos']) - o.W), None)          # what a W-slot ring holds
        t['L%d.swa' % l] = r['bytes'][keep]
        t['L%d.swa_pos' % l] = r['pos'][keep]
    ST.write(path, t, {'oracle.plan': o.plan.name, 'oracle.token_layers': str(o.total_token_layers)})


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description='NumPy oracle of cedar\'s forward pass (docs/model.md)')
    ap.add_argument('plan')
    ap.add_argument('weights')
    ap.add_argument('--prompt', required=True, help='comma-separated token ids, or @FILE of them')
    ap.add_argument('--steps', type=int, default=0, help='greedy decode steps after the prefill')
    ap.add_argument('--chunk', type=int, default=0, help='prefill chunk (default: the plan\'s)')
    ap.add_argument('--out', help='write logits and caches to this safetensors file')
    ap.add_argument('--hash-mod', default='signed_floor', choices=('unsigned', 'signed_floor'))
    a = ap.parse_args(argv)
    txt = open(a.prompt[1:]).read() if a.prompt.startswith('@') else a.prompt
    toks = [int(t) for t in txt.replace('\n', ',').split(',') if t.strip()]
    o = Oracle(a.plan, a.weights, hash_mod=a.hash_mod)
    r = o.prefill(toks, chunk=a.chunk or None)
    y = o.greedy(r.last)
    out, dl = [y], []
    for _ in range(a.steps):
        dl.append(o.decode(y))
        y = o.greedy(dl[-1])
        out.append(y)
    print('tokens', ' '.join(map(str, out)))
    print('token_layers', o.total_token_layers)
    print('entries', ' '.join('L%d:%d+%d' % (l, o.entries(l), o.tail(l)) for l in o.src))
    if a.out:
        dump(o, r, dl, a.out)


if __name__ == '__main__':
    main()
