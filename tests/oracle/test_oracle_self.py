"""Self-checks of the NumPy oracle (tests/oracle/).  cedar cannot run the
model yet, so these check the oracle against docs/formats.md, docs/plans.md,
SPEC s2 and s8 and against itself (determinism, chunking, CED vs dense).

    /usr/bin/python3 tests/oracle/test_oracle_self.py [-k SUBSTRING] [-v]

Exit 0 = all passed, 1 = a failure, 77 = numpy missing.  Run from anywhere;
paths are relative to the repository root.  Set CEDAR_BIN (or build
build/cedar) to also cross-check the plan reader with `cedar plan show --json`.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import traceback

try:
    import numpy as np
except ImportError:  # pragma: no cover
    print('numpy is missing: skipped')
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import formats as F  # noqa: E402
import oracle as O  # noqa: E402
import plan as P  # noqa: E402
import st as ST  # noqa: E402
import synth  # noqa: E402

TESTS = []
TMP = tempfile.mkdtemp(prefix='oracle_self_')
_WEIGHTS = {}


def test(fn):
    TESTS.append(fn)
    return fn


def path(*p):
    return os.path.join(ROOT, *p)


def weights(plan_rel, seed=1):
    key = (plan_rel, seed)
    if key not in _WEIGHTS:
        out = os.path.join(TMP, '%s-%d.safetensors' % (os.path.basename(plan_rel)[:-5], seed))
        synth.write_weights(path(plan_rel), out, seed)
        _WEIGHTS[key] = out
    return _WEIGHTS[key]


def oracle(plan_rel, seed=1, **kw):
    return O.Oracle(path(plan_rel), weights(plan_rel, seed), **kw)


def prompt(n, V, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(0, V, n)]


def close(a, b, rel=1e-12, what=''):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, '%s: shapes %s vs %s' % (what, a.shape, b.shape)
    err = np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)
    assert err <= rel, '%s: relative difference %.3g > %.3g' % (what, err, rel)
    return err


TINY = 'tests/oracle/plans/tiny.yaml'
TINY_DENSE = 'tests/oracle/plans/tiny-dense.yaml'
TINY40 = 'tests/oracle/plans/tiny-40.yaml'
TINY_DENSE40 = 'tests/oracle/plans/tiny-dense-40.yaml'
TINY_TWO = 'tests/oracle/plans/tiny-two-dec.yaml'
TINY_V4 = 'tests/oracle/plans/tiny-v4.yaml'
MINI = 'plans/v41-mini.yaml'


# ================================================================ formats

def _scan_nearest(v, table):
    """Independent reference: nearest value of a sorted non-negative table,
    ties to the even code (table index); by scanning, no rounding arithmetic."""
    out = np.empty(len(v), np.int64)
    for i, x in enumerate(v):
        d = np.abs(table - x)
        best = np.flatnonzero(d == d.min())
        out[i] = best[0] if len(best) == 1 else [b for b in best if b % 2 == 0][0]
    return out


@test
def formats_e2m1_exhaustive():
    want = [0, .5, 1, 1.5, 2, 3, 4, 6]
    for c in range(16):
        v = F.e2m1_decode(c)
        assert v == (-1) ** (c >> 3) * want[c & 7] and np.signbit(v) == bool(c & 8), c
        assert F.e2m1_encode(v) == c, c
    ex = [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6), (7.0, 7),
          (1e9, 7), (np.inf, 7), (-np.inf, 0xF), (-0.25, 0x8), (-0.0, 0x8), (0.0, 0), (5.0001, 7),
          (-3.5, 0xE)]
    for x, c in ex:
        assert F.e2m1_encode(x) == c, (x, F.e2m1_encode(x), c)
    assert F.e2m1_encode(np.nan) == 7 and F.e2m1_encode(-np.nan) == 7
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(0, 7, 4000), np.arange(0, 6.01, 0.25)])
    ref = _scan_nearest(x, F.E2M1_POS)
    assert np.array_equal(F.e2m1_encode(x), np.minimum(ref, 7)), 'E2M1 RNE vs scan'


@test
def formats_e4m3_exhaustive():
    fixed = {0x00: 0.0, 0x01: 2.0 ** -9, 0x07: 7 * 2.0 ** -9, 0x08: 2.0 ** -6, 0x28: 0.25,
             0x38: 1.0, 0x3F: 1.875, 0x40: 2.0, 0x7E: 448.0, 0xFE: -448.0, 0x80: -0.0, 0xB8: -1.0}
    for c, v in fixed.items():
        assert F.e4m3_decode(c) == v and np.signbit(F.e4m3_decode(c)) == np.signbit(v), hex(c)
    assert np.isnan(F.e4m3_decode(0x7F)) and np.isnan(F.e4m3_decode(0xFF))
    assert np.all(np.diff(F.E4M3_VALUES[:0x7F]) > 0), 'positive codes increase'
    for c in range(256):
        if c & 0x7F != 0x7F:
            assert F.e4m3_encode(F.e4m3_decode(c)) == c, hex(c)
    # every tie point, its neighbours, and random values against a table scan
    pos = F.E4M3_VALUES[:0x7F]
    mids = (pos[1:] + pos[:-1]) / 2
    x = np.concatenate([mids, np.nextafter(mids, 0), np.nextafter(mids, 1e9),
                        np.random.default_rng(2).uniform(0, 450, 3000),
                        np.random.default_rng(3).uniform(0, 2.0 ** -6, 500)])
    ref = _scan_nearest(x, pos)
    got = F.e4m3_encode(x)
    ok = x < 448
    assert np.array_equal(got[ok], ref[ok]), 'E4M3 RNE vs scan'
    assert np.array_equal(F.e4m3_encode(-x[ok]), ref[ok] | 0x80), 'negated'
    assert F.e4m3_encode(464.0) == 0x7E and F.e4m3_encode(1e6) == 0x7E and F.e4m3_encode(np.inf) == 0x7E
    assert F.e4m3_encode(-np.inf) == 0xFE and F.e4m3_encode(np.nan) == 0x7F and F.e4m3_encode(-np.nan) == 0x7F
    # roundup: the smallest E4M3 value >= x
    xs = np.random.default_rng(4).uniform(1e-4, 448, 3000)
    ru = F.e4m3_decode(F.e4m3_roundup(xs))
    below = F.e4m3_decode(F.e4m3_roundup(xs) - 1)
    assert np.all(ru >= xs) and np.all(below < xs)
    assert F.e4m3_roundup(0.0) == 0 and F.e4m3_roundup(-1.0) == 0 and F.e4m3_roundup(500.) == 0x7E
    assert F.e4m3_roundup(np.nan) == 0x7F and F.e4m3_roundup(1.0) == 0x38


@test
def formats_e8m0_rules():
    assert F.e8m0_scale(7.0, 6.0, 'ceil') == 128 and F.e8m0_scale(7.0, 6.0, 'ocp') == 127  # SPEC 4.3
    for k in range(-20, 20):
        a = 6.0 * 2.0 ** k
        assert F.e8m0_scale(a, 6.0) == 127 + k
        assert F.e8m0_scale(np.nextafter(a, np.inf), 6.0) == 128 + k
        assert F.e8m0_scale(np.nextafter(a, 0), 6.0) == 127 + k
    assert F.e8m0_scale(0.0, 6.0) == 0 and F.e8m0_scale(np.nan, 6.0) == 0xFF
    assert F.e8m0_scale(np.inf, 6.0) == 0xFF
    assert F.e8m0_decode(0) == 2.0 ** -127 and np.isnan(F.e8m0_decode(0xFF))
    a = np.random.default_rng(5).uniform(1e-6, 1e6, 2000)
    s = F.e8m0_decode(F.e8m0_scale(a, 6.0))
    assert np.all(6 * s >= a) and np.all(3 * s < a), 'CEIL: smallest power of two'


@test
def formats_sizes():
    assert F.fp4_bytes(512, 16) == 288 and F.fp4_bytes(128, 32) == 68
    assert F.fp4_bytes(512, 16) + F.fp4_bytes(128, 32) == 356
    assert F.fp8_bytes(512, 32, 'e8m0') == 528 and F.fp8_bytes(512, 512, 'f32') == 516
    assert F.fp8_bytes(512, 128, 'f32') == 528 and F.fp8_bytes(256, 32, 'e8m0') == 264
    assert F.fp4_bytes(48, 16) == 24 + 3 and F.fp4_bytes(10, 3) == 0 and F.fp8_bytes(10, 3, 'f32') == 0
    x = np.random.default_rng(6).standard_normal((3, 512))
    assert F.main_kv_pack(x).shape == (3, 288) and F.indexer_k_pack(x[:, :128]).shape == (3, 68)
    assert F.swa_pack(x).shape == (3, 516) and F.swa_pack(x, 32, 'e8m0').shape == (3, 528)
    assert F.engram_row_pack(x[:, :256]).shape == (3, 264)
    # SPEC 8.7.33: 356 (3 floor(n/2) + n) at n = 1024
    assert 356 * (3 * 512 + 1024) == 911360 == 890 * 1024


@test
def formats_layouts():
    # docs/formats.md 2.1 worked example
    x = np.zeros(32)
    x[0], x[1], x[3], x[16:] = 6, -0.5, -0.0, 1.5
    b = F.pack_e2m1(x, 16, 'e4m3')
    assert b.tobytes() == bytes.fromhex('9780000000000000' + '77' * 8 + '3828'), b.tobytes().hex()
    assert F.pack_e2m1(x, 16, 'e4m3', nibble='high_first')[:2].tobytes() == b'\x79\x08'
    assert np.array_equal(F.unpack_e2m1(b, 32, 16, 'e4m3'), x)
    assert np.signbit(F.unpack_e2m1(b, 32, 16, 'e4m3')[3])
    # Indexer-K (MXFP4), hand computed: block 0 {7, -1}: scale 2 (0x80), 3.5 -> 4 (0x6),
    # -0.5 (0x9); block 1 zero (0x00); block 2 {0.75}: scale 1/8 (0x7C), 6 (0x7);
    # block 3 {.., -6 at 127}: scale 1 (0x7F), 0xF in the high nibble of byte 63.
    y = np.zeros(128)
    y[0], y[1], y[64], y[127] = 7, -1, 0.75, -6
    b = F.indexer_k_pack(y)
    want = bytearray(68)
    want[0], want[32], want[63] = 0x96, 0x07, 0xF0
    want[64:68] = bytes([0x80, 0x00, 0x7C, 0x7F])
    assert b.tobytes() == bytes(want), b.tobytes().hex()
    # SWA FP32 per entry: s = fl32(2/448); 1/s = 224 (0x76), -2/s = -448 (0xFE)
    z = np.zeros(512)
    z[0], z[1] = 1.0, -2.0
    b = F.swa_pack(z)
    s = np.float32(2) / np.float32(448)
    want = bytearray(516)
    want[0], want[1] = 0x76, 0xFE
    want[512:] = struct.pack('<f', s)
    assert b.tobytes() == bytes(want)
    assert F.swa_unpack(b)[1] == np.float32(np.float32(-448) * s)
    # SWA E8M0: block 0 {448}: k 0 (0x7F), 0x7E; block 1 {1000}: k 2 (0x81), 250 -> 256 (0x78)
    w = np.zeros(64)
    w[0], w[32] = 448, 1000
    b = F.pack_e4m3(w, 32, 'e8m0')
    want = bytearray(66)
    want[0], want[32], want[64], want[65] = 0x7E, 0x78, 0x7F, 0x81
    assert b.tobytes() == bytes(want)


@test
def formats_special_blocks():
    x = np.zeros(48)
    x[0], x[16], x[32] = 1e4, -1e30, 2000
    v = F.unpack_e2m1(F.pack_e2m1(x, 16, 'e4m3'), 48, 16, 'e4m3')
    assert v[0] == 2688 and v[16] == -2688 and v[32] == 2112, v[[0, 16, 32]]
    assert F.pack_e2m1(x, 16, 'e4m3')[24 + 2] == F.e4m3_encode(352.0)
    z = np.array([0.0, -0.0] * 8)
    b = F.pack_e2m1(z, 16, 'e4m3')
    assert b[-1] == 0 and np.array_equal(np.signbit(F.unpack_e2m1(b, 16, 16)), np.signbit(z))
    assert F.pack_e2m1(z, 16, 'e8m0')[-1] == 0
    bs = F.swa_pack(np.concatenate([z] * 32))
    assert struct.unpack('<f', bs[512:].tobytes())[0] == 0.0
    # NaN / Inf poison their own block only
    p = np.ones(32)
    p[3] = np.nan
    b = F.pack_e2m1(p, 16, 'e4m3')
    assert b[16] == 0x7F and not b[:8].any() and b[17] != 0x7F
    v = F.unpack_e2m1(b, 32, 16, 'e4m3')
    clean = F.pack_e2m1(np.ones(32), 16, 'e4m3')
    assert np.isnan(v[:16]).all() and np.array_equal(v[16:], F.unpack_e2m1(clean, 32, 16, 'e4m3')[16:])
    assert b[8:16].tobytes() == clean[8:16].tobytes() and b[17] == clean[17]
    b = F.pack_e2m1(np.where(np.arange(32) == 20, np.inf, 1.0), 32, 'e8m0')
    assert b[-1] == 0xFF and np.isnan(F.unpack_e2m1(b, 32, 32, 'e8m0')).all()
    b = F.swa_pack(np.where(np.arange(512) == 7, -np.inf, 1.0))
    assert b[512:].tobytes() == bytes.fromhex('0000c07f') and np.isnan(F.swa_unpack(b)).all()
    # tiny amax: fl32(amax/6) underflows -> Main-KV scale 0x01
    t = np.zeros(16, np.float32)
    t[0] = np.float32(2.0 ** -149)
    assert F.pack_e2m1(t, 16, 'e4m3')[-1] == 0x01


def _h_e2m1(a):
    return np.where(a < 2, 0.25, np.where(a < 4, 0.5, 1.0))


@test
def formats_round_trip_bounds():
    rng = np.random.default_rng(7)
    for W, B in ((512, 16), (48, 16), (80, 16), (128, 32), (96, 32), (64, 2)):
        x = (rng.standard_normal((50, W)) * rng.uniform(0.01, 100, (50, 1))).astype(np.float32)
        for sc in ('e4m3', 'e8m0'):
            b = F.pack_e2m1(x, B, sc)
            v = F.unpack_e2m1(b, W, B, sc)
            s = (F.e4m3_decode(b[:, W // 2:]) if sc == 'e4m3' else F.e8m0_decode(b[:, W // 2:]))
            s = np.repeat(s, B, axis=1)
            xb = x.astype(np.float64)
            a = np.abs(xb) / s
            assert np.all(np.abs(xb - v) <= _h_e2m1(a) * s), (W, B, sc)
            assert np.all(np.abs(v) <= 6 * s) and np.array_equal(np.signbit(v), np.signbit(xb))
            amax = np.abs(xb).reshape(50, -1, B).max(axis=2)
            if sc == 'e4m3':  # s is exactly E4M3_roundup(amax / 6)
                ss = s.reshape(50, -1, B)[:, :, 0]
                assert np.all(6 * ss >= amax) and np.all(6 * F.e4m3_decode(
                    F.e4m3_roundup(amax / 6) - 1) < amax)
            # bit-exact against the scan reference: nearest grid point of x/s, times s
            ref = _scan_nearest(np.minimum(a.ravel(), 6.0), F.E2M1_POS)
            assert np.array_equal(np.abs(v).ravel(), F.E2M1_POS[ref] * s.ravel()), (W, B, sc)
    for B, sc in ((512, 'f32'), (128, 'f32'), (32, 'e8m0')):
        x = (rng.standard_normal((20, 512)) * rng.uniform(1e-3, 1e3, (20, 1))).astype(np.float32)
        v = F.unpack_e4m3(F.pack_e4m3(x, B, sc), 512, B, sc)
        assert np.all(np.abs(x - v) <= 2.0 ** -4 * np.abs(x) + 1e-30 + (
            np.abs(x).reshape(20, -1, B).max(2).repeat(B, 1) / 448 * 2 ** -9 * 1.01)), (B, sc)
        assert np.array_equal(np.signbit(v), np.signbit(x))


# ================================================================ plans

@test
def numerics_bf16_mxfp8():
    # Appendix V #22, docs/model.md s7: hand-computed MXFP8 blocks and bf16 roundings
    x = np.zeros(32)
    x[:3] = [3.0, 1.1, -0.01]     # amax 3: s = 2^ceil(log2(3/448)) = 2^-7; 3/s = 384 (exact)
    q = O.mxfp8(x)                 # 1.1/s = 140.8 -> 144 (step 16 in [128, 256)) -> 1.125
    assert q[0] == 3.0 and q[1] == 1.125 and q[2] == -1.25 / 128, q[:3]   # -1.28 -> -1.25 (step 1/8)
    assert np.array_equal(O.mxfp8(q), q), 'MXFP8 is idempotent'
    tiny = np.full(32, 1e-6)       # amax below the 1e-4 floor: s = 2^ceil(log2(1e-4/448)) = 2^-22
    assert np.array_equal(O.mxfp8(tiny), np.full(32, F.e4m3_decode(F.e4m3_encode(1e-6 * 2 ** 22)) * 2.0 ** -22))
    w = np.array([448.0 * 4, 1.0] + [0.0] * 38)  # 40 wide: a full block and a short last one of 8
    qw = O.mxfp8(w)
    assert qw[0] == 1792.0 and qw[1] == 1.0 and O.mxfp8(np.arange(40.0))[39] == 40.0  # short block: 39/2^-3 = 312 -> 320
    r = np.random.default_rng(3).standard_normal((64, 96))
    e = np.abs(O.mxfp8(r) - r) / np.maximum(np.abs(r), 1e-300)
    assert e[np.abs(r) > 2 ** -6 * 4].max() <= 2 ** -4, 'E4M3 keeps 3 mantissa bits (half ulp 2^-4)'
    assert O.to_bf16(np.array([1 + 2 ** -8]))[0] == 1.0 and O.to_bf16(np.array([1 + 3 * 2 ** -8]))[0] == 1 + 2 ** -6


@test
def plan_yaml_subset():
    y = P.parse_yaml('''
# comment
a: 1            # trailing
b: {x: 1.0e-6, y: [1, 2, "3"], z: 'q # not a comment'}
c:
  - {at: 3-7, mode: reuse}
  - 5
  - [1, 2]
d:
  e: true
  f: null
  g: -2
  h: low_first
''')
    assert y == {'a': 1, 'b': {'x': 1e-6, 'y': [1, 2, '3'], 'z': 'q # not a comment'},
                 'c': [{'at': '3-7', 'mode': 'reuse'}, 5, [1, 2]],
                 'd': {'e': True, 'f': None, 'g': -2, 'h': 'low_first'}}, y
    for bad in ('a: 1\na: 2\n', 'a: *x\n', 'a: {b: 1\n', 'a: {b: 1, b: 2}\n', 'a:\n  b: 1\n c: 2\n'):
        try:
            P.parse_yaml(bad)
        except P.PlanError:
            continue
        raise AssertionError('accepted %r' % bad)
    assert P.expand_at([24, '28', '30-32']) == [24, 28, 30, 31, 32]


@test
def plan_flash_is_spec_2_2():
    p = P.Plan(path('plans/v41-flash.yaml'))
    assert len(p.layers) == 40 and p.ced and p.window == 128 and p.replay_decoder() == 128
    modes = [d['mode'] for d in p.layers]
    assert [l for l in range(40) if modes[l] == 'swa_only'] == [0, 1]
    assert [l for l in range(40) if modes[l] == 'full'] == [2, 8, 14, 20]
    assert [l for l in range(40) if modes[l] == 'reindex'] == [24, 28, 32, 36]
    assert modes.count('reuse') == 30
    assert p.index_sources() == [2, 8, 14, 20, 24, 28, 32, 36]
    for l in range(2, 40):
        kv = 2 if l < 8 else 8 if l < 14 else 14 if l < 20 else 20
        tk = max(s for s in [2, 8, 14, 20, 24, 28, 32, 36] if s <= l)
        assert p.layers[l]['kv'] == kv and p.layers[l]['topk'] == tk, l
        assert p.layers[l]['ratio'] == (2 if l < 20 else 1)
        assert p.layers[l]['region'] == ('encoder' if l < 20 else 'decoder')
    assert p.layers[25]['kv'] == 20 and p.layers[25]['topk'] == 24 and p.layers[39]['topk'] == 36
    assert p.layers[20]['candidates'] == 'build' and p.pool_readers(20) == [24, 28, 32, 36]
    assert [l for l in range(40) if p.layers[l]['candidates'] != 'none'] == [20, 24, 28, 32, 36]
    assert [d['at'] for d in p.layers if d['engram']] == [1, 14]
    assert p.model['hidden'] == 5120 and p.formats['main_kv'] == {
        'element': 'e2m1', 'scale': 'e4m3', 'block': 16, 'scale_rule': 'auto', 'scale_floor': None,
        'bf16_round': True}
    assert F.resolve(p.formats['swa']) == ('e4m3', 'e8m0', 32, 'ceil', 1e-4, True)  # Appendix V #21
    sh = O.weight_shapes(p)
    assert sh['layers.20.attn.compressor.wkv'][1] == (512, 5120)
    assert 'layers.20.attn.compressor.wgate' not in sh and 'layers.2.attn.compressor.wgate' in sh
    assert 'layers.21.attn.indexer.wq_b' not in sh and 'layers.24.attn.indexer.wq_b' in sh
    assert 'layers.24.attn.compressor.wkv' not in sh
    assert sh['layers.1.engram.table'][1] == (384006168, 264)
    assert sh['layers.14.engram.table'][1] == (384016682, 264)
    assert sh['layers.1.engram.wkv'][1] == (5 * 5120, 6144)
    assert sh['layers.3.attn.wo_a'][1] == (8, 1024, 4096) and sh['layers.3.attn.wo_b'][1] == (5120, 8192)


@test
def plan_extends_and_overrides():
    mini = P.Plan(path(MINI))
    flash = P.Plan(path('plans/v41-flash.yaml'))
    strip = lambda p: [(d['mode'], d['kv'], d['topk'], d['pool'], d['ratio'], d['engram']) for d in p.layers]  # noqa
    assert strip(mini) == strip(flash)
    assert mini.model['hidden'] == 256 and mini.model['attention']['rope_dim'] == 32
    assert mini.formats == flash.formats  # the same per-32 rules at mini widths (Appendix V #21)
    assert mini.model['rope']['csa']['theta'] == 160000
    r2 = P.Plan(path('plans/alt-reindex2.yaml'))
    assert [d['at'] for d in r2.layers if d['mode'] == 'reindex'] == [22, 24, 26, 28, 30, 32, 34, 36, 38]
    assert r2.layers[23]['topk'] == 22 and r2.layers[22]['pool'] == 20
    npool = P.Plan(path('plans/alt-no-pool.yaml'))
    assert all(d['candidates'] == 'none' and d['pool'] is None for d in npool.layers)
    two = P.Plan(path('plans/alt-two-dec-sources.yaml'))
    assert two.kv_sources() == [2, 8, 14, 20, 30] and two.layers[31]['kv'] == 30
    assert two.layers[32]['pool'] == 30 and two.layers[28]['pool'] == 20
    dense = P.Plan(path('plans/dense-40.yaml'))
    assert not dense.ced and len(dense.kv_sources()) == 38
    small = P.Plan(path('tests/plans/small.yaml'))
    assert small.table() == [(0, 'encoder', 'swa_only', None, None, None, None, True),
                             (1, 'encoder', 'full', 2, 1, 1, None, False),
                             (2, 'encoder', 'reuse', 2, 1, 1, None, False),
                             (3, 'decoder', 'full', 1, 3, 3, None, False),
                             (4, 'decoder', 'reindex', 1, 3, 4, 3, False),
                             (5, 'decoder', 'reuse', 1, 3, 4, None, False)]


@test
def plan_agrees_with_cedar_plan_show():
    cedar = os.environ.get('CEDAR_BIN') or path('build', 'cedar')
    if not os.access(cedar, os.X_OK):
        return 'skipped (no cedar binary)'
    plans = sorted(os.path.join('plans', f) for f in os.listdir(path('plans')) if f.endswith('.yaml'))
    plans += ['tests/plans/small.yaml'] + sorted(
        os.path.join('tests/oracle/plans', f) for f in os.listdir(path('tests/oracle/plans')))
    for pr in plans:
        out = subprocess.run([cedar, 'plan', 'show', '--json', pr], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
        c = json.loads(out)
        p = P.Plan(path(pr))
        n1 = lambda v: -1 if v is None else v  # noqa
        assert c['ced'] == p.ced and len(c['layers']) == len(p.layers), pr
        for a, b in zip(c['layers'], p.layers):
            assert (a['layer'], a['region'], a['mode'], a['ratio'], a['kv_source'], a['topk_source'],
                    a['candidates'], a['pool_source'], a['engram']) == (
                b['at'], b['region'], b['mode'], b['ratio'] or 0, n1(b['kv']), n1(b['topk']),
                b['candidates'], n1(b['pool']), b['engram']), (pr, a, b)
        assert c['key_slot'] == p.model['indexer'].get('key_slot', 'vendor'), (pr, c['key_slot'])
    return '%d plans' % len(plans)


# ================================================================ safetensors, engram, rope

@test
def safetensors_round_trip():
    t = {'a': np.arange(6, dtype=np.float32).reshape(2, 3), 'b': np.arange(5, dtype=np.uint8),
         'c': np.zeros((0, 4), np.float32), 'd': np.array(3.5, np.float32)}
    f = os.path.join(TMP, 'rt.safetensors')
    ST.write(f, t, {'k': 'v'})
    r = ST.SafeTensors(f)
    assert r.meta == {'k': 'v'} and sorted(r.names) == ['a', 'b', 'c', 'd']
    for k, v in t.items():
        assert np.array_equal(r[k], v) and r[k].shape == v.shape, k
    raw = open(f, 'rb').read()
    n = struct.unpack('<Q', raw[:8])[0]
    assert n % 8 == 0 and raw[8:9] == b'{'
    with open(os.path.join(TMP, 'bad.safetensors'), 'wb') as g:
        g.write(raw + b'\0')   # a byte after the last tensor
    try:
        ST.SafeTensors(os.path.join(TMP, 'bad.safetensors'))
        raise AssertionError('trailing byte accepted')
    except ST.STError:
        pass


@test
def engram_prime_rule_and_multipliers():
    flash = P.Plan(path('plans/v41-flash.yaml'))
    pr = O.engram_primes(flash.model, [1, 14])
    allp = [p for l in (1, 14) for o in pr[l] for p in o]
    assert len(allp) == 48 == len(set(allp)) and allp == sorted(allp)
    assert allp[0] == 16000057 and allp[-1] == 16000889
    assert sum(sum(o) for o in pr[1]) == 384006168 and sum(sum(o) for o in pr[14]) == 384016682
    assert (384006168 + 384016682) * 256 == 196613849600
    # SplitMix64 reference vector (seed 0): 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4
    assert O.splitmix64_stream(0, 2) == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
    m = O.engram_multipliers_splitmix64(0, 14, 4)
    assert all(x & 1 for x in m) and m == [x | 1 for x in O.splitmix64_stream(10007 * 14, 4)]
    # Appendix V #18: numpy default_rng(10007 l) over the compressed vocabulary
    m = O.engram_multipliers(14, 4, 99092)
    assert m == [67716810739261, 51510806800915, 30921347202721, 82619226485591], m
    assert all(x & 1 and x < (2**63 - 1) // 99092 for x in O.engram_multipliers(1, 4, 99092))
    # the held-out signed check: multipliers [-1, 3], ids [5, pad 2], prime 16000057
    h = np.array([(5 * (2**64 - 1) ^ 2 * 3) & O.MASK64], np.uint64)
    assert int(O.engram_row(h, 16000057, 'signed_floor')[0]) == 16000054
    assert int(O.engram_row(h, 16000057, 'unsigned')[0]) == 9903347
    mini = P.Plan(path(MINI))
    pm = O.engram_primes(mini.model, [1, 14])
    assert pm[1] == [[1009, 1013], [1019, 1021], [1031, 1033]] and pm[14][0] == [1039, 1049]


@test
def rope_relative_and_yarn():
    rng = np.random.default_rng(8)
    f = O.rope_freqs({'theta': 160000.0, 'yarn': True, 'yarn_factor': 16.0, 'yarn_original_len': 65536,
                      'yarn_beta_fast': 32.0, 'yarn_beta_slow': 1.0}, 64)
    f0 = O.rope_freqs({'theta': 160000.0, 'yarn': False}, 64)
    assert O.yarn_correction_range(32, 1, 64, 160000, 65536) == (15, 25)
    assert np.allclose(f[:16], f0[:16], rtol=0, atol=0) and np.allclose(f[25:], f0[25:] / 16, rtol=1e-15)
    assert np.all((f[16:25] < f0[16:25]) & (f[16:25] > f0[16:25] / 16))
    q, k = rng.standard_normal((1, 96)), rng.standard_normal((1, 96))
    dots = []
    for p, s in ((10, 3), (1000010, 1000003), (7, 0)):
        dots.append(float(O.rope(q, [p], f, 64) @ O.rope(k, [s], f, 64).T))
    assert abs(dots[0] - dots[1]) < 1e-9 and abs(dots[0] - dots[2]) < 1e-12, dots
    x = rng.standard_normal((3, 2, 96))
    back = O.rope(O.rope(x, [5, 6, 7], f, 64), [5, 6, 7], f, 64, inverse=True)
    assert np.allclose(back, x, atol=1e-14) and np.array_equal(O.rope(x, [0, 0, 0], f, 64), x)
    y = O.rope(x, [1, 1, 1], O.rope_freqs({'theta': 1e4}, 16), 16, where='first')
    assert np.array_equal(y[..., 16:], x[..., 16:]) and not np.array_equal(y[..., :16], x[..., :16])


# ================================================================ model: tiny plans

@test
def tiny_shapes_finite_deterministic():
    toks = prompt(40, 97)
    a, b = oracle(TINY), oracle(TINY)
    ra, rb = a.prefill(toks), b.prefill(toks)
    assert ra.logits.shape == (12, 97) and list(ra.positions) == list(range(28, 40))
    assert np.isfinite(ra.logits).all() and np.array_equal(ra.logits, rb.logits)
    assert np.array_equal(ra.last, ra.logits[-1])
    ya, yb = a.greedy(ra.last), b.greedy(rb.last)
    for _ in range(5):
        la, lb = a.decode(ya), b.decode(yb)
        assert la.shape == (97,) and np.isfinite(la).all() and np.array_equal(la, lb)
        ya, yb = a.greedy(la), b.greedy(lb)
    for l in a.src:
        assert np.array_equal(a.src[l]['main_bytes'], b.src[l]['main_bytes'])
    assert a.w.meta.get('cedar.seed') == '1'


@test
def tiny_counts_entries_tails():
    for N in (40, 41, 7):
        o = oracle(TINY)
        o.prefill(prompt(N, 97))
        R = min(N, 12)
        assert list(o.token_layers) == [N, N, N, R, R, R], (N, o.token_layers)
        assert o.total_token_layers == 3 * N + 3 * R
        assert o.entries(1) == N // 2 and o.tail(1) == N % 2 and o.entries(3) == N and o.tail(3) == 0
        assert o.src[3]['appends'] == N and o.src[1]['appends'] == N
        per = F.fp4_bytes(o.dh, 16) + F.fp4_bytes(o.dI, 32)
        assert o.src[3]['main_bytes'].shape[1] + o.src[3]['ik_bytes'].shape[1] == per
        for step in range(3):
            before = o.token_layers.copy()
            n = o.n
            o.decode(5 + step)
            assert np.array_equal(o.token_layers - before, np.ones(6, np.int64)), 'every layer once'
            assert o.entries(1) == (n + 1) // 2 and o.tail(1) == (n + 1) % 2
            assert o.entries(3) == n + 1
        # appending a position twice is refused
        try:
            o._append_entries(3, np.zeros((1, o.d)), np.array([0]))
            raise AssertionError('re-append accepted')
        except AssertionError as e:
            assert 'exactly once' in str(e)


@test
def tiny_chunked_equals_one_shot():
    toks = prompt(45, 97, seed=3)
    ref = oracle(TINY)
    r_ref = ref.prefill(toks, chunk=45)
    snap = {l: (ref.src[l]['main_bytes'].copy(), ref.src[l]['ik_bytes'].copy(), ref.src[l]['tail_v'].copy())
            for l in ref.src}
    rings = {l: (ref.rings[l]['bytes'].copy(), ref.rings[l]['pos'].copy()) for l in ref.rings}
    d_ref = [ref.decode(t) for t in (3, 4, 5)]
    worst = 0.0
    for chunk, rc in ((1, 1), (5, 3), (16, 12), (7, 5), (44, 1)):
        o = oracle(TINY)
        r = o.prefill(toks, chunk=chunk, replay_chunk=rc)
        worst = max(worst, close(r.logits, r_ref.logits, 1e-12, 'chunk %d/%d logits' % (chunk, rc)))
        for l in o.src:
            assert np.array_equal(o.src[l]['main_bytes'], snap[l][0]), (chunk, l)
            assert np.array_equal(o.src[l]['ik_bytes'], snap[l][1]), (chunk, l)
            if o.tail(l):
                close(o.src[l]['tail_v'], snap[l][2], 1e-12, 'tail')
        for l in o.rings:
            assert np.array_equal(o.rings[l]['bytes'], rings[l][0]), (chunk, l)
            assert np.array_equal(o.rings[l]['pos'], rings[l][1])
        for t, dr in zip((3, 4, 5), d_ref):
            worst = max(worst, close(o.decode(t), dr, 1e-12, 'decode after chunk %d' % chunk))
    # dense flow too
    toks = toks[:30]
    ref = oracle(TINY_DENSE)
    r_ref = ref.prefill(toks, chunk=30)
    for chunk in (1, 4, 13):
        o = oracle(TINY_DENSE)
        worst = max(worst, close(o.prefill(toks, chunk=chunk).logits, r_ref.logits, 1e-12, 'dense'))
    return 'worst relative difference %.2g' % worst


@test
def tiny_ced_short_prompt_equals_dense():
    """N <= replay: CED runs every layer on every position, so it must equal
    the dense flow of the same layer table (given docs/model.md's rule that
    the first decoder source projects from exactly its own attention input)."""
    toks = prompt(12, 97, seed=4)
    c, d = oracle(TINY), oracle(TINY_DENSE)
    rc, rd = c.prefill(toks), d.prefill(toks, chunk=5)
    assert c.total_token_layers == d.total_token_layers == 6 * 12
    w = close(rc.logits, rd.logits, 1e-12, 'CED vs dense')
    for t in (1, 2, 3, 4):
        w = max(w, close(c.decode(t), d.decode(t), 1e-12, 'decode CED vs dense'))
    # the vendor pairing is what makes this hold: with it the decoder global is
    # projected from exactly L_dec's own attention input, carried pre included;
    # SPEC's v4 pairing (own pre everywhere, head.hc) holds it too, and differs
    v, vd = oracle(TINY_V4), oracle(TINY_V4)
    vd.plan.serving['ced'] = False
    rv, rvd = v.prefill(toks), vd.prefill(toks, chunk=5)
    w = max(w, close(rv.logits, rvd.logits, 1e-12, 'v4: CED vs dense'))
    diff = np.max(np.abs(rv.logits - rc.logits))
    assert diff > 1e-6, 'pairing v4 gives the logits of v41: the option is ignored'
    return 'max rel diff %.2g; pairing v4 differs by %.2g' % (w, diff)


@test
def tiny_replay_truncation_and_windows():
    N = 40
    o = oracle(TINY, keep_buses=True)
    o.prefill(prompt(N, 97, seed=5), chunk=16, replay_chunk=5)
    r0 = N - 12
    assert o.replay_start == r0
    W, K = o.W, o.topk
    replays = [fw for fw in o.log if fw.kind == 'replay']
    enc = [fw for fw in o.log if fw.kind == 'encoder']
    assert len(replays) == 3 and len(enc) == 3
    for fw in replays:
        p0, p1 = fw.positions
        for l in o.dec:
            for st in fw.layers[l]:
                assert st['swa_min_read'] >= r0, (l, st['swa_min_read'])
                assert list(st['swa_counts']) == [min(p - r0 + 1, W) for p in range(p0, p1)]
                assert st['global_max_entries'] <= K
    read_before = [st['swa_min_read'] for fw in enc[1:] for l in o.enc for st in fw.layers[l]]
    assert min(read_before) < 16, 'encoder layers read their full window across chunks'
    for fw in enc:
        p0, p1 = fw.positions
        for l in o.enc:
            for st in fw.layers[l]:
                assert list(st['swa_counts']) == [min(p + 1, W) for p in range(p0, p1)]
    # decoder rings hold only replayed positions; encoder rings every position
    assert o.rings[3]['pos'][0] == r0 and o.rings[0]['pos'][0] == 0


@test
def tiny_topk_and_pool_invariants():
    N = 60
    o = oracle(TINY, keep_buses=True)
    o.prefill(prompt(N, 97, seed=6), chunk=16, replay_chunk=60)
    for _ in range(2):
        o.decode(7)
    cb = o.m['candidates']
    B, TB, K = cb['block'], cb['top_blocks'], o.topk
    checked = 0
    for fw in o.log:
        p0, p1 = fw.positions
        pos = np.arange(p0, p1)
        for l, idx in fw.topk.items():
            L = o.plan.layers[l]
            r = o.src[L['kv']]['ratio']
            nvis = (pos + 1) // r
            valid = idx >= 0
            for i, p in enumerate(pos):
                sel = idx[i][valid[i]]
                assert len(set(sel)) == len(sel), 'duplicates'
                assert np.all(r * sel + r - 1 <= p), 'invisible entry selected'
                if L['candidates'] != 'read':
                    assert len(sel) == min(K, nvis[i]), (l, p, len(sel), nvis[i])
                else:
                    pool = np.flatnonzero(fw.pool[L['pool']][i])
                    assert set(sel) <= set(pool) and len(sel) == min(K, len(pool))
                checked += 1
        for l, pm in fw.pool.items():
            assert o.plan.layers[l]['candidates'] == 'build'
            for i, p in enumerate(pos):
                ent = np.flatnonzero(pm[i])
                blocks = set(ent // B)
                assert len(blocks) == min(TB, -(-(p + 1) // B))
                want = {s for s in range(p + 1) if s // B in blocks}
                assert set(ent) == want, 'pool = whole blocks clipped at p'
                top = fw.topk[l][i]
                if o.pin:   # Appendix V #12: the newest block is in; it may displace a Top-K block
                    assert p // B in blocks, 'the newest visible block is pinned'
                else:
                    assert set(top[top >= 0]) <= set(ent), "the builder's Top-K lies in its pool"
            # the pool engages: some query's pool misses a visible entry
            assert any(pm[i].sum() < pos[i] + 1 for i in range(len(pos))) or p1 <= TB * B
    # reuse layers read their source's Top-K (per forward, per query)
    assert checked > 80
    return '%d (layer, query) Top-K rows checked' % checked


@test
def tiny_attention_entry_bounds():
    o = oracle(TINY)
    o.prefill(prompt(50, 97, seed=7))
    o.decode(1)
    for fw in o.log:
        for l, sts in fw.layers.items():
            for st in sts:
                assert st['swa_max_entries'] <= o.W and st['global_max_entries'] <= o.topk
                if o.plan.layers[l]['mode'] == 'swa_only':
                    assert st['global_max_entries'] == 0


@test
def tiny_op_level_rules():
    o = oracle(TINY)
    rng = np.random.default_rng(9)
    # mHC Sinkhorn (SPEC 8.6.27): non-negative, columns exact, rows within R.7's bound
    X = rng.standard_normal((64, o.hc, o.d))
    post, C = o._hc_post_res(X, 'layers.2.hc_ffn')
    assert np.all(C >= 0) and np.all(np.abs(C.sum(axis=1) - 1) < 1e-5)
    assert np.all(np.abs(C.sum(axis=2) - 1) < 5e-2) and np.all((post > 0) & (post < 2))
    # MoE bias rule (SPEC 8.5.24): a bias change that keeps the selection keeps the output
    x = rng.standard_normal((32, o.d))
    y0 = o._moe(2, x)
    bias = o.w('layers.2.ffn.bias').copy()
    o.w._c['layers.2.ffn.bias'] = bias + np.array([[5.0] * bias.shape[1], [0.0] * bias.shape[1]])
    assert np.array_equal(o._moe(2, x), y0), 'a uniform bias shift changed the output'
    o.w._c['layers.2.ffn.bias'] = bias
    # the image row of the bias is not used for text
    o.w._c['layers.2.ffn.bias'] = bias * np.array([[1.0], [100.0]])
    assert np.array_equal(o._moe(2, x), y0)
    o.w._c['layers.2.ffn.bias'] = bias
    # Engram addresses are a pure function of token ids; the hash options differ
    o.tokens = prompt(20, 97)
    o.act_bf16 = False          # the injection's math, without the bf16 rounding of X (numerics, #22)
    Xs = rng.standard_normal((20, o.hc, o.d))
    e1 = o._engram(0, Xs, np.arange(20)) - Xs
    e2 = o._engram(0, 2 * Xs, np.arange(20)) - 2 * Xs
    assert e1.shape == Xs.shape and np.isfinite(e1).all()
    v1 = e1 / np.linalg.norm(e1, axis=-1, keepdims=True)
    v2 = e2 / np.linalg.norm(e2, axis=-1, keepdims=True)
    assert np.allclose(v1, v2, atol=1e-12), 'same rows -> same injected value direction'
    o.reset()
    s = oracle(TINY, hash_mod='unsigned', multipliers='splitmix64')
    a, b = o.prefill(prompt(10, 97)), s.prefill(prompt(10, 97))
    assert np.isfinite(b.logits).all() and a.logits.shape == b.logits.shape


# ================================================================ model: flash structure

@test
def flash_structure_1024_1025_1026():
    """SPEC 6.2 / 6.4 / 8.2.8 on the 40-layer V4.1 schedule (tiny widths)."""
    o = oracle(TINY40)
    N = 1024
    R = o.plan.replay_decoder()
    r = o.prefill(prompt(N, 97, seed=10))
    assert o.total_token_layers == 20 * N + 20 * min(N, R)
    assert r.logits.shape == (R, 97) and np.isfinite(r.logits).all()
    ev = lambda: [(o.entries(l), o.tail(l)) for l in (2, 8, 14)] + [(o.entries(20), o.tail(20))]  # noqa
    assert ev() == [(512, 0)] * 3 + [(1024, 0)]
    y = o.greedy(r.last)
    before = o.total_token_layers
    lg = o.decode(y)
    assert o.total_token_layers - before == 40
    assert ev() == [(512, 1)] * 3 + [(1025, 0)]
    o.decode(o.greedy(lg))
    assert ev() == [(513, 0)] * 3 + [(1026, 0)]
    assert o.src[20]['appends'] == 1026
    per = F.fp4_bytes(o.dh, 16) + F.fp4_bytes(o.dI, 32)
    total = sum(len(o.src[l]['main_bytes']) for l in o.src) * per
    assert total == per * (3 * (1026 // 2) + 1026)
    return 'token-layers %d for N=1024 (dense would be %d)' % (20 * N + 20 * R, 40 * N)


@test
def flash_structure_counts_and_second_decoder_source():
    o = oracle(TINY_TWO)
    N = 61
    o.prefill(prompt(N, 97, seed=11))
    R = min(N, o.plan.replay_decoder())
    assert o.total_token_layers == 20 * N + 20 * R
    assert o.entries(20) == N and o.entries(30) == N, 'every decoder source covers the prompt'
    assert all(o.entries(l) == N // 2 and o.tail(l) == 1 for l in (2, 8, 14))
    o.decode(3)
    assert o.entries(20) == o.entries(30) == N + 1 and o.entries(2) == (N + 1) // 2


@test
def dense_plan_token_layers():
    o = oracle(TINY_DENSE40)
    N = 30
    r = o.prefill(prompt(N, 97, seed=12), chunk=11)
    assert o.total_token_layers == 40 * N and r.logits.shape == (N, 97)
    assert len(o.src) == 38
    assert all(o.entries(l) == N // 2 for l in range(2, 20)) and all(o.entries(l) == N for l in range(20, 40))
    o.decode(1)
    assert o.total_token_layers == 40 * (N + 1)


@test
def mini_plan_200_tokens():
    """plans/v41-mini.yaml (hidden 256, 40 layers, top-k 512, window 128) at N = 200."""
    t0 = time.time()
    w = weights(MINI)
    t1 = time.time()
    o = O.Oracle(path(MINI), w)
    N = 200
    r = o.prefill(prompt(N, 512, seed=13))
    t2 = time.time()
    assert o.total_token_layers == 20 * N + 20 * 128 == 6560
    assert r.logits.shape == (128, 512) and np.isfinite(r.logits).all()
    assert [o.entries(l) for l in (2, 8, 14, 20)] == [100, 100, 100, 200]
    assert [o.tail(l) for l in (2, 8, 14)] == [0, 0, 0]
    y = o.greedy(r.last)
    for i in range(2):
        y = o.greedy(o.decode(y))
    t3 = time.time()
    assert o.total_token_layers == 6560 + 80
    assert [o.entries(l) for l in (2, 8, 14, 20)] == [101, 101, 101, 202]
    return 'weights %.1fs, prefill %.1fs, 2 decode steps %.1fs' % (t1 - t0, t2 - t1, t3 - t2)


# ================================================================ flip accounting (follow.py)


@test
def follow_certifies_only_within_the_bound():
    """follow.py takes cedar's side of a rounding or a selection only when the
    oracle's value lies within b = K u (|x| + rms) of the boundary."""
    import follow as FL

    class Stub:                      # a trace that answers with fixed rows
        def __init__(self, rows):
            self.r = rows

        def rows(self, pt, l, pos):
            return self.r[pt]
    beta = 1024 * 2.0 ** -24
    # bf16: 1 + 2^-8 is the tie between 1 and 1 + 2^-7 (even: 1); the value just
    # above it rounds up, cedar's neighbour below is certified; at 1 + 3 2^-9
    # (a quarter step from the tie) it is not
    near = np.array([[1.0 + 2.0 ** -8 + 1e-6, 1.0]])
    far = np.array([[1.0 + 3 * 2.0 ** -9, 1.0]])
    for x, expect in ((near, (1, 0)), (far, (0, 1))):
        fo = FL.Follow(Stub({'attn.y': np.array([[1.0, 1.0]])}), {}, beta)
        r = O.to_bf16(x)
        got = fo.bf16('attn.y', 3, np.array([7]), x, r)
        st = fo.stats['attn.y']
        assert (st['adopted'], st['refused']) == expect, (x, st)
        assert got[0, 0] == (1.0 if expect[0] else r[0, 0])
    # MXFP8: one block, amax 448 (scale 1); 1.0625 = 1 + 2^-4 is the E4M3 tie
    # between 1 and 1.125
    x = np.full((1, 32), 0.5)
    x[0, 0] = 448.0
    for v, expect in ((1.0625 + 1e-6, (1, 0)), (1.09, (0, 1))):
        x[0, 1] = v
        c = O.mxfp8(x).copy()
        c[0, 1] = 1.0
        fo = FL.Follow(Stub({'attn.o': c}), {}, beta)
        fo.mxfp8('attn.o', 0, np.array([0]), x, O.mxfp8(x))
        st = fo.stats['attn.o']
        assert (st['adopted'], st['refused']) == expect, (v, st)
    # a selection: top-1 of scores whose two best differ by 1e-7 (within b of
    # each other) may go either way; by 0.1 it may not
    for s1, expect in ((1.0 - 1e-7, (1, 0)), (0.9, (0, 1))):
        sc = np.array([[1.0, s1, 0.5]])
        fo = FL.Follow(Stub({'ffn.sel': np.array([[1]])}), {}, beta)
        got = fo.select('ffn.sel', 2, np.array([0]), sc, np.ones((1, 3), bool), np.array([[0]]))
        st = fo.stats['ffn.sel']
        assert (st['adopted'], st['refused']) == expect, (s1, st)
        assert got[0, 0] == (1 if expect[0] else 0)
    # a cache entry (E4M3, E8M0 per 32, bf16 first): an element at the tie of
    # two E4M3 codes may take either; a whole code away it may not
    fmt = {'element': 'e4m3', 'scale': 'e8m0', 'block': 32}
    x = np.full((1, 32), 0.25)
    x[0, 0] = 400.0                                    # scale 1
    x[0, 1] = 1.0625                                   # the tie: bf16-exact, RNE to 1
    for dv, expect in ((0.125, (1, 0)), (0.25, (0, 1))):
        bo, vo = F.store(x, fmt)
        xc = x.copy()
        xc[0, 1] = 1.0 + dv
        bc, _ = F.store(xc, fmt)
        fo = FL.Follow(Stub({'attn.swa': bc}), {}, beta)
        fo.store('attn.swa', 1, np.array([5]), x, fmt, 'low_first', bo, vo)
        st = fo.stats['attn.swa']
        assert (st['adopted'], st['refused']) == expect, (dv, st)
    return 'bf16, MXFP8, selection and cache entry, each certified and refused'


# ================================================================ runner

def main(argv):
    pick = None
    if '-k' in argv:
        pick = argv[argv.index('-k') + 1]
    fails = 0
    t_all = time.time()
    for fn in TESTS:
        if pick and pick not in fn.__name__:
            continue
        t = time.time()
        try:
            note = fn()
            print('ok    %-44s %6.2fs %s' % (fn.__name__, time.time() - t, note or ''))
        except Exception:  # noqa: BLE001
            fails += 1
            print('FAIL  %-44s %6.2fs' % (fn.__name__, time.time() - t))
            traceback.print_exc()
        sys.stdout.flush()
    print('%s: %d failed, total %.1fs' % ('FAILED' if fails else 'passed', fails, time.time() - t_all))
    for f in os.listdir(TMP):
        os.unlink(os.path.join(TMP, f))
    os.rmdir(TMP)
    return 1 if fails else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
