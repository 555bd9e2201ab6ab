"""model.py: the DeepSeek-V4.1 forward in batched torch, for training.

Written from /work/shared/SPEC.md and Appendix V (SPEC-V41.md, which wins):
the 40-layer schedule of config.json (train/config.py), mHC with the
vendor's carried pre (#1-#5), the Q path without a per-head norm (#6), SWA
keys (#7), RoPE tables with YaRN on compressed layers and fp32 angles (#8),
the CSA2 compressors (#9), the lightning indexer with k_norm (#11), the
candidate pool with the newest block pinned (#12), Top-K (ties to the lower
entry, #13), one softmax over Global u SWA u sink with K = V and the output
rotated back (#14), grouped output projection (#15), sqrtsoftplus MoE with
a selection-only bias (#16), Engram (#17, #18).

One call runs a whole batch of sequences densely (every position through
every layer, positions 0..T-1): the vendor's dense prefill, which CED with
a replay of at least T positions equals. Caches are exact floats here (no
FP8/FP4 store), the arithmetic is the dtype of the parameters.

The indexer is not trained through the hard Top-K: its inputs are detached
from the language model, and `forward(..., index_kl=True)` returns, per
index layer, KL(dense attention over the visible entries || softmax of the
index scores), the vendor's way (docs/training.md).
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from config import engram_primes

MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------- RoPE


def rope_freqs(theta, dim, yarn, cfg):
    i = np.arange(dim // 2, dtype=np.float64)
    freqs = 1.0 / theta ** (2.0 * i / dim)
    if yarn:
        def cd(rot):
            return dim * math.log(cfg.yarn_orig / (rot * 2 * math.pi)) / (2 * math.log(theta))
        low = max(math.floor(cd(cfg.beta_fast)), 0)
        high = min(math.ceil(cd(cfg.beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        smooth = 1.0 - np.clip((i - low) / (high - low), 0.0, 1.0)
        freqs = freqs / cfg.yarn_factor * (1.0 - smooth) + freqs * smooth
    return freqs.astype(np.float32)          # Appendix V #8: fp32 t * freq


def rope_table(freqs, pos, dtype):
    """cos, sin (..., dim/2) of the fp32 angles float32(pos) * freq, pos of any shape."""
    ang = torch.as_tensor(pos, dtype=torch.float32)[..., None] * torch.as_tensor(freqs)
    ang = ang.to(torch.float64)
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def rope(x, cs, rd, inverse=False, heads=False):
    """Rotate adjacent pairs of the last rd channels of x (..., P, w), or of
    x (..., P, heads, w) with heads=True; cs: (P, rd/2) tables."""
    c, s = cs
    if heads:
        c, s = c[..., None, :], s[..., None, :]
    if inverse:
        s = -s
    keep, r = x[..., :-rd], x[..., -rd:]
    x0, x1 = r[..., 0::2], r[..., 1::2]
    y = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)
    return torch.cat([keep, y], dim=-1)


def rms(x, w, eps):
    y = x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps)
    return y * w if w is not None else y


E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def mxfp4_qdq(x):
    """x through the Indexer-K cache format and back (Appendix V #11, #21):
    float32, rounded to bf16 (ties to even), then per block of 32 values an
    E8M0 scale s = 2^ceil(log2(max(amax / 6, 2^-126))) and each value the
    nearest E2M1 magnitude of |x| / s (ties to the even code). No gradient
    (it feeds the Top-K selection; training leaves it off)."""
    dt = x.dtype
    v = x.detach().float().to(torch.bfloat16).double()
    b = v.unflatten(-1, (v.shape[-1] // 32, 32))
    amax = b.abs().amax(-1, keepdim=True)
    s = torch.exp2(torch.ceil(torch.log2(torch.clamp(amax / 6.0, min=2.0 ** -126))))
    m = (b.abs() / s).clamp(max=6.0)
    grid = torch.tensor(E2M1_GRID, dtype=torch.float64)
    i = torch.clamp(torch.searchsorted(grid, m.contiguous()), 1, 7)
    lo, hi = grid[i - 1], grid[i]
    up = (m - lo > hi - m) | ((m - lo == hi - m) & (i % 2 == 0))
    q = torch.where(up, hi, lo)
    return (torch.sign(b) * q * s).flatten(-2).to(dt)


def stable_topk_mask(scores, cand, k):
    """(…, E) bool: the top min(k, #cand) of scores among cand, ties to the
    lower index (a stable descending sort keeps equal scores in index order)."""
    s = torch.where(cand, scores, torch.full_like(scores, -math.inf))
    order = torch.sort(s, dim=-1, descending=True, stable=True)[1][..., :k]
    n = torch.clamp(cand.sum(dim=-1, keepdim=True), max=k)
    take = torch.arange(order.shape[-1], device=scores.device) < n
    m = torch.zeros_like(cand)
    m.scatter_(-1, order, take)
    return m & cand


# ---------------------------------------------------------------- Engram hashing (R.8, Appendix V #18)


def engram_multipliers(layer, n, cv):
    hi = (np.iinfo(np.int64).max // int(cv)) // 2
    return np.random.default_rng(10007 * layer).integers(0, hi, size=n, dtype=np.int64) * 2 + 1


def engram_rows(cfg, primes, mult, layer, toks, cmap=None):
    """(B, T, orders*heads) int64 table rows of each position's n-grams.
    toks (B, T) int64 token ids; positions before 0 read the pad. cmap: the
    tokenizer's Engram token map (tokenizer.engram_map, what cedar builds
    from tokenizer.json); None: id mod compressed vocab (the oracle's)."""
    cv = cfg.engram_cv
    if cmap is None:
        t = np.asarray(toks, np.int64) % cv
        pad = cfg.engram_pad % cv
    else:
        t = np.asarray(cmap, np.int64)[np.asarray(toks, np.int64)]
        pad = int(cmap[cfg.engram_pad])
    B, T = t.shape
    out, off = [], 0
    with np.errstate(over='ignore'):
        for oi, n in enumerate(cfg.engram_orders):
            h = np.zeros((B, T), np.uint64)
            for k in range(n):
                sh = np.full((B, T), pad, np.int64)
                sh[:, k:] = t[:, :T - k]
                h ^= sh.astype(np.uint64) * np.uint64(mult[layer][k])
            for prime in primes[layer][oi]:
                out.append(np.mod(h.view(np.int64), np.int64(prime)) + off)
                off += prime
    return np.stack(out, axis=-1)


# ---------------------------------------------------------------- modules


def P(*shape):
    return nn.Parameter(torch.empty(*shape))


class MHC(nn.Module):
    """One sublayer's hyper-connection weights: fn ((2+hc)hc, hc d), scale (3), base."""

    def __init__(self, cfg):
        super().__init__()
        mm = (2 + cfg.hc) * cfg.hc
        self.fn, self.scale, self.base = P(mm, cfg.hc * cfg.d), P(3), P(mm)
        self.hc, self.eps, self.hc_eps, self.iters = cfg.hc, cfg.eps, cfg.hc_eps, cfg.hc_iters

    def coeffs(self, X):
        """X (…, hc, d) -> own pre (…, hc), post (…, hc), C (…, hc, hc)."""
        hc = self.hc
        xf = X.flatten(-2)
        mix = (xf @ self.fn.t()) * torch.rsqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + self.eps)
        own = torch.sigmoid(mix[..., :hc] * self.scale[0] + self.base[:hc]) + self.hc_eps
        post = 2.0 * torch.sigmoid(mix[..., hc:2 * hc] * self.scale[1] + self.base[hc:2 * hc])
        C = (mix[..., 2 * hc:] * self.scale[2] + self.base[2 * hc:]).unflatten(-1, (hc, hc))
        C = torch.softmax(C, dim=-1) + self.hc_eps
        C = C / (C.sum(dim=-2, keepdim=True) + self.hc_eps)
        for _ in range(self.iters - 1):
            C = C / (C.sum(dim=-1, keepdim=True) + self.hc_eps)
            C = C / (C.sum(dim=-2, keepdim=True) + self.hc_eps)
        return own, post, C


class MoE(nn.Module):
    def __init__(self, cfg, routed, active):
        super().__init__()
        d, I, R = cfg.d, cfg.inter, routed
        self.gate, self.bias = P(R, d), nn.Parameter(torch.zeros(2, R), requires_grad=False)
        self.w_gate, self.w_up, self.w_down = P(R, I, d), P(R, I, d), P(R, d, I)
        self.shared = cfg.n_shared > 0
        if self.shared:
            S = cfg.n_shared * cfg.inter
            self.s_gate, self.s_up, self.s_down = P(S, d), P(S, d), P(d, S)
        self.k, self.cfg = active, cfg
        self.load = None          # the last forward's per-expert selection count (bias update)

    def _ffn(self, g, u):
        lim = self.cfg.swiglu_limit
        if lim > 0:
            g, u = torch.clamp(g, max=lim), torch.clamp(u, -lim, lim)
        return F.silu(g) * u

    def forward(self, x):
        cfg = self.cfg
        logits = x @ self.gate.t()
        if cfg.score == 'sqrtsoftplus':
            s = torch.sqrt(F.softplus(logits))
        elif cfg.score == 'softmax':
            s = torch.softmax(logits, dim=-1)
        else:
            s = torch.sigmoid(logits)
        sel = stable_topk_mask(s + self.bias[0], torch.ones_like(s, dtype=torch.bool), self.k)
        ws = torch.where(sel, s, torch.zeros_like(s))
        if cfg.norm_topk:
            ws = ws / ws.sum(dim=-1, keepdim=True)
        ws = ws * cfg.route_scale
        self.load = sel.flatten(0, -2).sum(0).detach()
        # every expert on every row (widths are small), weighted by ws (0 off the selection)
        R, I, d = self.w_gate.shape
        g = (x @ self.w_gate.reshape(R * I, d).t()).unflatten(-1, (R, I))
        u = (x @ self.w_up.reshape(R * I, d).t()).unflatten(-1, (R, I))
        h = self._ffn(g, u) * ws[..., None]
        y = h.flatten(-2) @ self.w_down.permute(0, 2, 1).reshape(R * I, d)
        if self.shared:
            y = y + self._ffn(x @ self.s_gate.t(), x @ self.s_up.t()) @ self.s_down.t()
        return y


class Block(nn.Module):
    """Layer l's tensors, named as docs/weights.md names them under `layers.l.`."""

    def __init__(self, cfg, L, engram_rows_total):
        super().__init__()
        d, H, dh, qr = cfg.d, cfg.H, cfg.dh, cfg.q_rank
        self.L = L
        self.attn_norm, self.ffn_norm = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
        self.hc_attn, self.hc_ffn = MHC(cfg), MHC(cfg)
        a = nn.Module()
        a.wq_a, a.q_norm, a.wq_b = P(qr, d), nn.Parameter(torch.ones(qr)), P(H * dh, qr)
        a.wkv, a.kv_norm = P(dh, d), nn.Parameter(torch.ones(dh))
        a.wo_a, a.wo_b = P(cfg.G, cfg.o_rank, H * dh // cfg.G), P(d, cfg.G * cfg.o_rank)
        a.sink = nn.Parameter(torch.zeros(H))
        if L.mode in ('full', 'reindex'):
            a.indexer = nn.Module()
            a.indexer.wq_b, a.indexer.weights_proj = P(cfg.HI * cfg.dI, qr), P(cfg.HI, d)
            if L.mode == 'full':
                a.indexer.wk, a.indexer.k_norm = P(cfg.dI, dh), nn.Parameter(torch.ones(cfg.dI))
        if L.mode == 'full':
            a.compressor = nn.Module()
            a.compressor.wkv, a.compressor.norm = P(dh, d), nn.Parameter(torch.ones(dh))
            if L.ratio > 1:
                a.compressor.wgate = P(dh, d)
        self.attn = a
        self.ffn = MoE(cfg, cfg.n_routed, cfg.n_active)
        if L.engram:
            e = nn.Module()
            n_in = len(cfg.engram_orders) * cfg.engram_heads * cfg.engram_hd
            e.table = P(engram_rows_total, cfg.engram_hd)
            e.wkv, e.q_w, e.k_w = P((cfg.hc + 1) * d, n_in), P(cfg.hc, d), P(cfg.hc, d)
            self.engram = e


class Ctx:
    """What one batched forward shares between layers: each KV source's
    entries, each index layer's Top-K mask and the candidate pool."""

    def __init__(self, T):
        self.T, self.src, self.topk, self.pool, self.kl = T, {}, {}, {}, {}
        self.keep, self.scores = False, {}         # keep: record each index layer's scores (tests)


class V41(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.primes = engram_primes(cfg)
        self.mult = {l: engram_multipliers(l, max(cfg.engram_orders), cfg.engram_cv)
                     for l in cfg.engram_layers}
        rows = {l: sum(sum(h) for h in self.primes[l]) for l in cfg.engram_layers}
        self.embed, self.norm = P(cfg.vocab, cfg.d), nn.Parameter(torch.ones(cfg.d))
        self.lm_head = P(cfg.vocab, cfg.d)
        self.layers = nn.ModuleList([Block(cfg, L, rows.get(L.at, 0)) for L in cfg.layers])
        f = {'swa': (cfg.rope_theta, False), 'csa': (cfg.crope_theta, cfg.yarn_factor > 1)}
        self.freqs = {k: rope_freqs(th, cfg.rd, y, cfg) for k, (th, y) in f.items()}
        self.drafter = Drafter(cfg) if cfg.mtp_blocks > 0 else None
        self.store = self.store_exact
        self.cmap = None              # the Engram token map; None: id mod compressed vocab
        # the vendor's MXFP4 round trip of the indexer query (#11) and MXFP4
        # Indexer-K entries (#21); not trained with (selection only)
        self.q_mxfp4 = False

    @staticmethod
    def store_exact(x):
        """A cache store point (SWA, Main-KV, Indexer-K entries): exact here.
        The oracle's exact-float caches hold float32 values; a float64 test
        sets `store = V41.store_f32` to hold the same."""
        return x

    @staticmethod
    def store_f32(x):
        return x.float().to(x.dtype)

    # ------------------------------------------------------------ init
    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        cfg, depth = self.cfg, 2 * self.cfg.n_layers

        def normal(p, std):
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * std)

        for name, p in self.named_parameters():
            leaf = name.rsplit('.', 1)[-1]
            if p.dim() == 1 or leaf in ('bias',):
                continue                                  # norms 1, sinks and biases 0
            fan_in = p.shape[-1]
            std = fan_in ** -0.5
            if leaf in ('wo_b', 'w_down', 's_down'):
                std /= math.sqrt(depth)
            if leaf == 'fn':
                std = 0.02 * fan_in ** -0.5
            if leaf == 'embed' or leaf == 'table':
                std = 1.0
            if name.endswith('engram.wkv'):
                std = 0.1 * fan_in ** -0.5
            normal(p, std)
        hc = cfg.hc
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, MHC):
                    m.scale.fill_(1.0)
                    m.base.zero_()
                    m.base[2 * hc:].view(hc, hc).copy_(torch.eye(hc) * 4.0)   # C near the identity

    # ------------------------------------------------------------ parts
    def _sub(self, X, Pc, mhc, norm, f):
        own, post, C = mhc.coeffs(X)
        u = torch.sum(Pc[..., None] * X, dim=-2)                    # sum_i P_i X_i
        y = f(rms(u, norm, self.cfg.eps))
        # X'_j = post_j y + sum_i C[i][j] X_i (broadcast: tiny batched matmuls are slow on CPU)
        Xn = post[..., None] * y[..., None, :] + torch.sum(C[..., None] * X[..., :, None, :], dim=-3)
        return Xn, own

    def _engram(self, blk, X, rows):
        cfg, e = self.cfg, blk.engram
        ev = e.table[rows].flatten(-2)                               # (B, T, n_in)
        kv = ev @ e.wkv.t()
        d, hc = cfg.d, cfg.hc
        keys, val = kv[..., :hc * d].unflatten(-1, (hc, d)), kv[..., hc * d:]
        t = torch.sum(rms(X, None, cfg.eps) * e.q_w * rms(keys, None, cfg.eps) * e.k_w, dim=-1) / math.sqrt(d)
        gate = torch.sigmoid(torch.sign(t) * torch.sqrt(torch.clamp(torch.abs(t), min=1e-6)))
        return X + gate[..., None] * val[..., None, :]

    def _compress(self, blk, a, cs_c):
        """A KV source's entries over the whole sequence (every complete group)."""
        cfg, L, c = self.cfg, blk.L, blk.attn.compressor
        r, B, T = L.ratio, a.shape[0], a.shape[1]
        E = T // r
        v = (a[:, :E * r] @ c.wkv.t()).unflatten(1, (E, r))
        if r > 1:
            g = (a[:, :E * r] @ c.wgate.t()).unflatten(1, (E, r))
            chat = torch.sum(torch.softmax(g, dim=2) * v, dim=2)
        else:
            chat = v[:, :, 0]
        lat = rms(chat, c.norm, cfg.eps)
        epos = np.arange(E) * r
        ix = blk.attn.indexer
        kI = self.store(rope(rms(lat.detach() @ ix.wk.t(), ix.k_norm, cfg.eps), cs_c(epos), cfg.rd))
        if self.q_mxfp4:                    # the Indexer-K cache format the query's round trip is read in
            kI = mxfp4_qdq(kI)
        G = self.store(rope(lat, cs_c(epos), cfg.rd))
        vis = torch.as_tensor(r * np.arange(E)[None, :] + r - 1 <= np.arange(T)[:, None])
        return {'G': G, 'kI': kI, 'vis': vis}

    def _pool(self, scores, vis):
        cfg = self.cfg
        Bk = cfg.cand_block
        E = scores.shape[-1]
        nb = -(-E // Bk)
        pad = nb * Bk - E
        S = torch.where(vis, scores, torch.full_like(scores, -math.inf))
        S = F.pad(S, (0, pad), value=-math.inf)
        Vb = F.pad(vis, (0, pad)).expand(S.shape)
        bs = S.unflatten(-1, (nb, Bk)).amax(-1)
        bvis = Vb.unflatten(-1, (nb, Bk)).any(-1)
        nv = vis.sum(-1)                                          # (T,)
        pin = torch.zeros(bvis.shape[-2:], dtype=torch.bool)
        rows = torch.nonzero(nv > 0)[:, 0]
        pin[rows, (nv[rows] - 1) // Bk] = True                    # Appendix V #12
        bs = torch.where(pin, torch.full_like(bs, math.inf), bs)
        bm = stable_topk_mask(bs, bvis, cfg.cand_top_blocks)
        return vis & bm.repeat_interleave(Bk, dim=-1)[..., :E]

    def _attention(self, blk, a, ctx, index_kl):
        cfg, L, at = self.cfg, blk.L, blk.attn
        B, T = a.shape[0], a.shape[1]
        pos = np.arange(T)
        kind = 'swa' if L.mode == 'swa_only' else 'csa'
        cs = rope_table(self.freqs[kind], pos, a.dtype)

        def cs_c(p):
            return rope_table(self.freqs[kind], p, a.dtype)

        cq = rms(a @ at.wq_a.t(), at.q_norm, cfg.eps)
        q = rope((cq @ at.wq_b.t()).unflatten(-1, (cfg.H, cfg.dh)), cs, cfg.rd, heads=True)
        kS = self.store(rope(rms(a @ at.wkv.t(), at.kv_norm, cfg.eps), cs, cfg.rd))
        qs = q * cfg.scale
        zs = torch.einsum('bthk,bsk->bths', qs, kS)
        p_, s_ = torch.as_tensor(pos)[:, None], torch.as_tensor(pos)[None, :]
        smask = (s_ <= p_) & (s_ >= p_ - cfg.window + 1)
        zs = zs.masked_fill(~smask[None, :, None, :], -math.inf)
        parts, vals = [zs], [kS]
        if L.mode != 'swa_only':
            if L.mode == 'full':
                ctx.src[L.at] = self._compress(blk, a, cs_c)
            S = ctx.src[L.kv]
            G, vis = S['G'], S['vis']
            if G.shape[1] > 0:
                if L.mode in ('full', 'reindex'):
                    ix = at.indexer
                    qI = rope((cq.detach() @ ix.wq_b.t()).unflatten(-1, (cfg.HI, cfg.dI)), cs, cfg.rd, heads=True)
                    if self.q_mxfp4:
                        qI = mxfp4_qdq(qI)
                    wI = (a.detach() @ ix.weights_proj.t()) * (cfg.HI * cfg.dI) ** -0.5
                    dots = torch.relu(torch.einsum('bthk,bek->bthe', qI, S['kI']))
                    scores = torch.einsum('bth,bthe->bte', wI, dots)
                    if ctx.keep:
                        ctx.scores[L.at] = scores
                    if L.candidates == 'build':
                        ctx.pool[L.at] = self._pool(scores.detach(), vis)
                    cand = ctx.pool[L.pool] if L.candidates == 'read' else vis.expand(scores.shape)
                    sel = stable_topk_mask(scores.detach(), cand, cfg.topk)
                    ctx.topk[L.at] = sel
                    if index_kl:
                        ctx.kl[L.at] = self._index_kl(qs.detach(), G.detach(), vis, scores)
                else:
                    sel = ctx.topk[L.topk]
                zg = torch.einsum('bthk,bek->bthe', qs, G).masked_fill(~sel[:, :, None, :], -math.inf)
                parts.append(zg)
                vals.append(G)
        parts.append(at.sink.to(a.dtype).view(1, 1, cfg.H, 1).expand(B, T, cfg.H, 1))
        p = torch.softmax(torch.cat(parts, dim=-1), dim=-1)
        o, k0 = 0, 0
        for v in vals:
            n = v.shape[1]
            o = o + torch.einsum('bthe,bek->bthk', p[..., k0:k0 + n], v)
            k0 += n
        o = rope(o, cs, cfg.rd, inverse=True, heads=True)
        og = o.flatten(-2).unflatten(-1, (cfg.G, cfg.H * cfg.dh // cfg.G))
        z = torch.einsum('btgk,gok->btgo', og, at.wo_a).flatten(-2)
        return z @ at.wo_b.t()

    @staticmethod
    def _index_kl(qs, G, vis, scores):
        """KL(dense attention over the visible entries, summed over heads and
        renormalised || softmax of the index scores), mean over rows that see
        an entry. Only the indexer's tensors receive its gradient."""
        z = torch.einsum('bthk,bek->bthe', qs, G).masked_fill(~vis[None, :, None, :], -math.inf)
        has = vis.any(-1)                                          # (T,)
        z = torch.where(has[None, :, None, None], z, torch.zeros_like(z))
        tgt = torch.softmax(z, dim=-1).mean(dim=2)                 # (B, T, E)
        ls = torch.log_softmax(torch.where(vis, scores, torch.full_like(scores, -math.inf)), dim=-1)
        term = torch.where(vis & (tgt > 0), tgt * (torch.log(tgt) - ls), torch.zeros_like(tgt))
        return term.sum(-1)[:, has].mean()

    # ------------------------------------------------------------ forward
    def forward(self, toks, rows, index_kl=False, hidden=False, keep=False):
        """toks (B, T) int64 tensor; rows {engram layer: (B, T, n) int64 tensor}.
        Returns logits (B, T, V) and the context (ctx.kl per index layer)."""
        cfg = self.cfg
        B, T = toks.shape
        ctx = Ctx(T)
        ctx.keep = keep
        X = self.embed[toks][:, :, None, :].expand(B, T, cfg.hc, cfg.d)
        Pc = torch.zeros(B, T, cfg.hc, dtype=X.dtype)
        Pc[..., 0] = 1.0                                       # Appendix V #2: one-hot start
        ctx.states = {}
        for blk in self.layers:
            if blk.L.engram:
                X = self._engram(blk, X, rows[blk.L.at])
            if hidden:                                         # the state entering the layer, after Engram
                ctx.states[blk.L.at] = X
            X, Pc = self._sub(X, Pc, blk.hc_attn, blk.attn_norm,
                              lambda a, blk=blk: self._attention(blk, a, ctx, index_kl))
            X, Pc = self._sub(X, Pc, blk.hc_ffn, blk.ffn_norm, blk.ffn)
        h = torch.sum(Pc[..., None] * X, dim=-2)                   # #4: the last FFN's pre
        return rms(h, self.norm, cfg.eps) @ self.lm_head.t(), ctx

    def engram_rows(self, toks):
        t = toks.numpy() if torch.is_tensor(toks) else np.asarray(toks)
        return {l: torch.as_tensor(engram_rows(self.cfg, self.primes, self.mult, l, t, self.cmap))
                for l in self.cfg.engram_layers}


class Drafter(nn.Module):
    """The DSpark drafter's tensors (Appendix V #24; docs/weights.md `mtp.{k}.`):
    window-only blocks with their own MoE, main_proj / main_norm on block 0,
    norm and the Markov and confidence heads on the last block. Its forward
    is not part of training yet (docs/training.md): the tensors are
    initialised so that the checkpoint is complete."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg.d
        self.cfg = cfg
        from config import Layer
        self.blocks = nn.ModuleList()
        for k in range(cfg.mtp_blocks):
            b = Block(cfg, Layer(-1, 'swa_only', 0, 'mtp'), 0)
            b.ffn = MoE(cfg, cfg.ds_routed, cfg.ds_active)
            self.blocks.append(b)
        self.main_proj = P(d, len(cfg.ds_targets) * d)
        self.main_norm, self.out_norm = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
        self.markov_embed, self.markov_head = P(cfg.vocab, cfg.ds_rank), P(cfg.vocab, cfg.ds_rank)
        self.confidence = P(1, d + cfg.ds_rank)

    def _attention(self, model, blk, a, main, mvalid, mpos, dpos):
        """A draft block's attention: keys = the main rows' and the draft rows'
        (its own wkv / kv_norm, RoPE model.rope.swa at their positions), every
        draft row sees every valid key (no mask within the block), the sink."""
        cfg, at = self.cfg, blk.attn
        G, Bd = a.shape[0], a.shape[1]
        cd = rope_table(model.freqs['swa'], dpos, a.dtype)
        cq = rms(a @ at.wq_a.t(), at.q_norm, cfg.eps)
        q = rope((cq @ at.wq_b.t()).unflatten(-1, (cfg.H, cfg.dh)), cd, cfg.rd, heads=True)
        kd = rope(rms(a @ at.wkv.t(), at.kv_norm, cfg.eps), cd, cfg.rd)
        km = rope(rms(main @ at.wkv.t(), at.kv_norm, cfg.eps), rope_table(model.freqs['swa'], mpos, a.dtype), cfg.rd)
        keys = model.store(torch.cat([km, kd], dim=1))                  # (G, n + Bd, dh)
        valid = torch.cat([mvalid, torch.ones(G, Bd, dtype=torch.bool)], dim=1)
        z = torch.einsum('gbhk,gek->gbhe', q * cfg.scale, keys).masked_fill(~valid[:, None, None, :], -math.inf)
        z = torch.cat([z, at.sink.to(a.dtype).view(1, 1, cfg.H, 1).expand(G, Bd, cfg.H, 1)], dim=-1)
        p = torch.softmax(z, dim=-1)[..., :-1]
        o = rope(torch.einsum('gbhe,gek->gbhk', p, keys), cd, cfg.rd, inverse=True, heads=True)
        og = o.flatten(-2).unflatten(-1, (cfg.G, cfg.H * cfg.dh // cfg.G))
        return torch.einsum('xbgk,gok->xbgo', og, at.wo_a).flatten(-2) @ at.wo_b.t()

    def forward(self, model, rows, mvalid, mpos, y0, P, prev=None):
        """G draft blocks at once (Appendix V #24). rows (G, n, targets, d):
        the mean over the streams of the state entering each target layer at
        the main positions mpos (G, n) (mvalid: which exist); y0 (G,) the
        token at position P (G,). Draft ids [y0, noise x (B - 1)] at P .. P +
        B - 1. prev (G, B): the Markov inputs d_i (teacher forcing: y0 then the
        true tokens); None: greedy, d_{i+1} = argmax logits_i. Returns
        logits (G, B, V), confidence (G, B), the collapsed rows (G, B, d)."""
        cfg = self.cfg
        G, Bd = y0.shape[0], cfg.ds_draft
        main = rms(rows.flatten(-2) @ self.main_proj.t(), self.main_norm, cfg.eps)
        dpos = P[:, None] + torch.arange(Bd)[None, :]
        ids = torch.full((G, Bd), cfg.ds_noise, dtype=torch.int64)
        ids[:, 0] = y0
        X = model.embed[ids][:, :, None, :].expand(G, Bd, cfg.hc, cfg.d)
        Pc = torch.zeros(G, Bd, cfg.hc, dtype=X.dtype)
        Pc[..., 0] = 1.0
        for blk in self.blocks:
            X, Pc = model._sub(X, Pc, blk.hc_attn, blk.attn_norm,
                               lambda a, blk=blk: self._attention(model, blk, a, main, mvalid, mpos, dpos))
            X, Pc = model._sub(X, Pc, blk.hc_ffn, blk.ffn_norm, blk.ffn)
        h = torch.sum(Pc[..., None] * X, dim=-2)
        base = rms(h, self.out_norm, cfg.eps) @ model.lm_head.t()
        if prev is not None:
            E = self.markov_embed[prev]                                    # (G, B, rank)
            logits = base + E @ self.markov_head.t()
            conf = torch.cat([h, E], dim=-1) @ self.confidence[0]
            return logits, conf, h
        out, conf, d = [], [], y0
        for i in range(Bd):
            E = self.markov_embed[d]
            lg = base[:, i] + E @ self.markov_head.t()
            conf.append(torch.cat([h[:, i], E], dim=-1) @ self.confidence[0])
            out.append(lg)
            d = lg.argmax(-1)
        return torch.stack(out, 1), torch.stack(conf, 1), h


def cedar_names(model):
    """{docs/weights.md name: parameter} of the model (and its drafter)."""
    out = {}
    ren = {'ffn.w_gate': 'ffn.experts.w_gate', 'ffn.w_up': 'ffn.experts.w_up',
           'ffn.w_down': 'ffn.experts.w_down', 'ffn.s_gate': 'ffn.shared.w_gate',
           'ffn.s_up': 'ffn.shared.w_up', 'ffn.s_down': 'ffn.shared.w_down'}
    for name, p in model.named_parameters():
        if name.startswith('drafter.'):
            continue
        for a, b in ren.items():
            if name.endswith('.' + a):
                name = name[:-len(a)] + b
        out[name] = p
    dr = getattr(model, 'drafter', None)
    if dr is not None:
        nb = len(dr.blocks)
        for k, blk in enumerate(dr.blocks):
            for name, p in blk.named_parameters():
                for a, b in ren.items():
                    if name.endswith(a) and name.startswith('ffn.'):
                        name = b
                out['mtp.%d.%s' % (k, name)] = p
        last = 'mtp.%d.' % (nb - 1)
        out.update({'mtp.0.main_proj': dr.main_proj, 'mtp.0.main_norm': dr.main_norm,
                    last + 'norm': dr.out_norm, last + 'markov_head.embed': dr.markov_embed,
                    last + 'markov_head.head': dr.markov_head,
                    last + 'confidence_head.proj': dr.confidence})
    return out
