"""config.py: the model's shape from a released-layout config.json.

The training program reads the same config.json cedar imports
(`cedar plan import DIR/config.json`, docs/checkpoints.md), and derives the
layer table by the rules written there (not by reading cedar's C):
  ratio 0 -> swa_only; in kv_source_layer_ids -> full; in
  index_source_layer_ids only -> reindex; else reuse. The decoder region
  starts at the first ratio-1 layer. A layer's KV source is the latest full
  layer at or before it in its region; its Top-K source the latest full or
  reindex layer before it reading that source; a reindex layer's pool the
  candidate source (the latest `build` layer before it, same ratio).
"""
import json
import math


class Layer:
    def __init__(self, at, mode, ratio, region):
        self.at, self.mode, self.ratio, self.region = at, mode, ratio, region
        self.kv = self.topk = self.pool = None
        self.candidates = None      # 'build' | 'read' | None
        self.engram = False

    def __repr__(self):
        return 'L%d %s r%d %s kv=%s topk=%s pool=%s%s' % (
            self.at, self.mode, self.ratio, self.region, self.kv, self.topk, self.pool,
            ' engram' if self.engram else '')


class Config:
    """Every width and the layer table, from config.json's text_config."""

    def __init__(self, path_or_dict):
        if isinstance(path_or_dict, dict):
            root = path_or_dict
        else:
            with open(path_or_dict) as f:
                root = json.load(f)
        c = root.get('text_config', root)
        self.raw = root
        self.vocab = int(c['vocab_size'])
        self.d = int(c['hidden_size'])
        self.n_layers = int(c['num_hidden_layers'])
        self.H = int(c['num_attention_heads'])
        self.dh = int(c['head_dim'])
        self.rd = int(c['qk_rope_head_dim'])
        self.q_rank = int(c['q_lora_rank'])
        self.o_rank = int(c['o_lora_rank'])
        self.G = int(c['o_groups'])
        self.eps = float(c['rms_norm_eps'])
        self.swiglu_limit = float(c.get('swiglu_limit') or 0)
        self.rope_theta = float(c['rope_theta'])
        self.crope_theta = float(c['compress_rope_theta'])
        rs = c.get('rope_scaling') or {}
        self.yarn_factor = float(rs.get('factor', 1))
        self.beta_fast = float(rs.get('beta_fast', 32))
        self.beta_slow = float(rs.get('beta_slow', 1))
        self.yarn_orig = int(rs.get('original_max_position_embeddings', 65536))
        self.n_routed = int(c['n_routed_experts'])
        self.n_shared = int(c['n_shared_experts'])
        self.n_active = int(c['num_experts_per_tok'])
        self.inter = int(c['moe_intermediate_size'])
        self.score = c['scoring_func']
        self.norm_topk = bool(c.get('norm_topk_prob', True))
        self.route_scale = float(c['routed_scaling_factor'])
        self.window = int(c['sliding_window'])
        self.HI = int(c['index_n_heads'])
        self.dI = int(c['index_head_dim'])
        self.topk = int(c['index_topk'])
        self.cand_block = int(c.get('candidate_block_size') or 0)
        self.cand_top_blocks = int(c.get('candidate_topk_blocks') or 0)
        self.hc = int(c['hc_mult'])
        self.hc_iters = int(c['hc_sinkhorn_iters'])
        self.hc_eps = float(c['hc_eps'])
        self.engram_layers = [int(x) for x in c.get('engram_layer_ids') or []]
        self.engram_orders = list(range(2, int(c.get('engram_max_ngram_size', 2)) + 1))
        self.engram_heads = int(c.get('engram_n_heads', 0))
        self.engram_hd = int(c.get('engram_head_dim', 0))
        self.engram_base = int(c.get('engram_vocab_size', 0))
        self.engram_pad = int(c.get('engram_pad_token_id', 2))
        self.engram_cv = int(c.get('engram_compressed_vocab_size', self.vocab))
        self.mtp_blocks = int(c.get('num_nextn_predict_layers', 0))
        self.ds_draft = int(c.get('dspark_block_size', 5))
        self.ds_noise = int(c.get('dspark_noise_token_id', 0))
        self.ds_targets = [int(x) for x in c.get('dspark_target_layer_ids') or []]
        self.ds_rank = int(c.get('dspark_markov_rank', 0))
        self.ds_routed = int(c.get('dspark_n_routed_experts', 0))
        self.ds_active = int(c.get('dspark_num_experts_per_tok', 0))
        self.scale = 1.0 / math.sqrt(self.dh)
        self._layers(c)

    def _layers(self, c):
        ratios = [int(r) for r in c['compress_ratios']][:self.n_layers]
        kvs = set(int(x) for x in c['kv_source_layer_ids'])
        idx = set(int(x) for x in c['index_source_layer_ids'])
        cand = c.get('candidate_source_layer_id')
        cand = -1 if cand is None else int(cand)
        first_dec = next((i for i, r in enumerate(ratios) if r == 1), None)
        self.layers = []
        for l, r in enumerate(ratios):
            region = 'decoder' if first_dec is not None and l >= first_dec else 'encoder'
            mode = 'swa_only' if r == 0 else 'full' if l in kvs else 'reindex' if l in idx else 'reuse'
            self.layers.append(Layer(l, mode, r, region))
        self.ced = first_dec is not None
        for L in self.layers:
            if L.mode == 'swa_only':
                continue
            L.kv = max(M.at for M in self.layers[:L.at + 1] if M.mode == 'full' and M.region == L.region)
            if L.mode == 'reuse':
                L.topk = max(M.at for M in self.layers[:L.at]
                             if M.mode in ('full', 'reindex') and M.kv == L.kv)
            if L.at == cand:
                L.candidates = 'build'
            elif L.mode == 'reindex' and 0 <= cand < L.at and self.layers[cand].ratio == L.ratio:
                L.candidates, L.pool = 'read', cand
        for l in self.engram_layers:
            self.layers[l].engram = True
        self.encoder = [L.at for L in self.layers if L.region == 'encoder']
        self.decoder = [L.at for L in self.layers if L.region == 'decoder']


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


def engram_primes(cfg):
    """{layer: [[prime per head] per order]}: one increasing run of primes above
    engram_vocab_size - 1, over layers, then orders, then heads (SPEC R.8)."""
    cur, out = cfg.engram_base - 1, {}
    for l in cfg.engram_layers:
        per = []
        for _ in cfg.engram_orders:
            hp = []
            for _ in range(cfg.engram_heads):
                cur += 1
                while not is_prime(cur):
                    cur += 1
                hp.append(cur)
            per.append(hp)
        out[l] = per
    return out
