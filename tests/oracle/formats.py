"""Storage-format codecs for the oracle, written from docs/formats.md and
SPEC-V41.md (Appendix V #21: the vendor's scale rules, floors and bf16
rounding; see resolve() and the "scale rules" section).

Element codecs: E2M1 (FP4), E4M3 (FP8 "E4M3FN", saturating, RNE), E8M0
(power-of-two scale byte).  Entry codecs: Main-KV FP4 (E2M1 + E4M3 scale per
16, 288 B at 512), Indexer-K MXFP4 (E2M1 + E8M0 scale per 32, 68 B at 128),
SWA FP8 (E4M3 + FP32 scale per block, or + E8M0 scale per block) and Engram
rows (E4M3 + E8M0 per 32).

Every codec is a codec of float32 inputs (as in cedar): an input array is
first rounded to float32, then encoded.  Element rounding is done in float64
on the float32 values, which gives exactly the round-to-nearest-even of the
true quotient (docs/formats.md s4); the FP32-scaled SWA format is *defined*
by float32 arithmetic and is computed in float32.  All functions are
vectorized over leading axes: an entry is the last axis.

Byte layout of every entry: the payload first, then one scale per block in
block order (docs/formats.md s2).  E2M1 payload byte j holds elements 2j and
2j+1; with nibble 'low_first' element 2j is in bits 0-3.
"""
import numpy as np

# ---------------------------------------------------------------- tables

E2M1_POS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _e2m1_table():
    t = np.empty(16)
    t[:8] = E2M1_POS
    t[8:] = -E2M1_POS  # 0x8 is -0.0
    return t


def _e4m3_table():
    t = np.empty(256)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 0xF, c & 7
        if (c & 0x7F) == 0x7F:
            v = np.nan
        elif e == 0:
            v = m * 2.0 ** -9
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        t[c] = -v if s else v
    t[0x80] = -0.0
    return t


E2M1_VALUES = _e2m1_table()          # code -> value, 16 entries
E4M3_VALUES = _e4m3_table()          # code -> value, 256 entries (NaN at 0x7F, 0xFF)
E4M3_POS = E4M3_VALUES[:0x7F].copy()  # codes 0x00..0x7E, increasing, 0 .. 448
E4M3_MAX = 448.0
E2M1_MAX = 6.0
FLT_MIN = float(np.finfo(np.float32).tiny)  # 2^-126

# ---------------------------------------------------------------- element codecs


def _f32(x):
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def e2m1_encode(x):
    """RNE to E2M1, |x| >= 6 (and Inf) -> +-6, NaN -> 0x7 whatever its sign.
    The sign is always kept (-0 and negatives rounding to 0 give 0x8)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    nan = np.isnan(a)
    a = np.where(nan, 6.0, a)
    step = np.where(a < 2.0, 0.5, np.where(a < 4.0, 1.0, 2.0))
    q = np.minimum(np.rint(a / step) * step, 6.0)
    code = np.searchsorted(E2M1_POS, q).astype(np.uint8)
    neg = np.signbit(x) & ~nan
    return (code | np.where(neg, 0x8, 0)).astype(np.uint8)


def e2m1_decode(c):
    return E2M1_VALUES[np.asarray(c, dtype=np.uint8) & 0xF]


def e4m3_rne_magnitude(a):
    """Nearest E4M3 magnitude (ties to even) of a >= 0 (float64), saturating at 448."""
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(divide='ignore', invalid='ignore'):
        _, ex = np.frexp(np.where(a > 0, a, 1.0))
    e = ex.astype(np.int64) - 1                      # floor(log2 a)
    e = np.maximum(e, -6)                            # subnormal binade: step 2^-9
    step = np.ldexp(1.0, e - 3)
    q = np.rint(np.where(np.isfinite(a), a, 0.0) / step) * step
    q = np.where(np.isfinite(a), q, E4M3_MAX)
    return np.minimum(q, E4M3_MAX)


def e4m3_encode(x):
    """RNE to E4M3FN, saturating to +-448 (+-Inf too); NaN -> 0x7F."""
    x = np.asarray(x, dtype=np.float64)
    nan = np.isnan(x)
    q = e4m3_rne_magnitude(np.where(nan, 0.0, np.abs(x)))
    code = np.searchsorted(E4M3_POS, q).astype(np.uint8)
    code = code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(nan, 0x7F, code).astype(np.uint8)


def e4m3_decode(c):
    return E4M3_VALUES[np.asarray(c, dtype=np.uint8)]


def e4m3_roundup(x):
    """Code of the smallest E4M3 value >= x for 0 < x <= 448; x > 448 and +Inf
    -> 0x7E; x <= 0 -> 0x00; NaN -> 0x7F."""
    x = np.asarray(x, dtype=np.float64)
    nan = np.isnan(x)
    xc = np.where(nan, 0.0, x)
    code = np.searchsorted(E4M3_POS, np.minimum(xc, E4M3_MAX), side='left')
    code = np.where(xc <= 0, 0, code)
    code = np.where(xc > E4M3_MAX, 0x7E, code)
    return np.where(nan, 0x7F, code).astype(np.uint8)


def e8m0_decode(c):
    c = np.asarray(c, dtype=np.int64)
    return np.where(c == 0xFF, np.nan, np.ldexp(1.0, c - 127))


def e8m0_scale(amax, qmax, rule='ceil'):
    """Scale byte k + 127 for a block with max |x| = amax.
    ceil: smallest k with qmax * 2^k >= amax (exact; never saturates).
    ocp : floor(log2 amax) - floor(log2 qmax).
    amax = 0 -> 0x00; NaN/Inf -> 0xFF; k clamped to [-127, 127]."""
    amax = np.asarray(amax, dtype=np.float64)
    bad = ~np.isfinite(amax)
    zero = amax == 0
    a = np.where(bad | zero, 1.0, amax)
    if rule == 'ceil':
        with np.errstate(divide='ignore'):
            k = np.ceil(np.log2(a / qmax)).astype(np.int64)
        for _ in range(2):  # exact correction of the float log2
            k = np.where(np.ldexp(float(qmax), k) < a, k + 1, k)
            k = np.where(np.ldexp(float(qmax), k - 1) >= a, k - 1, k)
    elif rule == 'ocp':
        _, ea = np.frexp(a)
        _, eq = np.frexp(float(qmax))
        k = (ea.astype(np.int64) - 1) - (int(eq) - 1)
    else:
        raise ValueError('unknown E8M0 scale rule %r' % rule)
    k = np.clip(k, -127, 127)
    byte = (k + 127).astype(np.int64)
    byte = np.where(zero, 0, byte)
    byte = np.where(bad, 0xFF, byte)
    return byte.astype(np.uint8)


# ---------------------------------------------------------------- helpers


def _blocks(x, block):
    x = np.asarray(x)
    W = x.shape[-1]
    if block <= 0 or W % block:
        raise ValueError('block %d does not divide width %d' % (block, W))
    return x.reshape(x.shape[:-1] + (W // block, block))


def _pack_nibbles(codes, nibble):
    lo, hi = codes[..., 0::2], codes[..., 1::2]
    if nibble == 'high_first':
        lo, hi = hi, lo
    return (lo | (hi << 4)).astype(np.uint8)


def _unpack_nibbles(payload, nibble):
    a, b = payload & 0xF, payload >> 4
    if nibble == 'high_first':
        a, b = b, a
    out = np.empty(payload.shape[:-1] + (payload.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = a
    out[..., 1::2] = b
    return out


def fp4_bytes(W, block):
    if W <= 0 or block <= 0 or block % 2 or W % block:
        return 0
    return W // 2 + W // block


def fp8_bytes(W, block, scale):
    if W <= 0 or block <= 0 or W % block:
        return 0
    return W + (W // block) * {'f32': 4, 'e8m0': 1}[scale]


# ---------------------------------------------------------------- scale rules
# Appendix V #21 (SPEC-V41.md) as formulas, evaluated in float64 on the
# float32 amax: every quotient below is exact enough that no rounding can
# move it across an E4M3 tie or a power of two (docs/formats.md s4).


def bf16_round(x):
    """Nearest bf16 (ties to even) of float32 x, as float64; NaN stays NaN,
    values past the bf16 range become +-Inf."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = r.view(np.float32).astype(np.float64)
    return np.where(np.isnan(f), np.nan, out)


def e8m0_floor_byte(t):
    """Byte k + 127 with k = ceil(log2 t) exactly, t > 0 (float64), clamped."""
    t = np.asarray(t, dtype=np.float64)
    with np.errstate(divide='ignore'):
        k = np.ceil(np.log2(t)).astype(np.int64)
    for _ in range(2):
        k = np.where(np.ldexp(1.0, k) < t, k + 1, k)
        k = np.where(np.ldexp(1.0, k - 1) >= t, k - 1, k)
    return (np.clip(k, -127, 127) + 127).astype(np.int64)


def e4m3_scale(amax, qmax, rule, floor):
    """E4M3 scale byte of a finite block.
    rne    : RNE_E4M3(clamp(amax / qmax, floor, 448))   (vendor Main KV, floor 2^-9)
    roundup: smallest E4M3 s >= fl32(amax / qmax); 0x00 for a zero block,
             0x01 when the quotient underflows                     (SPEC 4.2)"""
    amax = np.asarray(amax, dtype=np.float64)
    if rule == 'rne':
        return e4m3_encode(np.clip(amax / qmax, floor, E4M3_MAX))
    q = (np.asarray(amax, np.float32) / np.float32(qmax)).astype(np.float64)
    sc = e4m3_roundup(q)
    return np.where((amax > 0) & (q == 0), 0x01, sc).astype(np.uint8)


def e8m0_rule_scale(amax, qmax, rule, floor):
    """E8M0 scale byte of a finite block.
    ceil: 2^ceil(log2(max(amax / qmax, floor)))  (vendor: floor 2^-126 for MXFP4
          keys, 1e-4 for FP8 SWA as vLLM); floor 0: a zero block gets 2^-127
    ocp : floor(log2 amax) - floor(log2 qmax)"""
    if rule == 'ocp' or not floor:
        return e8m0_scale(amax, qmax, rule)
    amax = np.asarray(amax, dtype=np.float64)
    return e8m0_floor_byte(np.maximum(amax / qmax, floor)).astype(np.uint8)


def _block_scales(xb, elem, scale, rule, floor):
    """Per block: (finite mask, scale value s (0 for an unscaled zero block),
    scale bytes (..., nb * width))."""
    qmax = E2M1_MAX if elem == 'e2m1' else E4M3_MAX
    finite = np.isfinite(xb).all(axis=-1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(xb), xb, 0)).max(axis=-1), 0.0)
    if scale == 'e4m3':
        sc = e4m3_scale(amax, qmax, rule, floor)
        return finite, e4m3_decode(sc), np.where(finite, sc, 0x7F).astype(np.uint8)
    if scale == 'e8m0':
        sc = e8m0_rule_scale(amax, qmax, rule, floor)
        return finite, e8m0_decode(sc), np.where(finite, sc, 0xFF).astype(np.uint8)
    if scale == 'f32':  # s = max(fl32(amax / qmax), FLT_MIN), 0 for a zero block
        a32 = np.asarray(amax, np.float32)
        s = np.maximum(a32 / np.float32(qmax), np.float32(FLT_MIN)).astype(np.float32)
        s = np.where(a32 == 0, np.float32(0), s).astype(np.float32)
        s_store = np.where(finite, s, np.float32(np.nan)).astype('<f4')
        return finite, s.astype(np.float64), np.ascontiguousarray(s_store).view(np.uint8).reshape(
            s.shape[:-1] + (-1,))
    raise ValueError('scale %r' % scale)


def _quotient(xb, s, scale):
    """x / s per element: float32 arithmetic for an FP32 scale (the format is
    defined by it), exact float64 otherwise; a zero scale (zero block) gives
    the signed zeros."""
    s_ = s[..., None]
    with np.errstate(divide='ignore', invalid='ignore'):
        if scale == 'f32':
            x32, s32 = xb.astype(np.float32), s_.astype(np.float32)
            t = np.where(s32 > 0, x32 / np.where(s32 > 0, s32, 1), x32 * np.float32(0))
            return t.astype(np.float64)
        return np.where(s_ > 0, xb / np.where(s_ > 0, s_, 1.0), xb * 0.0)


# ---------------------------------------------------------------- E2M1 entries


def pack_e2m1(x, block, scale='e4m3', rule=None, nibble='low_first', floor=0.0):
    """E2M1 payload + one scale per block (E4M3, E8M0 or FP32).  rule None is
    SPEC's (roundup for E4M3, ceil for E8M0) and floor 0 none; plan formats
    go through pack().  Returns uint8 (..., W/2 + W/block * scale width)."""
    if block % 2:
        raise ValueError('E2M1 block must be even')
    rule = rule or ('roundup' if scale == 'e4m3' else 'ceil')
    x = _f32(x)
    xb = _blocks(x, block)
    finite, s, sb = _block_scales(xb, 'e2m1', scale, rule, floor)
    codes = e2m1_encode(_quotient(xb, s, scale))   # saturates at 6 (rne may round s down)
    codes = np.where(finite[..., None], codes, 0).astype(np.uint8).reshape(x.shape)
    sb = sb.reshape(x.shape[:-1] + (-1,))
    return np.concatenate([_pack_nibbles(codes, nibble), sb], axis=-1)


def _scale_width(scale):
    return {'e4m3': 1, 'e8m0': 1, 'f32': 4}[scale]


def _decode_scales(sb, nb, scale):
    if scale == 'e4m3':
        return e4m3_decode(sb)
    if scale == 'e8m0':
        return e8m0_decode(sb)
    sb = np.ascontiguousarray(sb).reshape(sb.shape[:-1] + (nb, 4))
    return sb.view('<f4')[..., 0].astype(np.float64)


def unpack_e2m1(b, W, block, scale='e4m3', nibble='low_first'):
    b = np.asarray(b, dtype=np.uint8)
    nb = W // block
    if b.shape[-1] != W // 2 + nb * _scale_width(scale):
        raise ValueError('entry has %d bytes, expected %d' % (b.shape[-1], W // 2 + nb * _scale_width(scale)))
    codes = _unpack_nibbles(b[..., :W // 2], nibble)
    s = _decode_scales(b[..., W // 2:], nb, scale)
    v = _blocks(e2m1_decode(codes), block) * s[..., None]
    if scale == 'f32':
        v = v.astype(np.float32).astype(np.float64)  # the float product q * s
    poisoned = np.isnan(s)[..., None] & np.ones(block, bool)
    v = np.where(poisoned, np.nan, v)
    return v.reshape(b.shape[:-1] + (W,))


# ---------------------------------------------------------------- E4M3 entries


def pack_e4m3(x, block, scale='f32', rule=None, floor=0.0):
    """E4M3 payload (element i at byte i) + per-block scale: FP32 little-endian
    (s = max(fl32(amax/448), FLT_MIN), 0 for an all-zero block), E8M0 (rule
    None: ceil) or E4M3 (rule None: rne)."""
    rule = rule or ('rne' if scale == 'e4m3' else 'ceil')
    x32 = np.asarray(x, dtype=np.float32)
    xb = _blocks(x32.astype(np.float64), block)
    finite, s, sb = _block_scales(xb, 'e4m3', scale, rule, floor)
    codes = e4m3_encode(_quotient(xb, s, scale))   # saturates at 448
    codes = np.where(finite[..., None], codes, 0).astype(np.uint8).reshape(x32.shape)
    return np.concatenate([codes, sb.reshape(x32.shape[:-1] + (-1,))], axis=-1)


def unpack_e4m3(b, W, block, scale='f32'):
    b = np.asarray(b, dtype=np.uint8)
    nb = W // block
    if b.shape[-1] != W + nb * _scale_width(scale):
        raise ValueError('bad FP8 entry size')
    s = _decode_scales(b[..., W:], nb, scale)
    v = _blocks(e4m3_decode(b[..., :W]), block) * s[..., None]
    if scale == 'f32':
        v = v.astype(np.float32).astype(np.float64)
    v = np.where(np.isnan(s)[..., None] & np.ones(block, bool), np.nan, v)
    return v.reshape(b.shape[:-1] + (W,))


# ---------------------------------------------------------------- named entries


def main_kv_pack(x, nibble='low_first'):
    return pack_e2m1(x, 16, 'e4m3', nibble=nibble)


def main_kv_unpack(b, W=512, nibble='low_first'):
    return unpack_e2m1(b, W, 16, 'e4m3', nibble)


def indexer_k_pack(x, rule='ceil', nibble='low_first'):
    return pack_e2m1(x, 32, 'e8m0', rule, nibble)


def indexer_k_unpack(b, W=128, nibble='low_first'):
    return unpack_e2m1(b, W, 32, 'e8m0', nibble)


def swa_pack(x, block=512, scale='f32'):
    return pack_e4m3(x, block, scale)


def swa_unpack(b, W=512, block=512, scale='f32'):
    return unpack_e4m3(b, W, block, scale)


def engram_row_pack(x):
    """Engram table row: E4M3 values then one E8M0 scale (CEIL, qmax 448) per 32."""
    return pack_e4m3(x, 32, 'e8m0', 'ceil')


def engram_row_unpack(b, W):
    return unpack_e4m3(b, W, 32, 'e8m0')


# ---------------------------------------------------------------- plan formats

VENDOR_FLOOR = {'rne': 2.0 ** -9, ('ceil', 'e2m1'): 2.0 ** -126, ('ceil', 'e4m3'): 1e-4}


def resolve(fmt):
    """A plan's formats.<cache> with the vendor's defaults (Appendix V #21,
    docs/plans.md): (element, scale, block, rule, floor, bf16_round)."""
    el, sc = fmt['element'], fmt.get('scale', 'none')
    rule = fmt.get('scale_rule', 'auto')
    if rule == 'auto':
        rule = {'e4m3': 'rne', 'e8m0': 'ceil'}.get(sc, 'float')
    floor = fmt.get('scale_floor')
    if floor is None:
        floor = VENDOR_FLOOR.get(rule, VENDOR_FLOOR.get((rule, el), 0.0))
    if el in ('bf16', 'f32') and sc != 'none':
        raise ValueError('%s elements are stored unscaled' % el)
    return el, sc, int(fmt.get('block', 0) or 0), rule, float(floor), bool(fmt.get('bf16_round', True))


def entry_bytes(W, fmt):
    el, sc, B, _, _, _ = resolve(fmt)
    if el == 'bf16':
        return 2 * W
    if el == 'f32':
        return 4 * W
    if B <= 0 or W % B:
        return 0
    return (W // 2 if el == 'e2m1' else W) + (W // B) * _scale_width(sc)


def pack(x, fmt, nibble='low_first'):
    el, sc, B, rule, floor, r16 = resolve(fmt)
    x = np.asarray(x, dtype=np.float32)
    if r16 or el == 'bf16':  # values rounded to bf16 before they are quantized
        x = bf16_round(x).astype(np.float32)
    if el == 'e2m1':
        return pack_e2m1(x, B, sc, rule, nibble, floor)
    if el == 'e4m3':
        return pack_e4m3(x, B, sc, rule, floor)
    if el == 'f32':
        return np.ascontiguousarray(x.astype('<f4')).view(np.uint8).reshape(x.shape[:-1] + (-1,))
    if el == 'bf16':
        u = np.ascontiguousarray(x.astype('<f4')).view('<u4')
        r = np.where(np.isnan(x), 0x7FC0, u >> 16).astype('<u2')
        return r.view(np.uint8).reshape(x.shape[:-1] + (-1,))
    raise ValueError('unsupported element %r' % el)


def unpack(b, W, fmt, nibble='low_first'):
    el, sc, B, _, _, _ = resolve(fmt)
    if el == 'e2m1':
        return unpack_e2m1(b, W, B, sc, nibble)
    if el == 'e4m3':
        return unpack_e4m3(b, W, B, sc)
    b = np.ascontiguousarray(b)
    if el == 'f32':
        return b.view('<f4').astype(np.float64)
    if el == 'bf16':
        return (b.view('<u2').astype(np.uint32) << 16).view('<f4').astype(np.float64)
    raise ValueError('unsupported element %r' % el)


def store(x, fmt, nibble='low_first'):
    """What a cache holds for x, read back: unpack(pack(x)).  Returns (bytes, float64 values)."""
    x = np.asarray(x)
    b = pack(x, fmt, nibble)
    return b, unpack(b, x.shape[-1], fmt, nibble)
