"""quant.py: the released checkpoint's number formats, encoders (NumPy).

Written from Appendix V's checkpoint layout and docs/formats.md: BF16 (round
to nearest even from float32), F8_E4M3 (FN: no infinities, 448 largest,
S.1111.111 NaN, subnormals m/8 2^-6), F8_E8M0 (2^(code-127)), E2M1 (the FP4
expert values 0, 0.5, 1, 1.5, 2, 3, 4, 6, sign in bit 3, two per byte, the
even column in the low nibble). Rounding is to nearest, ties to the even
code; a scale is the power of two 2^ceil(log2(amax / largest)), so that no
value of a block saturates.
"""
import numpy as np


def bf16_bits(x):
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _grid(codes, values):
    """Nearest-code encoder for magnitudes on a finite grid (ties: even code)."""
    def enc(m):
        m = np.asarray(m, np.float64)
        i = np.clip(np.searchsorted(values, m), 1, len(values) - 1)
        lo, hi = values[i - 1], values[i]
        pick_hi = (m - lo > hi - m) | ((m - lo == hi - m) & (codes[i] % 2 == 0))
        j = np.where(pick_hi, i, i - 1)
        j = np.where(m >= values[-1], len(values) - 1, j)
        return codes[j]
    return enc


def _e4m3_value(c):
    e, m = (c >> 3) & 15, c & 7
    return np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))


E4M3_CODES = np.arange(0x7F)                  # 0x7F is NaN
E4M3_VALUES = _e4m3_value(E4M3_CODES)
E2M1_CODES = np.arange(8)
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)
_e4m3_mag = _grid(E4M3_CODES, E4M3_VALUES)
_e2m1_mag = _grid(E2M1_CODES, E2M1_VALUES)


def e4m3_encode(x):
    x = np.asarray(x, np.float64)
    return (_e4m3_mag(np.abs(x)) | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def e4m3_decode(c):
    c = np.asarray(c, np.int64)
    return np.where(c & 0x80, -1.0, 1.0) * _e4m3_value(c & 0x7F)


def e2m1_encode(x):
    x = np.asarray(x, np.float64)
    return (_e2m1_mag(np.abs(x)) | np.where(np.signbit(x), 8, 0)).astype(np.uint8)


def e2m1_decode(c):
    c = np.asarray(c, np.int64)
    return np.where(c & 8, -1.0, 1.0) * E2M1_VALUES[c & 7]


def e8m0_for(amax, largest):
    """The E8M0 code of 2^ceil(log2(amax / largest)) (amax 0: the smallest usable, 2^-126)."""
    a = np.asarray(amax, np.float64)
    safe = np.where(a > 0, a, 1.0)
    k = np.ceil(np.log2(safe / largest))
    k = np.where(a > 0, k, -126)
    return np.clip(k + 127, 1, 254).astype(np.uint8)


def e8m0_value(code):
    return np.ldexp(1.0, np.asarray(code, np.int64) - 127)


def fp8_tiles(w):
    """(E4M3 codes [r, c], E8M0 scales [ceil(r/32), ceil(c/32)], dequantized [r, c]):
    one scale per 32 x 32 tile."""
    w = np.asarray(w, np.float64)
    r, c = w.shape
    R, C = -(-r // 32), -(-c // 32)
    pad = np.zeros((R * 32, C * 32))
    pad[:r, :c] = np.abs(w)
    amax = pad.reshape(R, 32, C, 32).max(axis=(1, 3))
    sc = e8m0_for(amax, 448.0)
    s = np.repeat(np.repeat(e8m0_value(sc), 32, 0), 32, 1)[:r, :c]
    q = e4m3_encode(w / s)
    return q, sc, e4m3_decode(q) * s


def fp8_rows(w):
    """Per row, one scale per 32 values (Engram tables): codes, scales [r, c/32], dequantized."""
    w = np.asarray(w, np.float64)
    r, c = w.shape
    amax = np.abs(w).reshape(r, c // 32, 32).max(axis=2)
    sc = e8m0_for(amax, 448.0)
    s = np.repeat(e8m0_value(sc), 32, axis=1)
    q = e4m3_encode(w / s)
    return q, sc, e4m3_decode(q) * s


def fp4_rows(w):
    """FP4 expert [r, c]: packed I8 [r, c/2] (even column low nibble), E8M0 [r, c/32], dequantized."""
    w = np.asarray(w, np.float64)
    r, c = w.shape
    amax = np.abs(w).reshape(r, c // 32, 32).max(axis=2)
    sc = e8m0_for(amax, 6.0)
    s = np.repeat(e8m0_value(sc), 32, axis=1)
    q = e2m1_encode(w / s)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), sc, e2m1_decode(q) * s
