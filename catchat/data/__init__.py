"""Data: text in, windows out (docs/data.md).

    vocab.py   the cc101 vocabulary: token layout, normalisation, encode/decode, the fingerprint
    corpus/    readers (plain text, JSONL dialogue, Shakespeare) -> token file + index + manifest;
               the train/eval split, held-out plays, the store of built corpora
    lanes.py   order-preserving lanes of whole conversations, their windows, reset masks, the cursor
    lane_order.py  which conversations each lane reads, in which order (data.lane_order)
"""
