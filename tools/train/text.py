"""
text.py - the caption tokenizer: a real byte-level BPE tokenizer.json that flexdiag's own
tokenizer (runtime/text/tokenizer_load.c) reads, and a Python encoder that reproduces what
flexdiag (and Hugging Face `tokenizers`) does with it for our captions.

Layout (the GPT-2 / OPT layout flexdiag's golden OPT fixture already exercises):
  * pre_tokenizer ByteLevel(add_prefix_space=false, use_regex=true): the GPT-2 split regex, then
    bytes -> GPT-2 byte symbols ("Ġ" for a space, "Ċ" for a newline);
  * model BPE: ids 0..255 the 256 byte symbols (in byte order), then one token per caption word
    with its leading space ("Ġred", "Ġcircles", ...) and the intermediate prefixes its merge
    chain needs ("Ġr", "Ġre"), plus "ĊĊ"; merges are those chains. Every lexicon word therefore
    encodes as one token, any other text falls back to byte tokens (never an error);
  * added tokens (special): the Janus-Pro names, looked up by string by flexdiag:
    <｜begin▁of▁sentence｜> (BOS), <｜end▁of▁sentence｜>, <｜▁pad▁｜> (pad of the CFG row),
    <|User|>, <|Assistant|>, <begin_of_image>, <end_of_image>, <image_placeholder>.

flexdiag's Janus prompt (runtime/text/tokenizer.c flexdiag__janus_prompt_ids) is
  [BOS] + encode(strip("<|User|>: " + strip(caption) + "\n\n<|Assistant|>:")) + [<begin_of_image>]
and the unconditional CFG row (runtime/engine/run.c uncond_row) keeps the first and last id and
replaces every id in between by the pad id; prompt_ids() and uncond_ids() below do the same.
"""

import json
import re

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
PAD = "<\uff5c\u2581pad\u2581\uff5c>"
USER = "<|User|>"
ASSISTANT = "<|Assistant|>"
BOI = "<begin_of_image>"
EOI = "<end_of_image>"
IMG = "<image_placeholder>"
SPECIALS = [BOS, EOS, PAD, USER, ASSISTANT, BOI, EOI, IMG]

# GPT-2's split regex with \p{L} -> [^\W\d_] and \p{N} -> \d (identical on ASCII text)
GPT2_SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    """GPT-2's byte -> printable symbol map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


B2U = bytes_to_unicode()


class Tokenizer:
    def __init__(self, words):
        self.vocab = {B2U[b]: b for b in range(256)}
        self.merges = []
        chains = ["\u0120" + w for w in words] + ["\u010a\u010a"]
        for w in chains:
            cur = w[0]
            for ch in w[1:]:
                nxt = cur + ch
                if nxt not in self.vocab:
                    self.vocab[nxt] = len(self.vocab)
                    self.merges.append((cur, ch))
                cur = nxt
        self.ranks = {m: i for i, m in enumerate(self.merges)}
        self.special = {}
        for s in SPECIALS:
            self.special[s] = len(self.vocab) + len(self.special)
        self.n_ids = len(self.vocab) + len(self.special)
        self._cache = {}

    @classmethod
    def from_file(cls, path):
        """The tokenizer a tokenizer.json written by save() describes (vocab, merges, added)."""
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        t = cls.__new__(cls)
        t.vocab = dict(j["model"]["vocab"])
        t.merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                    for m in j["model"]["merges"]]
        t.ranks = {m: i for i, m in enumerate(t.merges)}
        t.special = {a["content"]: a["id"] for a in j["added_tokens"]}
        t.n_ids = max(list(t.vocab.values()) + list(t.special.values())) + 1
        t._cache = {}
        return t

    # ---- ids of the Janus template ----
    @property
    def bos(self):
        return self.special[BOS]

    @property
    def pad(self):
        return self.special[PAD]

    @property
    def boi(self):
        return self.special[BOI]

    def _bpe(self, piece):
        syms = [B2U[b] for b in piece.encode("utf-8")]
        while len(syms) > 1:
            best, at = None, -1
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            syms = syms[:at] + [syms[at] + syms[at + 1]] + syms[at + 2:]
        return [self.vocab[s] for s in syms]

    def encode(self, text):
        """encode(text, add_special_tokens=False): added tokens split out (leftmost-longest),
        then the GPT-2 split and BPE on the rest."""
        out = []
        pat = "|".join(re.escape(s) for s in sorted(self.special, key=len, reverse=True))
        pos = 0
        for m in re.finditer(pat, text):
            out += self._encode_plain(text[pos:m.start()])
            out.append(self.special[m.group(0)])
            pos = m.end()
        out += self._encode_plain(text[pos:])
        return out

    def _encode_plain(self, text):
        ids = []
        for piece in GPT2_SPLIT.findall(text):
            ids += self._bpe(piece)
        return ids

    def prompt_ids(self, caption):
        """flexdiag's conditional Janus row: BOS .. <begin_of_image> (memoised)."""
        ids = self._cache.get(caption)
        if ids is None:
            text = ("<|User|>: " + caption.strip() + "\n\n<|Assistant|>:").strip()
            ids = [self.bos] + self.encode(text) + [self.boi]
            self._cache[caption] = ids
        return list(ids)

    def uncond_ids(self, cond):
        """The CFG row flexdiag builds from a conditional row: first and last kept, pad between."""
        return [cond[0]] + [self.pad] * (len(cond) - 2) + [cond[-1]]

    def to_json(self):
        added = [{"id": self.special[s], "content": s, "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": False, "special": True} for s in SPECIALS]
        return {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": True, "use_regex": True},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": self.vocab, "merges": [a + " " + b for a, b in self.merges]},
        }

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, ensure_ascii=False, indent=1)
            f.write("\n")


def check_with_hf(tok, path, captions):
    """When the `tokenizers` library is importable (the GPU host has it with transformers),
    encode every caption with it from the written tokenizer.json and compare with ours.
    Returns a message, or None when the library is missing."""
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except Exception:
        return None
    hf = HFTokenizer.from_file(path)
    bad = 0
    for c in captions:
        text = ("<|User|>: " + c.strip() + "\n\n<|Assistant|>:").strip()
        if hf.encode(text, add_special_tokens=False).ids != tok.encode(text):
            bad += 1
    return "tokenizers library: %d of %d captions encode differently" % (bad, len(captions))
