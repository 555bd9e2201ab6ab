"""Plan reader for the oracle, written from docs/plans.md only.

Contains a small, strict reader for the YAML subset the plans use (block
mappings, block lists, flow mappings and lists, plain and quoted scalars,
comments; no anchors, aliases, tags, multi-line scalars or multiple
documents), `extends:` merging, `layer_overrides`, and the derived ownership
rule (kv, topk, pool) of docs/plans.md.  It checks only what the oracle needs
to run; `cedar plan check` is the validator.
"""
import os
import re


class PlanError(Exception):
    pass


# ---------------------------------------------------------------- YAML subset

_INT = re.compile(r'^[-+]?[0-9]+$')
_FLOAT = re.compile(r'^[-+]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][-+]?[0-9]+)?$')


def _scalar(tok, where):
    t = tok.strip()
    if t == '':
        return None
    if t[0] in '"\'':
        q = t[0]
        if len(t) < 2 or t[-1] != q:
            raise PlanError('%s: unterminated quoted scalar %s' % (where, t))
        body = t[1:-1]
        if q == "'":
            return body.replace("''", "'")
        return body.encode('latin-1', 'backslashreplace').decode('unicode_escape')
    if t[0] in '&*!|>%@`':
        raise PlanError('%s: unsupported YAML construct %r (anchors, aliases, tags, '
                        'block scalars are not read by the oracle)' % (where, t))
    if t in ('true', 'True', 'TRUE'):
        return True
    if t in ('false', 'False', 'FALSE'):
        return False
    if t in ('null', 'Null', 'NULL', '~'):
        return None
    if _INT.match(t):
        return int(t)
    if _FLOAT.match(t) and ('.' in t or 'e' in t or 'E' in t):
        return float(t)
    return t


def _strip_comment(line):
    out, q = [], None
    for i, ch in enumerate(line):
        if q:
            if ch == q:
                q = None
        elif ch in '"\'' and (i == 0 or line[i - 1] in ' \t[{,:'):
            q = ch
        elif ch == '#' and (i == 0 or line[i - 1] in ' \t'):
            break
        out.append(ch)
    return ''.join(out).rstrip()


class _Flow:
    def __init__(self, text, where):
        self.s, self.i, self.where = text, 0, where

    def err(self, msg):
        raise PlanError('%s: %s in flow collection %r' % (self.where, msg, self.s))

    def ws(self):
        while self.i < len(self.s) and self.s[self.i] in ' \t':
            self.i += 1

    def value(self):
        self.ws()
        if self.i >= len(self.s):
            self.err('unexpected end')
        c = self.s[self.i]
        if c == '{':
            return self.mapping()
        if c == '[':
            return self.seq()
        return self.plain(',]}')

    def plain(self, stops):
        self.ws()
        j = self.i
        if j < len(self.s) and self.s[j] in '"\'':
            q = self.s[j]
            k = self.s.find(q, j + 1)
            if k < 0:
                self.err('unterminated string')
            self.i = k + 1
            return _scalar(self.s[j:k + 1], self.where)
        while self.i < len(self.s) and self.s[self.i] not in stops:
            if self.s[self.i] == ':' and ':' in stops and (
                    self.i + 1 >= len(self.s) or self.s[self.i + 1] in ' \t'):
                break
            self.i += 1
        return _scalar(self.s[j:self.i], self.where)

    def expect(self, ch):
        self.ws()
        if self.i >= len(self.s) or self.s[self.i] != ch:
            self.err('expected %r' % ch)
        self.i += 1

    def mapping(self):
        self.expect('{')
        out = {}
        self.ws()
        if self.s[self.i:self.i + 1] == '}':
            self.i += 1
            return out
        while True:
            k = self.plain(':,}')
            self.expect(':')
            v = self.value()
            if k in out:
                self.err('duplicate key %r' % k)
            out[k] = v
            self.ws()
            if self.s[self.i:self.i + 1] == ',':
                self.i += 1
                continue
            self.expect('}')
            return out

    def seq(self):
        self.expect('[')
        out = []
        self.ws()
        if self.s[self.i:self.i + 1] == ']':
            self.i += 1
            return out
        while True:
            out.append(self.value())
            self.ws()
            if self.s[self.i:self.i + 1] == ',':
                self.i += 1
                continue
            self.expect(']')
            return out


def _inline(text, where):
    t = text.strip()
    if t[:1] in '{[':
        f = _Flow(t, where)
        v = f.value()
        f.ws()
        if f.i != len(t):
            raise PlanError('%s: trailing text after flow collection' % where)
        return v
    return _scalar(t, where)


def _split_key(content, where):
    """'key: rest' -> (key, rest) or None when content is not a mapping entry."""
    if content[:1] in '"\'':
        q = content[0]
        k = content.find(q, 1)
        if k > 0 and content[k + 1:k + 2] == ':' and content[k + 2:k + 3] in ('', ' '):
            return content[1:k], content[k + 2:].strip()
        return None
    if content[:1] in '{[':
        return None
    m = re.match(r'^([^:#{}\[\],]+?):(\s+|$)(.*)$', content)
    if not m:
        return None
    return m.group(1).strip(), m.group(3)


def parse_yaml(text, filename='<yaml>'):
    lines = []
    for n, raw in enumerate(text.split('\n'), 1):
        if '\t' in raw[:len(raw) - len(raw.lstrip())]:
            raise PlanError('%s:%d: tab in indentation' % (filename, n))
        s = _strip_comment(raw)
        if s.strip() == '':
            continue
        if s.strip() in ('---', '...'):
            if lines:
                raise PlanError('%s:%d: only one YAML document is allowed' % (filename, n))
            continue
        ind = len(s) - len(s.lstrip(' '))
        lines.append((ind, s.strip(), n))
    if not lines:
        return {}
    pos = [0]

    def where(n):
        return '%s:%d' % (filename, n)

    def block(ind):
        i0, content, n = lines[pos[0]]
        if content.startswith('- ') or content == '-':
            return seq(ind)
        if _split_key(content, where(n)) is not None:
            return mapping(ind)
        if len(lines) == 1 or pos[0] == len(lines) - 1:
            pos[0] += 1
            return _inline(content, where(n))
        raise PlanError('%s: expected a mapping or a list' % where(n))

    def mapping(ind, first=None):
        out = {}
        while pos[0] < len(lines):
            i, content, n = lines[pos[0]]
            if first is not None:
                i, content, first = ind, first, None
            elif i < ind:
                break
            elif i > ind:
                raise PlanError('%s: bad indentation' % where(n))
            kv = _split_key(content, where(n))
            if kv is None:
                raise PlanError('%s: expected `key: value`' % where(n))
            k, rest = kv
            if k in out:
                raise PlanError('%s: duplicate key %r' % (where(n), k))
            pos[0] += 1
            if rest == '':
                if pos[0] < len(lines) and (lines[pos[0]][0] > ind or (
                        lines[pos[0]][0] == ind and lines[pos[0]][1].startswith('-'))):
                    out[k] = block(lines[pos[0]][0])
                else:
                    out[k] = None
            else:
                out[k] = _inline(rest, where(n))
        return out

    def seq(ind):
        out = []
        while pos[0] < len(lines):
            i, content, n = lines[pos[0]]
            if i < ind or not (content.startswith('- ') or content == '-'):
                if i > ind:
                    raise PlanError('%s: bad indentation' % where(n))
                break
            if i > ind:
                raise PlanError('%s: bad indentation' % where(n))
            item = content[1:].strip()
            if item == '':
                pos[0] += 1
                out.append(block(lines[pos[0]][0]) if pos[0] < len(lines) and lines[pos[0]][0] > ind
                           else None)
            elif _split_key(item, where(n)) is not None:
                # "- key: v" starts a block mapping whose keys sit at the item's column
                col = ind + (len(content) - len(item))
                out.append(mapping(col, first=item))
            else:
                pos[0] += 1
                out.append(_inline(item, where(n)))
        return out

    v = block(lines[0][0])
    if pos[0] != len(lines):
        raise PlanError('%s: unexpected content' % where(lines[pos[0]][2]))
    return v


def load_yaml(path):
    with open(path, encoding='utf-8') as f:
        return parse_yaml(f.read(), path)


# ---------------------------------------------------------------- defaults (docs/plans.md)

DEFAULTS = {
    'model': {
        'n_layers': 40, 'hidden': 5120, 'vocab': 129280, 'norm_eps': 1e-20,
        'attention': {'heads': 64, 'head_dim': 512, 'rope_dim': 64, 'q_rank': 1280,
                      'q_head_norm': False, 'o_groups': 8, 'o_rank': 1024,
                      'softmax_scale': 0.0, 'sink': True},
        'rope': {'swa': {'theta': 10000.0, 'yarn': False},
                 'csa': {'theta': 160000.0, 'yarn': True}},
        'indexer': {'heads': 32, 'head_dim': 128, 'rope_dim': 64, 'rope_position': 'last',
                    'k_norm': True, 'q_mxfp4': True, 'topk': 512, 'key_slot': 'vendor'},
        'swa': {'window': 128},
        'candidates': {'block': 8, 'top_blocks': 2048, 'pin_newest': True},
        'moe': {'routed_experts': 384, 'shared_experts': 1, 'active_experts': 6,
                'inter_dim': 2304, 'shared_inter_dim': 2304, 'score': 'sqrtsoftplus',
                'norm_topk': True, 'route_scale': 1.5, 'swiglu_limit': 10.0},
        'mhc': {'streams': 4, 'sinkhorn_iters': 20, 'eps': 1e-6, 'pairing': 'v41',
                'merge': 'carried'},
        'engram': {'orders': [2, 3, 4], 'heads': 8, 'head_dim': 256, 'table_base': 16000000,
                   'compressed_vocab': 99092, 'pad_id': 2, 'multipliers': 'numpy', 'seed': 0},
        # Appendix V #22: bf16 activations, MXFP8 inputs of the FP8 linears
        'numerics': {'activations': 'bf16', 'sublayer_io': 'bf16', 'linear_inputs': 'mxfp8'},
    },
    'formats': {
        # Appendix V #21 (docs/formats.md): rules 'auto' and floors None are
        # the vendor's, resolved in formats.resolve
        'main_kv': {'element': 'e2m1', 'scale': 'e4m3', 'block': 16, 'scale_rule': 'auto',
                    'scale_floor': None, 'bf16_round': True},
        'indexer_k': {'element': 'e2m1', 'scale': 'e8m0', 'block': 32, 'scale_rule': 'auto',
                      'scale_floor': None, 'bf16_round': True},
        'swa': {'element': 'e4m3', 'scale': 'e8m0', 'block': 32, 'scale_rule': 'auto',
                'scale_floor': None, 'bf16_round': True},
        'nibble': 'low_first',
    },
    'serving': {'ced': True, 'replay': {'encoder': 'window', 'decoder': 'window'},
                'prefill_chunk': 512},
}
ROPE_DEFAULTS = {'yarn_factor': 16.0, 'yarn_original_len': 65536, 'yarn_beta_fast': 32.0,
                 'yarn_beta_slow': 1.0, 'yarn_mscale': False,
                 'angle': 'f32'}

LAYER_KEYS = ('at', 'region', 'mode', 'ratio', 'kv', 'topk', 'candidates', 'pool', 'engram')
MODES = ('swa_only', 'full', 'reindex', 'reuse')


def merge(base, over):
    """docs/plans.md: mappings merge key by key, scalars and lists replace."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    return over


def _load_raw(path, depth=0, seen=()):
    path = os.path.abspath(path)
    if depth > 16:
        raise PlanError('%s: extends chain deeper than 16' % path)
    if path in seen:
        raise PlanError('%s: extends cycle' % path)
    raw = load_yaml(path)
    if not isinstance(raw, dict):
        raise PlanError('%s: the top level must be a mapping' % path)
    raw = dict(raw)
    own_name = raw.get('name')
    ext = raw.pop('extends', None)
    if ext is not None:
        base = _load_raw(os.path.join(os.path.dirname(path), ext), depth + 1, seen + (path,))
        ov = list(base.get('layer_overrides') or []) + list(raw.pop('layer_overrides', None) or [])
        merged = merge({k: v for k, v in base.items() if k != 'layers'}, raw)
        if 'layers' not in raw and 'layers' in base:
            merged['layers'] = base['layers']
        merged['layer_overrides'] = ov
        raw = merged
    raw['name'] = own_name if own_name is not None else os.path.splitext(os.path.basename(path))[0]
    return raw


def expand_at(at):
    if isinstance(at, bool):
        raise PlanError('bad `at`: %r' % (at,))
    if isinstance(at, int):
        return [at]
    if isinstance(at, str):
        m = re.match(r'^\s*(\d+)\s*-\s*(\d+)\s*$', at)
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            if b < a:
                raise PlanError('`at` range %r runs backwards' % at)
            return list(range(a, b + 1))
        if re.match(r'^\s*\d+\s*$', at):
            return [int(at)]
    if isinstance(at, list):
        out = []
        for a in at:
            out += expand_at(a)
        return out
    raise PlanError('bad `at`: %r' % (at,))


class Plan:
    """A resolved plan: .model, .formats, .serving (dicts with defaults filled
    in) and .layers (one dict per layer with derived kv/topk/pool)."""

    def __init__(self, path):
        self.path = path
        raw = _load_raw(path)
        self.raw = raw
        self.name = raw['name']
        self.model = merge(DEFAULTS['model'], raw.get('model') or {})
        for k in ('swa', 'csa'):
            self.model['rope'][k] = merge(ROPE_DEFAULTS, self.model['rope'][k])
        self.formats = merge(DEFAULTS['formats'], raw.get('formats') or {})
        self.serving = merge(DEFAULTS['serving'], raw.get('serving') or {})
        self.layers = self._build_layers(raw.get('layers'), raw.get('layer_overrides') or [])

    # ------------------------------------------------------------ layers
    def _build_layers(self, table, overrides):
        n = int(self.model['n_layers'])
        if not table:
            raise PlanError('%s: no `layers` table' % self.path)
        L = [None] * n
        last = -1
        for e in table:
            if not isinstance(e, dict) or 'at' not in e:
                raise PlanError('layer entry without `at`: %r' % (e,))
            for k in e:
                if k not in LAYER_KEYS:
                    raise PlanError('unknown layer key %r' % k)
            for l in expand_at(e['at']):
                if l >= n or l < 0:
                    raise PlanError('layer %d out of range (n_layers %d)' % (l, n))
                if L[l] is not None:
                    raise PlanError('layer %d defined twice' % l)
                if l <= last:
                    raise PlanError('layer %d out of order' % l)
                last = l
                d = {k: v for k, v in e.items() if k != 'at'}
                d['at'] = l
                L[l] = d
        missing = [i for i, d in enumerate(L) if d is None]
        if missing:
            raise PlanError('layers %s are not defined' % missing)
        for e in overrides:
            for k in e:
                if k not in LAYER_KEYS:
                    raise PlanError('unknown layer key %r in layer_overrides' % k)
            for l in expand_at(e['at']):
                if not 0 <= l < n:
                    raise PlanError('override of layer %d out of range' % l)
                L[l].update({k: v for k, v in e.items() if k != 'at'})
        for d in L:
            d.setdefault('candidates', 'none')
            d['engram'] = bool(d.get('engram', False))
            if d.get('mode') not in MODES:
                raise PlanError('layer %d: bad mode %r' % (d['at'], d.get('mode')))
            if d.get('region') not in ('encoder', 'decoder'):
                raise PlanError('layer %d: bad region %r' % (d['at'], d.get('region')))
            if d['mode'] == 'swa_only':
                d['ratio'] = None
            elif not isinstance(d.get('ratio'), int) or d['ratio'] < 1:
                raise PlanError('layer %d: needs an integer ratio >= 1' % d['at'])
        regions = [d['region'] for d in L]
        if 'decoder' in regions and 'encoder' in regions[regions.index('decoder'):]:
            raise PlanError('encoder layers must come before decoder layers')
        # ownership (docs/plans.md "Ownership: derived or explicit")
        for d in L:
            l, mode, reg = d['at'], d['mode'], d['region']
            if mode == 'swa_only':
                d['kv'] = d['topk'] = d['pool'] = None
                continue
            if mode == 'full':
                if d.get('kv') not in (None, l):
                    raise PlanError('layer %d: a full layer owns its KV' % l)
                d['kv'] = l
            elif d.get('kv') is None:
                src = [s for s in range(l, -1, -1) if L[s]['region'] == reg and L[s]['mode'] == 'full']
                if not src:
                    raise PlanError('layer %d: no KV source at or before it in its region' % l)
                d['kv'] = src[0]
            kv = L[d['kv']]
            if kv['mode'] != 'full' or kv['region'] != reg or d['kv'] > l:
                raise PlanError('layer %d: kv L%d is not a full layer of its region at or before it'
                                % (l, d['kv']))
            if kv['ratio'] != d['ratio']:
                raise PlanError('layer %d: ratio %s differs from its source\'s %s'
                                % (l, d['ratio'], kv['ratio']))
            if mode in ('full', 'reindex'):
                if d.get('topk') not in (None, l):
                    raise PlanError('layer %d: an index source owns its Top-K' % l)
                d['topk'] = l
            elif d.get('topk') is None:
                src = [s for s in range(l - 1, -1, -1) if L[s]['region'] == reg and
                       L[s]['mode'] in ('full', 'reindex') and L[s]['kv'] == d['kv']]
                if not src:
                    raise PlanError('layer %d: no Top-K source before it' % l)
                d['topk'] = src[0]
            else:
                t = L[d['topk']]
                if t['mode'] not in ('full', 'reindex') or t['kv'] != d['kv'] or d['topk'] >= l:
                    raise PlanError('layer %d: topk L%d is not an earlier index source of its KV'
                                    % (l, d['topk']))
            c = d['candidates']
            if c == 'build' and mode != 'full':
                raise PlanError('layer %d: candidates: build needs mode full' % l)
            if c == 'read':
                if mode != 'reindex':
                    raise PlanError('layer %d: candidates: read needs mode reindex' % l)
                if d.get('pool') is None:
                    src = [s for s in range(l - 1, -1, -1) if L[s]['candidates'] == 'build'
                           and L[s]['kv'] == d['kv']]
                    if not src:
                        raise PlanError('layer %d: no candidate pool builder before it' % l)
                    d['pool'] = src[0]
            else:
                d['pool'] = None
        return L

    # ------------------------------------------------------------ helpers
    def mode(self, l):
        return self.layers[l]['mode']

    @property
    def ced(self):
        return bool(self.serving.get('ced', True))

    @property
    def window(self):
        return int(self.model['swa']['window'])

    def replay_decoder(self):
        r = self.serving.get('replay', {}).get('decoder', 'window')
        return self.window if r in (None, 'window') else int(r)

    @property
    def encoder_layers(self):
        return [d['at'] for d in self.layers if d['region'] == 'encoder']

    @property
    def decoder_layers(self):
        return [d['at'] for d in self.layers if d['region'] == 'decoder']

    def kv_sources(self):
        return [d['at'] for d in self.layers if d['mode'] == 'full']

    def index_sources(self):
        return [d['at'] for d in self.layers if d['mode'] in ('full', 'reindex')]

    def pool_readers(self, builder):
        return [d['at'] for d in self.layers if d.get('pool') == builder]

    def table(self):
        """Rows (layer, region, mode, ratio, kv, topk, pool, engram) for printing."""
        return [(d['at'], d['region'], d['mode'], d['ratio'], d['kv'], d['topk'],
                 d['pool'], d['engram']) for d in self.layers]


def load(path):
    return Plan(path)


if __name__ == '__main__':
    import sys
    p = Plan(sys.argv[1])
    print('plan', p.name, 'ced', p.ced)
    for row in p.table():
        print('L%-3d %-8s %-9s ratio %-4s kv %-4s topk %-4s pool %-4s engram %s' % row)
