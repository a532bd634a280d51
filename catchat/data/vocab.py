"""The cc101 vocabulary: token layout, text normalisation, encode/decode and the fingerprint.

Layout (a contract: checkpoints and corpora store its fingerprint, and a mismatch is refused):
    0 <pad>  1 <bos>  2 <eos>  3 <turn>  4 <unk>  5 "\\n"  6..100 = printable ASCII 0x20..0x7E
Text is normalised first (see NORMALISATION and docs/vocabulary.md); any character still outside
the layout encodes as <unk> and is counted. Special tokens are never produced from text.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass

import numpy as np

PAD, BOS, EOS, TURN, UNK, NEWLINE = 0, 1, 2, 3, 4, 5
FIRST_PRINTABLE = 6
SPECIALS = ("<pad>", "<bos>", "<eos>", "<turn>", "<unk>")
TOKENS: tuple[str, ...] = SPECIALS + ("\n",) + tuple(chr(c) for c in range(0x20, 0x7F))
VOCAB_SIZE = len(TOKENS)  # 101
NAME = "cc101"

# What normalisation does before encoding; everything else outside printable ASCII is <unk>.
NORMALISATION: dict[str, str] = {
    "\r\n": "\n",  # Windows line ends (handled before the per-character table)
    "\r": "\n",  # old Mac line ends
    "\t": " ",  # tabs become one space
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",  # curly single quotes, prime
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',  # curly double quotes
    "\u00ab": '"', "\u00bb": '"',  # guillemets
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2212": "-",  # hyphens, en dash, minus
    "\u2014": "--", "\u2015": "--",  # em dash, horizontal bar
    "\u2026": "...",  # ellipsis
    "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2009": " ", "\u202f": " ",  # non-breaking/thin spaces
    "\u200b": "", "\ufeff": "",  # zero-width space, byte-order mark
}

# Byte value -> token id for the ASCII range; 255 marks "not in the vocabulary".
_ASCII_TO_ID = np.full(256, UNK, dtype=np.uint8)
_ASCII_TO_ID[ord("\n")] = NEWLINE
_ASCII_TO_ID[0x20:0x7F] = np.arange(FIRST_PRINTABLE, VOCAB_SIZE, dtype=np.uint8)
_TRANSLATE = str.maketrans({k: v for k, v in NORMALISATION.items() if len(k) == 1})


def fingerprint() -> str:
    """sha256 (hex) of the ordered token list serialised as compact JSON: the vocabulary's identity."""
    return hashlib.sha256(json.dumps(TOKENS, separators=(",", ":")).encode("utf-8")).hexdigest()


FINGERPRINT = fingerprint()


def normalise(text: str) -> str:
    """Apply the documented normalisation table (CRLF first, then per-character replacements)."""
    return text.replace("\r\n", "\n").translate(_TRANSLATE)


@dataclass
class Encoded:
    """Token ids of a text plus how many characters fell outside the vocabulary."""

    ids: np.ndarray  # uint8 [n]
    unk_count: int
    char_count: int


def encode(text: str, *, normalise_text: bool = True) -> Encoded:
    """Encode text to cc101 ids (uint8). Characters outside the vocabulary become <unk> and are counted."""
    if normalise_text:
        text = normalise(text)
    raw = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    ids = np.full(raw.shape, UNK, dtype=np.uint8)
    ascii_mask = raw < 128
    ids[ascii_mask] = _ASCII_TO_ID[raw[ascii_mask]]
    return Encoded(ids=ids, unk_count=int(np.count_nonzero(ids == UNK)), char_count=int(raw.size))


def tally_unknown(codes: np.ndarray) -> Counter[str]:
    """Code points (uint32) of characters already known to be outside the vocabulary -> how often
    each occurs (what `describe_unknown` names)."""
    values, counts = np.unique(np.asarray(codes, np.uint32), return_counts=True)
    return Counter({chr(int(v)): int(n) for v, n in zip(values, counts)})


def unknown_characters(text: str) -> Counter[str]:
    """The characters of `text` (after normalisation) that encode as <unk>, with their counts."""
    raw = np.frombuffer(normalise(text).encode("utf-32-le"), dtype=np.uint32)
    unk = raw[(raw >= 128) | (_ASCII_TO_ID[raw & 0xFF] == UNK)]
    return tally_unknown(unk)


def describe_unknown(counts: Counter[str] | dict[str, int], top: int = 5) -> str:
    """'æ U+00E6 x12, é U+00E9 x3 and 4 more': the most frequent characters outside the vocabulary,
    each with its code point (the glyph alone is no help for an invisible or look-alike character,
    which then shows as its code point only)."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = [(f"{c} " if c.isprintable() and not c.isspace() else "") + f"U+{ord(c):04X} x{n:,}"
             for c, n in ranked[:top]]
    rest = len(ranked) - len(shown)
    return ", ".join(shown) + (f" and {rest:,} more" if rest > 0 else "")


def encode_ids(text: str) -> np.ndarray:
    """Shorthand for `encode(text).ids`."""
    return encode(text).ids


def decode(ids, *, show_specials: bool = False) -> str:
    """Turn ids back into text. Specials show as tags when asked; otherwise <turn> is a newline,
    <unk> the replacement character and <pad>/<bos>/<eos> are dropped."""
    out = []
    for i in np.asarray(ids, dtype=np.int64).ravel():
        if i < 0 or i >= VOCAB_SIZE:
            raise ValueError(f"token id {i} is outside the {NAME} vocabulary (0..{VOCAB_SIZE - 1})")
        if i >= NEWLINE:
            out.append(TOKENS[i])
        elif show_specials:
            out.append(TOKENS[i])
        elif i == TURN:
            out.append("\n")
        elif i == UNK:
            out.append("\ufffd")
    return "".join(out)
