#!/usr/bin/env python3
"""Converts the four Gospels of the King James Version (1611; public domain), as Debian's
`bible-kjv` package ships them, into word-level token-id files for the LSTM language model.

Usage:
    apt-get install bible-kjv
    python3 tools/kjv_to_tokens.py data/kjv-gospels

The text is read with the package's own `bible` program (verse per line). Tokens: lower-cased
words (letters and apostrophes) and each punctuation mark, an `<eos>` after every verse,
as in the Penn Treebank language-modelling setup. Split, fixed: train = Matthew, Mark and
Luke; valid = John 1-10; test = John 11-21. Vocabulary: `<unk>`, `<eos>`, then the most
frequent training words (ties by spelling) up to VOCAB entries in all; other words map to
`<unk>`. Writes vocab.txt (one token a line, id = line number), train.tok, valid.tok,
test.tok and SHA256SUMS.

Token file format (little-endian), read by datacache::tokens:
    bytes 0..8    magic b"SDLTOK01"
    bytes 8..12   u32 vocabulary size V
    bytes 12..20  u64 token count N
    bytes 20..    N x u16 token ids, each < V
"""

import collections
import hashlib
import os
import re
import struct
import subprocess
import sys

VOCAB = 2000
SPLITS = {
    "train": ["mt1:1-28:20", "mk1:1-16:20", "lk1:1-24:53"],
    "valid": ["jn1:1-10:42"],
    "test": ["jn11:1-21:25"],
}
TOKEN = re.compile(r"[a-z']+|[.,;:?!()]")
VERSE = re.compile(r"^[0-9A-Za-z]+[0-9]+:[0-9]+ (.*)$")


def verses(refs):
    out = subprocess.run(["bible", "-f", *refs], check=True, capture_output=True, text=True)
    lines = []
    for line in out.stdout.splitlines():
        m = VERSE.match(line)
        if m:
            lines.append(m.group(1))
    if not lines:
        raise SystemExit(f"no verses for {refs}: is bible-kjv installed?")
    return lines


def tokenize(lines):
    toks = []
    for line in lines:
        toks.extend(TOKEN.findall(line.lower()))
        toks.append("<eos>")
    return toks


def write_tokens(path, vocab_size, ids):
    with open(path, "wb") as f:
        f.write(b"SDLTOK01")
        f.write(struct.pack("<IQ", vocab_size, len(ids)))
        f.write(struct.pack(f"<{len(ids)}H", *ids))


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    text = {name: tokenize(verses(refs)) for name, refs in SPLITS.items()}
    counts = collections.Counter(t for t in text["train"] if t != "<eos>")
    words = sorted(counts, key=lambda w: (-counts[w], w))[: VOCAB - 2]
    vocab = ["<unk>", "<eos>"] + words
    index = {w: i for i, w in enumerate(vocab)}
    with open(os.path.join(out, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    files = ["vocab.txt"]
    for name, toks in text.items():
        ids = [index.get(t, 0) for t in toks]
        unk = sum(1 for i in ids if i == 0) / len(ids)
        write_tokens(os.path.join(out, f"{name}.tok"), len(vocab), ids)
        files.append(f"{name}.tok")
        print(f"{name}: {len(ids)} tokens, {100 * unk:.1f}% <unk>")
    with open(os.path.join(out, "SHA256SUMS"), "w") as f:
        for name in files:
            with open(os.path.join(out, name), "rb") as g:
                f.write(f"{hashlib.sha256(g.read()).hexdigest()}  {name}\n")


if __name__ == "__main__":
    main()
