"""data.py: the training corpus (public-domain English from a Debian package).

The King James Bible of Debian's `bible-kjv` (text in `bible-kjv-text`),
printed whole with `bible -f Gen1:1-Rev22:21`: 4.4 MB of English whose
translation (1611) is out of copyright (the package's copyright file says
so). Debian ships no Project Gutenberg prose; this is the largest and most
varied public-domain English text a Debian package holds that we found.
Each line's verse reference (`Ge1:1 `) is removed, so the model reads
running English. Held out: the last 5% of each of 20 equal segments, so
that both testaments and every style is in both parts.
"""
import hashlib
import os
import re
import subprocess

import numpy as np

BIBLE_ARGS = ['bible', '-f', 'Gen1:1-Rev22:21']
SEGMENTS, HELD_FRACTION = 20, 0.05
LICENSE = ('King James Version (1611): copyright expired (public domain); Debian package '
           'bible-kjv-text, /usr/share/doc/bible-kjv-text/copyright')


def raw_text():
    try:
        out = subprocess.run(BIBLE_ARGS, check=True, capture_output=True).stdout
    except FileNotFoundError:
        raise SystemExit("train: `bible` not found: install Debian's bible-kjv (make train-deps)")
    return out


def clean(raw):
    """Drop the verse reference at the start of each line."""
    return re.sub(rb'(?m)^[1-3]?[A-Za-z]+\d+:\d+ ', b'', raw)


def split(text):
    """(train bytes, held-out bytes)."""
    n = len(text)
    tr, ho = [], []
    for i in range(SEGMENTS):
        a, b = n * i // SEGMENTS, n * (i + 1) // SEGMENTS
        cut = b - int((b - a) * HELD_FRACTION)
        tr.append(text[a:cut])
        ho.append(text[cut:b])
    return b''.join(tr), b''.join(ho)


def corpus(cache_dir):
    """Writes and returns (train, held-out) as uint8 arrays, plus the manifest entry."""
    os.makedirs(cache_dir, exist_ok=True)
    raw = raw_text()
    text = clean(raw)
    tr, ho = split(text)
    info = {'source': ' '.join(BIBLE_ARGS), 'package': 'bible-kjv 4.38 / bible-kjv-text 4.38',
            'license': LICENSE, 'raw_bytes': len(raw), 'raw_sha256': hashlib.sha256(raw).hexdigest(),
            'clean_bytes': len(text), 'clean_sha256': hashlib.sha256(text).hexdigest(),
            'train_bytes': len(tr), 'heldout_bytes': len(ho),
            'heldout_sha256': hashlib.sha256(ho).hexdigest(),
            'split': 'last %d%% of each of %d equal segments held out' % (HELD_FRACTION * 100, SEGMENTS)}
    for name, b in (('train.bin', tr), ('heldout.bin', ho)):
        with open(os.path.join(cache_dir, name), 'wb') as f:
            f.write(b)
    return np.frombuffer(tr, np.uint8), np.frombuffer(ho, np.uint8), info
