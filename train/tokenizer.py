"""tokenizer.py: the byte vocabulary as Hugging Face tokenizer files.

Ids 0-255 are the byte values; 256 BOS `<bos>`, 257 EOS `<eos>`, 258 pad
`<pad>`, 259 the DSpark noise token `<noise>`, 260 the image token
`<image>`, 261 `<|User|>`, 262 `<|Assistant|>` (the chat literals). The
model was trained on raw byte windows without BOS, so tokenizer_config.json
names no BOS and no chat template: `cedar run --raw` is the form it knows. A
`BPE` model with no merges over the byte-level alphabet (GPT-2's byte to
character map, the ByteLevel pre-tokenizer's and decoder's): each byte is
one token, whatever the text (docs/tokenizer.md lists what cedar reads).

    /usr/bin/python3 train/tokenizer.py DIR      # writes DIR/tokenizer.json, DIR/tokenizer_config.json
"""
import json
import os
import sys

SPECIAL = [(256, '<bos>'), (257, '<eos>'), (258, '<pad>'), (259, '<noise>'), (260, '<image>'),
           (261, '<|User|>'), (262, '<|Assistant|>')]
BOS, EOS, PAD = 256, 257, 258


def byte_chars():
    """GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves,
    the others to U+0100 onwards in byte order."""
    keep = list(range(ord('!'), ord('~') + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def tokenizer_json():
    bc = byte_chars()
    return {
        'version': '1.0', 'truncation': None, 'padding': None,
        'added_tokens': [{'id': i, 'content': c, 'single_word': False, 'lstrip': False, 'rstrip': False,
                          'normalized': False, 'special': True} for i, c in SPECIAL],
        'normalizer': None,
        'pre_tokenizer': {'type': 'Sequence', 'pretokenizers': [
            {'type': 'ByteLevel', 'add_prefix_space': False, 'trim_offsets': True, 'use_regex': False}]},
        'post_processor': None,
        'decoder': {'type': 'ByteLevel', 'add_prefix_space': True, 'trim_offsets': True, 'use_regex': True},
        'model': {'type': 'BPE', 'dropout': None, 'unk_token': None, 'continuing_subword_prefix': None,
                  'end_of_word_suffix': None, 'fuse_unk': False, 'byte_fallback': False,
                  'vocab': {bc[b]: b for b in range(256)}, 'merges': []},
    }


# The DeepSeek-V3 form cedar renders (docs/tokenizer.md): bos, the system
# prompt, then <|User|> + message, then <|Assistant|>.
CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}{%- endif %}{%- endfor %}"
    "{{bos_token}}{{ns.system_prompt}}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{'<|User|>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{{'<|Assistant|>' + message['content'] + '<eos>'}}{%- endif %}"
    "{%- endfor %}"
    "{% if add_generation_prompt %}{{'<|Assistant|>'}}{% endif %}")


def tokenizer_config(chat=False):
    """EOS and pad, and no BOS: the model was trained on raw byte windows,
    so a reader that puts the config's BOS first (cedar eval, cedar run's
    chat form) would score or prompt it in a form it never saw; cedar run
    --raw is its form. chat=True adds BOS and the chat template (a model
    trained on that form)."""
    c = {'eos_token': '<eos>', 'pad_token': '<pad>', 'add_bos_token': False, 'add_eos_token': False,
         'model_max_length': 65536, 'tokenizer_class': 'PreTrainedTokenizerFast'}
    if chat:
        c.update({'bos_token': '<bos>', 'chat_template': CHAT_TEMPLATE})
    return c


def write(d):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'tokenizer.json'), 'w', encoding='utf-8') as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False, indent=1)
    with open(os.path.join(d, 'tokenizer_config.json'), 'w', encoding='utf-8') as f:
        json.dump(tokenizer_config(), f, ensure_ascii=False, indent=1)


if __name__ == '__main__':
    if len(sys.argv) != 2:
        raise SystemExit('usage: tokenizer.py DIR')
    write(sys.argv[1])


WHITE_SPACE = ' \t\n\x0b\x0c\r'      # Unicode White_Space among the texts a single id decodes to


def engram_key(text, raw):
    """Appendix V #18's normalisation of one id's decoded text (docs/tokenizer.md,
    "The Engram token map"): U+FFFD -> the raw token string; else NFKC, NFD,
    drop Mn, lowercase, whitespace runs -> one space, a lone space kept, strip."""
    import re
    import unicodedata as U
    if '\ufffd' in text:
        return raw
    k = U.normalize('NFD', U.normalize('NFKC', text))
    k = ''.join(c for c in k if U.category(c) != 'Mn').lower()
    k = re.sub('[ \t\r\n]+', ' ', k)
    if k != ' ':
        k = k.strip(WHITE_SPACE)
    return k if k else text


def engram_map(vocab):
    """(map id -> compressed id for ids 0..vocab-1, number of keys): keys
    numbered by first appearance; ids past the tokenizer's take the pad's key."""
    bc = byte_chars()
    special = dict(SPECIAL)
    keys, out = {}, []
    for i in range(vocab):
        if i < 256:
            k = engram_key(bytes([i]).decode('utf-8', errors='replace'), bc[i])
        elif i in special:
            k = engram_key(special[i], special[i])
        else:
            k = None
        if k is not None:
            out.append(keys.setdefault(k, len(keys)))
        else:
            out.append(-1)
    pad = out[PAD]
    return [pad if c < 0 else c for c in out], len(keys)
