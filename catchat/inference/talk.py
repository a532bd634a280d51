"""Dialogue with models: `catchat talk` (you and a model) and `catchat chat` (two models).

A conversation is the corpus layout `<bos> SPEAKER: text <turn> SPEAKER: text ... <eos>`
(docs/data.md). The program feeds every speaker prefix `NAME: ` and every turn written by someone
else; the model samples only the text of its own turns, which end at `<turn>`, at `<eos>` (the
program feeds `<turn>` in its place and the conversation goes on) or at the length limit.

Rolling context: a `Dialogue` keeps the conversation's turns and the tokens in its model's state
since the last `<bos>`. When the context would exceed its budget (about 800 tokens by default), the
model is re-primed from a zero state with `<bos>` + the most recent whole turns that fit (at
least the latest one, whatever its length) + the next speaker's prefix. docs/generation.md has
the details, the talk commands and the chat-log format.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from catchat.data import vocab
from catchat.errors import UsageError
from catchat.inference.generate import Generator, Sampling
from catchat.rng import derive_seed

DEFAULT_CONTEXT = 800  # tokens (= characters) of rolling context
DEFAULT_TURN_LENGTH = 300  # most characters a model writes in one turn
CHAT_FORMAT = "catchat-chat"  # the "format" of every chat-log line


# ---------------------------------------------------------------------------------------------
# One conversation as one model sees it
# ---------------------------------------------------------------------------------------------

@dataclass
class Turn:
    speaker: str
    ids: list[int]  # token ids of the text (no prefix, no separator)
    stop: str | None = None  # generated turns: "turn" | "eos" | "length"; None for a given turn

    @property
    def text(self) -> str:
        return vocab.decode(self.ids)


def _prefix(speaker: str) -> list[int]:
    return vocab.encode(f"{speaker}: ").ids.tolist()


class Dialogue:
    """The turns of a conversation and the model state that has read them (one stream).

    `add` appends someone else's turn (fed lazily, with the next reply); `reply` feeds what is
    pending plus the speaker's prefix and samples the speaker's text."""

    def __init__(self, gen: Generator, context: int = DEFAULT_CONTEXT):
        if gen.streams != 1:
            raise ValueError("a Dialogue drives a one-stream Generator")
        if context < 16:
            raise UsageError(f"context {context} is too small", "give at least 16 tokens of context (default 800)")
        self.gen, self.context = gen, int(context)
        self.turns: list[Turn] = []
        self.reprimes = 0
        self.reset()

    def reset(self) -> None:
        """Start a new conversation: no turns, zero state."""
        self.turns = []
        self._ctx: list[int] = [vocab.BOS]  # tokens since the last <bos>: in the state up to _fed
        self._fed = 0
        self._first = 0  # index of the first turn in _ctx
        self.gen.reset()

    @property
    def context_tokens(self) -> list[int]:
        """The tokens the model's state stands for (and those about to be fed)."""
        return list(self._ctx)

    def _turn_tokens(self, t: Turn) -> list[int]:
        return _prefix(t.speaker) + list(t.ids)

    def add(self, speaker: str, text: str) -> Turn:
        """A turn written by someone else (a user, the other model, an opening line)."""
        turn = Turn(speaker, vocab.encode(text).ids.tolist())
        self._append(turn)
        return turn

    def add_turn(self, turn: Turn) -> None:
        """A turn another Dialogue produced (its tokens as they are)."""
        self._append(Turn(turn.speaker, list(turn.ids)))

    @property
    def turns_in_context(self) -> int:
        """How many of the latest turns the model's current context holds (after re-priming)."""
        return len(self.turns) - self._first

    def _append(self, turn: Turn) -> None:
        if self.turns:
            self._ctx.append(vocab.TURN)
        self._ctx += self._turn_tokens(turn)
        self.turns.append(turn)

    def _reprime(self, reserve: int) -> None:
        """Zero state; context = <bos> + the most recent whole turns that fit with `reserve` more."""
        keep, size = len(self.turns), 1 + reserve  # <bos> + what follows the last turn
        while keep > 0:
            latest = keep == len(self.turns)
            need = len(self._turn_tokens(self.turns[keep - 1])) + (0 if latest else 1)  # + the <turn> after it
            if size + need > self.context and not latest:
                break
            size += need
            keep -= 1
        self._first = keep
        ctx = [vocab.BOS]
        for i, t in enumerate(self.turns[keep:]):
            if i:
                ctx.append(vocab.TURN)
            ctx += self._turn_tokens(t)
        self._ctx, self._fed = ctx, 0
        self.gen.reset()
        self.reprimes += 1

    def reply(self, speaker: str, length: int, sampling: Sampling, seed: int,
              on_token: Callable[[int], None] | None = None) -> Turn:
        """`speaker`'s next turn, sampled with `seed`: feeds what is pending and `speaker: `, then
        samples up to `length` tokens, stopping at <turn> or <eos>. on_token sees each text token as
        it comes."""
        pending = ([vocab.TURN] if self.turns else []) + _prefix(speaker)
        if len(self._ctx) + len(pending) > self.context:
            self._reprime(len(pending))
        self._ctx += pending
        stops = (vocab.TURN, vocab.EOS)

        def show(rows):  # a chunk [k, 1] of tokens; <pad> once the reply has stopped
            for t in rows[:, 0].tolist():
                if t not in stops and t != vocab.PAD:
                    on_token(t)

        unfed = np.asarray(self._ctx[self._fed:], np.uint32)  # fed by the same call that samples
        out = self.gen.generate(unfed, length, sampling, seed, stop_at=stops,
                                on_tokens=show if on_token is not None else None)[0]
        stop = {vocab.TURN: "turn", vocab.EOS: "eos"}.get(out[-1], "length")
        ids = out[:-1] if stop != "length" else out
        turn = Turn(speaker, ids, stop)
        self.turns.append(turn)
        self._ctx += ids  # the prefix is already there
        self._fed = len(self._ctx) - (1 if stop == "length" else 0)  # generate() leaves its last token unfed
        return turn


def context_budget(cfg, requested: int | None) -> tuple[int, str]:
    """Rolling-context budget for a model trained with `cfg`, and a note when it was capped.

    With carried state (data.carry_state = true) the model read whole conversations through its
    state, so any budget is in range; a stateless model never saw more than data.window tokens."""
    budget = DEFAULT_CONTEXT if requested is None else int(requested)
    if not cfg.data.carry_state and budget > cfg.data.window:
        return cfg.data.window, (f"context capped at {cfg.data.window} tokens: the model was trained "
                                 f"statelessly on windows of {cfg.data.window}")
    return budget, ""


# ---------------------------------------------------------------------------------------------
# talk: you and a model
# ---------------------------------------------------------------------------------------------

TALK_HELP = ("commands: /temp X  /topk K  /topp P  /greedy [on|off]  /ngram N  /length N  /reset  "
             "/settings  /quit   (start a line with // to say something that begins with /)")


class _Quit(Exception):
    pass


@dataclass
class TalkState:
    user: str
    speaker: str
    sampling: Sampling
    length: int = DEFAULT_TURN_LENGTH

    def describe(self) -> str:
        s = self.sampling
        return (f"you are {self.user}, the model is {self.speaker}; temperature {s.temperature:g}, "
                f"top-k {s.top_k}, top-p {s.top_p:g}, greedy {'on' if s.greedy else 'off'}, "
                f"ngram-block {s.ngram_block}, length {self.length}")


def _talk_command(line: str, st: TalkState, dialogue: Dialogue) -> str:
    """Apply one /command; returns what to tell the user. Raises _Quit, or UsageError for bad values."""
    name, _, arg = line.strip().partition(" ")
    name, arg = name.lower(), arg.strip()

    def number(kind, flag):
        if not arg:
            raise UsageError(f"{name} needs a value", TALK_HELP)
        try:
            return kind(arg)
        except ValueError:
            raise UsageError(f"{name}: {arg!r} is not a{'n integer' if kind is int else ' number'}",
                             f"e.g. {name} {'40' if kind is int else '0.7'}") from None

    if name in ("/quit", "/exit", "/q", "/bye"):
        raise _Quit
    if name in ("/help", "/?", "/h"):
        return TALK_HELP
    if name in ("/settings", "/show"):
        return st.describe()
    if name == "/reset":
        dialogue.reset()
        return "conversation reset (zero state, no context)"
    if name in ("/temp", "/temperature", "/t"):
        st.sampling = st.sampling.replace(temperature=number(float, "temperature"))
        return f"temperature {st.sampling.temperature:g}"
    if name in ("/topk", "/top-k", "/k"):
        st.sampling = st.sampling.replace(top_k=number(int, "top-k"))
        return f"top-k {st.sampling.top_k}"
    if name in ("/topp", "/top-p", "/p"):
        st.sampling = st.sampling.replace(top_p=number(float, "top-p"))
        return f"top-p {st.sampling.top_p:g}"
    if name in ("/ngram", "/ngram-block"):
        st.sampling = st.sampling.replace(ngram_block=number(int, "ngram-block"))
        return f"ngram-block {st.sampling.ngram_block}"
    if name == "/greedy":
        on = {"": not st.sampling.greedy, "on": True, "off": False}.get(arg.lower())
        if on is None:
            raise UsageError(f"/greedy takes on or off, not {arg!r}", "/greedy on")
        st.sampling = st.sampling.replace(greedy=on)
        return f"greedy {'on' if on else 'off'}"
    if name == "/length":
        n = number(int, "length")
        if n < 1:
            raise UsageError(f"/length {n} is out of range", "give at least 1")
        st.length = n
        return f"length {n}"
    raise UsageError(f"unknown command {name}", TALK_HELP)


def talk(dialogue: Dialogue, lines: Iterable[str], st: TalkState, *, seed: int = 0,
         write: Callable[[str], None], note: Callable[[str], None], one_line: bool = False) -> int:
    """The talk loop: each line from `lines` is the user's turn (or a /command); the model's answer
    is written (streamed) through `write`. one_line (stdin is a pipe): each answer is one output
    line with its line breaks shown as ' / ', and no speaker prefix. Returns the answers given."""
    answers = 0
    for raw in lines:
        line = raw.rstrip("\r\n")
        if line.startswith("/") and not line.startswith("//"):
            try:
                note(_talk_command(line, st, dialogue))
            except _Quit:
                break
            except UsageError as e:
                note(f"{e.message}" + (f" ({e.hint})" if e.hint else ""))
            continue
        if line.startswith("//"):
            line = line[1:]
        if not line.strip():
            continue
        dialogue.add(st.user, line)
        reprimes = dialogue.reprimes
        if not one_line:
            write(f"{st.speaker}: ")

        def show(tok: int) -> None:
            s = vocab.decode([tok])
            write(s.replace("\n", " / ") if one_line else s)

        dialogue.reply(st.speaker, st.length, st.sampling, derive_seed(seed, answers), on_token=show)
        write("\n")
        answers += 1
        if dialogue.reprimes != reprimes:
            note(f"(context re-primed with the last {dialogue.turns_in_context} turns)")
    return answers


# ---------------------------------------------------------------------------------------------
# chat: two checkpoints in dialogue, logged as JSONL
# ---------------------------------------------------------------------------------------------

@dataclass
class Side:
    """One participant of a chat: its model (through a Dialogue), name and sampling."""

    speaker: str
    dialogue: Dialogue
    sampling: Sampling
    checkpoint: dict  # path, global_step, vocab_fingerprint


def checkpoint_info(ckpt) -> dict:
    return {"path": str(Path(ckpt.path).resolve()), "global_step": ckpt.global_step,
            "vocab_fingerprint": ckpt.state.get("vocab_fingerprint")}


def check_same_vocab(path_a, path_b) -> None:
    """Refuse two checkpoints whose vocabulary fingerprints differ (read from state.json before
    any weights are loaded; loading then checks each against this catchat's vocabulary)."""
    from catchat.run import checkpoint as ck

    found = []
    for p in (path_a, path_b):
        d = ck.resolve(p)
        try:
            found.append(json.loads((d / ck.STATE_FILE).read_text()).get("vocab_fingerprint"))
        except (OSError, ValueError, AttributeError):
            found.append(None)  # load_checkpoint reports the damage
    if None not in found and found[0] != found[1]:
        raise UsageError(f"{path_a} and {path_b} were trained with different vocabularies (fingerprints "
                         f"{str(found[0])[:12]}... and {str(found[1])[:12]}...): their token ids mean different "
                         "characters", "pair checkpoints made with the same vocabulary")


def read_chat_log(path: Path) -> tuple[str, list[dict]]:
    """The conversation id and records of an existing chat log (for --append), validated."""
    records = []
    hint = f"--append continues a file written by `catchat chat`; choose another --out than {path}"
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path} line {lineno}: not valid JSON ({e.msg})", hint) from None
            if not isinstance(r, dict) or r.get("format") != CHAT_FORMAT:
                raise UsageError(f"{path} line {lineno} is not a {CHAT_FORMAT} record", hint)
            ok = (isinstance(r.get("conversation"), str) and isinstance(r.get("turn"), int)
                  and isinstance(r.get("speaker"), str) and isinstance(r.get("text"), str))
            if not ok:
                raise UsageError(f"{path} line {lineno}: needs conversation, turn, speaker and text", hint)
            if records and r["conversation"] != records[0]["conversation"]:
                raise UsageError(f"{path} line {lineno} belongs to another conversation "
                                 f"({r['conversation']} after {records[0]['conversation']})", hint)
            records.append(r)
    if not records:
        raise UsageError(f"{path} holds no chat turns", "leave out --append to start a new chat there")
    return records[0]["conversation"], records


def conversation_id(settings: dict) -> str:
    """A chat's id: a hash of its settings, so the same command writes the same file."""
    return "c" + hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def chat(sides: list[Side], turns: int, out: Path, *, append: bool = False, length: int = DEFAULT_TURN_LENGTH,
         seed: int = 0, opening: str | None = None, settings: dict | None = None,
         on_turn_start: Callable[[str], None] | None = None, on_token: Callable[[int], None] | None = None,
         on_turn_end: Callable[[dict], None] | None = None) -> list[dict]:
    """Two sides take `turns` generated turns, A first in a new chat. Every turn is appended to
    `out` as one JSONL record as soon as it is complete. `opening` (a given first line, said by
    whoever's turn it is) is recorded with checkpoint and sampling null and not counted in `turns`.
    With `append`, the records already in `out` prime both models and numbering continues."""
    out = Path(out)
    if out.exists() and out.is_dir():
        raise UsageError(f"--out {out} is a directory", "give a .jsonl file path")
    prior: list[dict] = []
    if append and out.exists() and out.stat().st_size:
        conv, prior = read_chat_log(out)
    elif out.exists() and out.stat().st_size and not append:
        raise UsageError(f"{out} already exists", "pass --append to continue that chat, or choose another --out")
    else:
        conv = conversation_id({"sides": [dict(s.checkpoint, speaker=s.speaker, sampling=s.sampling.describe())
                                          for s in sides], "seed": seed, "opening": opening, **(settings or {})})
    for r in prior:  # both models read the conversation so far (re-primed to their budgets)
        for s in sides:
            s.dialogue.add(r["speaker"], r["text"])
    number = prior[-1]["turn"] if prior else 0
    nxt = 1 if prior and prior[-1]["speaker"] == sides[0].speaker else 0
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    with open(out, "a", encoding="utf-8") as f:

        def record(side_i: int | None, speaker: str, turn: Turn) -> dict:
            nonlocal number
            number += 1
            s = sides[side_i] if side_i is not None else None
            rec = {"format": CHAT_FORMAT, "id": f"{conv}:{number}", "conversation": conv, "turn": number,
                   "speaker": speaker, "text": turn.text, "stop": turn.stop,
                   "checkpoint": s.checkpoint if s else None,
                   "sampling": dict(s.sampling.describe(), seed=seed, length=length) if s else None}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
            written.append(rec)
            if on_turn_end:
                on_turn_end(rec)
            return rec

        if opening is not None and opening.strip():
            speaker = sides[nxt].speaker
            if on_turn_start:
                on_turn_start(speaker)
            turn = None
            for s in sides:
                turn = s.dialogue.add(speaker, opening)
            record(None, speaker, turn)
            nxt = 1 - nxt
        for _ in range(turns):
            me, other = sides[nxt], sides[1 - nxt]
            if on_turn_start:
                on_turn_start(me.speaker)
            turn = me.dialogue.reply(me.speaker, length, me.sampling, derive_seed(seed, nxt, number + 1),
                                     on_token=on_token)
            other.dialogue.add_turn(turn)
            record(nxt, me.speaker, turn)
            nxt = 1 - nxt
    return written
