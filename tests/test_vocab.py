"""cc101 vocabulary: layout, round trips, normalisation, <unk> counting and the pinned fingerprint."""

import numpy as np
import pytest

from catchat.data import vocab

# Pinned: if this changes, every checkpoint and corpus ever written becomes unreadable (lesson 1).
CC101_FINGERPRINT = "f0c3c48f8f3c0d52400262ad589aa9d267e580eb4f0022fc44e89bb2341dbc26"


def test_layout():
    assert vocab.VOCAB_SIZE == 101
    assert vocab.TOKENS[:6] == ("<pad>", "<bos>", "<eos>", "<turn>", "<unk>", "\n")
    assert vocab.TOKENS[6] == " " and vocab.TOKENS[100] == "~"


def test_fingerprint_is_pinned():
    assert vocab.fingerprint() == CC101_FINGERPRINT == vocab.FINGERPRINT


def test_round_trip_every_printable_and_newline():
    text = "".join(chr(c) for c in range(0x20, 0x7F)) + "\n"
    enc = vocab.encode(text)
    assert enc.ids.dtype == np.uint8
    assert list(enc.ids) == list(range(6, 101)) + [5]
    assert enc.unk_count == 0 and enc.char_count == len(text)
    assert vocab.decode(enc.ids) == text


@pytest.mark.parametrize("tag", ["<pad>", "<bos>", "<eos>", "<turn>", "<unk>"])
def test_specials_never_come_from_text(tag):
    ids = vocab.encode(f"a {tag} b").ids
    assert ids.max() >= vocab.FIRST_PRINTABLE
    assert not np.isin(ids, [vocab.PAD, vocab.BOS, vocab.EOS, vocab.TURN, vocab.UNK]).any()


def test_unknown_characters_become_unk_and_are_counted():
    enc = vocab.encode("caf\u00e9 \u4e2d\u6587 \x07 ok")  # é, two CJK characters, a bell
    assert enc.unk_count == 4
    assert np.count_nonzero(enc.ids == vocab.UNK) == 4
    assert vocab.decode(enc.ids) == "caf\ufffd \ufffd\ufffd \ufffd ok"


def test_normalisation_table():
    src = "\u201cHi\u201d \u2018x\u2019\tend\u2014no\u2013yes\u2026\r\nnext\rlast\u00a0\ufeff"
    assert vocab.normalise(src) == '"Hi" \'x\' end--no-yes...\nnext\nlast '
    assert vocab.encode(src).unk_count == 0


def test_decode_specials():
    ids = [vocab.BOS, 6 + ord("A") - 0x20, vocab.TURN, vocab.UNK, vocab.EOS, vocab.PAD]
    assert vocab.decode(ids, show_specials=True) == "<bos>A<turn><unk><eos><pad>"
    assert vocab.decode(ids) == "A\n\ufffd"
    with pytest.raises(ValueError, match="outside"):
        vocab.decode([101])
