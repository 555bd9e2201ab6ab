"""Minimal safetensors reader/writer for the oracle (docs/safetensors.md).

File = 8-byte little-endian header length N, N bytes of JSON, then the data
buffer.  Each tensor entry has dtype, shape and data_offsets [begin, end)
relative to the data buffer; tensors must tile the buffer exactly.
"""
import json
import mmap
import struct

import numpy as np

DTYPES = {'F64': '<f8', 'F32': '<f4', 'F16': '<f2', 'I64': '<i8', 'I32': '<i4', 'I16': '<i2',
          'I8': 'i1', 'U64': '<u8', 'U32': '<u4', 'U16': '<u2', 'U8': 'u1', 'BOOL': '?'}
_NAMES = {np.dtype(v).str if v != '?' else '|b1': k for k, v in DTYPES.items()}
_ALIGN_ORDER = ['F64', 'I64', 'U64', 'F32', 'I32', 'U32', 'F16', 'I16', 'U16', 'I8', 'U8', 'BOOL']


class STError(Exception):
    pass


class SafeTensors:
    """Read-only view of a safetensors file: .names, .meta, [name] -> ndarray (no copy)."""

    def __init__(self, path):
        self.path = path
        with open(path, 'rb') as f:
            size = f.seek(0, 2)
            if size < 8:
                raise STError('%s: shorter than 8 bytes' % path)
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b''
        n = struct.unpack('<Q', self._mm[:8])[0]
        if n > 100_000_000 or 8 + n > size:
            raise STError('%s: header length %d is too large' % (path, n))
        hdr = bytes(self._mm[8:8 + n])
        if hdr[:1] != b'{':
            raise STError('%s: header does not start with {' % path)
        pairs = json.loads(hdr.decode('utf-8'), object_pairs_hook=_no_dup)
        self.meta = pairs.pop('__metadata__', None) or {}
        self.base = 8 + n
        dlen = size - self.base
        self.entries = {}
        spans = []
        for name, e in pairs.items():
            if set(e) != {'dtype', 'shape', 'data_offsets'}:
                raise STError('%s: tensor %r: bad keys %s' % (path, name, sorted(e)))
            if e['dtype'] not in DTYPES:
                raise STError('%s: tensor %r: unknown dtype %s' % (path, name, e['dtype']))
            shape = tuple(int(s) for s in e['shape'])
            b, en = (int(v) for v in e['data_offsets'])
            item = np.dtype(DTYPES[e['dtype']]).itemsize
            if en < b or en - b != int(np.prod(shape, dtype=np.int64)) * item or en > dlen:
                raise STError('%s: tensor %r: bad data_offsets %s' % (path, name, [b, en]))
            self.entries[name] = (e['dtype'], shape, b, en)
            spans.append((b, en, name))
        spans.sort()
        at = 0
        for b, en, name in spans:
            if b != at:
                raise STError('%s: tensor %r: hole or overlap at %d' % (path, name, b))
            at = en
        if at != dlen:
            raise STError('%s: %d bytes after the last tensor' % (path, dlen - at))
        self.names = list(self.entries)

    def __contains__(self, name):
        return name in self.entries

    def __getitem__(self, name):
        if name not in self.entries:
            raise KeyError('%s: no tensor %r' % (self.path, name))
        dt, shape, b, en = self.entries[name]
        a = np.frombuffer(self._mm, dtype=DTYPES[dt], count=int(np.prod(shape, dtype=np.int64)),
                          offset=self.base + b)
        return a.reshape(shape)

    def dtype(self, name):
        return self.entries[name][0]

    def shape(self, name):
        return self.entries[name][1]


def _no_dup(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise STError('duplicate key %r' % k)
        out[k] = v
    return out


def write(path, tensors, meta=None):
    """Write {name: ndarray} in the official layout (dtype alignment order, then name)."""
    items = []
    for name, a in tensors.items():
        a = np.asarray(a)
        key = a.dtype.str if a.dtype != np.bool_ else '|b1'
        if key not in _NAMES:
            raise STError('unsupported dtype %s for %r' % (a.dtype, name))
        items.append((_ALIGN_ORDER.index(_NAMES[key]), name.encode(), name, _NAMES[key], a))
    items.sort(key=lambda t: (t[0], t[1]))
    hdr, off = {}, 0
    if meta:
        hdr['__metadata__'] = {k: str(meta[k]) for k in sorted(meta)}
    for _, _, name, dt, a in items:
        hdr[name] = {'dtype': dt, 'shape': list(a.shape), 'data_offsets': [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(hdr, separators=(',', ':')).encode()
    h += b' ' * ((8 - len(h) % 8) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)))
        f.write(h)
        for *_, a in items:
            f.write(a.astype(a.dtype.newbyteorder('<'), copy=False).tobytes(order='C'))
