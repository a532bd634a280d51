"""Run configuration: TOML -> frozen dataclasses, validation, `--set` overrides, resolved TOML.

A config has nine sections: model, data, train, schedule, teacher_forcing, eval, checkpoint, log, distributed (docs/config.md lists
every key with its unit, default and range). Every key has a default; unknown sections and keys,
wrong types and out-of-range values are `UsageError`s that name the key (and the closest valid
key, docs/lessons.md, lesson 9). Keys carry their unit in the name: `*_seqs` (windows of one lane),
`*_steps` (optimizer steps), `cycles` (passes over the train split), `*_fraction` (of the planned
total steps, or of the corpus; with train.time_budget_s, of the budget's training time), `*_s` (seconds).

    cfg = load("configs/tiny.toml", overrides=["train.lr=3e-4"])
    text = resolved_toml(cfg)            # the run dir's config.toml; load(...) of it gives cfg back
    steps = planned_total_steps(cfg, lanes.seqs_per_cycle)
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from catchat.data.lane_order import LANE_ORDERS
from catchat.errors import UsageError
from catchat.exchange import EXCHANGE_DTYPES
from catchat.precision import PRECISIONS, REFUSED

# ---------------------------------------------------------------------------------------------
# Key specs: type, range, unit and a one-line description per key (drives validation and docs)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    """What one config key accepts: its type, an optional range or choice list, unit and doc."""

    kind: type  # int, float, bool or str
    doc: str
    unit: str = ""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # True: value must be > lo (else >= lo)
    hi_open: bool = False  # True: value must be < hi (else <= hi)
    choices: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()  # (value, why): known values refused with their reason

    def range_text(self) -> str:
        """The accepted range in words, e.g. '> 0', 'in [0, 1)', 'one of "adamw", "nadam"'."""
        if self.choices:
            return "one of " + ", ".join(f'"{c}"' for c in self.choices)
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {_num(self.hi)}"
        return "a non-empty string" if self.kind is str else "any value"

    def accepts(self, value) -> bool:
        if self.choices:
            return value in self.choices
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            return False
        if self.hi is not None and (value > self.hi or (self.hi_open and value == self.hi)):
            return False
        if self.kind is str and not value:
            return False
        return True


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


# Upper bounds that keep the run's counters inside the 32-bit words the device and the RNG use:
#  - the optimizer step t (1-based, at most total_steps) goes to the GPU as the uint32 hyper word
#    HP_STEP (vk/kernels/optim.py: np.uint32(t)); 2**32 would wrap to 0 (numpy 2.4 warns, later
#    numpy raises). global_step itself only reaches the GPU through rng.step_seed, which
#    masks global_step * 64 + micro_batch to 32 bits on purpose (docs/model.md): the dropout seeds
#    repeat every 2**26 steps, which is harmless (other data, other weights), not an overflow.
#  - the valid targets of one optimizer step (at most micro_batches * batch_lanes * window) go to
#    the GPU as the uint32 HP_N_VALID and are summed there into the uint32 ST_N_VALID; a count of
#    2**32 would wrap to 0, which the optimizer reads as "no valid targets" and skips the step.
MAX_TOTAL_STEPS = 2**32 - 1
MAX_TOKENS_PER_STEP = 2**32 - 1
# TOML integers are 64-bit (the spec; tomllib accepts more): a larger value would make the run
# dir's resolved config.toml unreadable to other TOML readers.
INT64_MAX = 2**63 - 1


def _key(default, kind, doc, unit="", **range_) -> Any:
    return field(default=default, metadata={"spec": Spec(kind, doc, unit, **range_)})


# ---------------------------------------------------------------------------------------------
# The sections
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelConfig:
    hidden: int = _key(256, int, "GRU hidden size H (also the embedding width)", "units", lo=1, hi=65536)
    layers: int = _key(2, int, "GRU layers L", "layers", lo=1, hi=64)
    tie_embeddings: bool = _key(False, bool, "the output head reuses embedding.weight")
    norm_eps: float = _key(1e-6, float, "RMSNorm epsilon", "", lo=0, hi=1, lo_open=True, hi_open=True)


@dataclass(frozen=True)
class DataConfig:
    corpus: str = _key("shakespeare", str, 'a corpus directory built by `catchat corpus build`, or "shakespeare" (built in, '
                       'cached; "shakespeare:hold-out[=PLAYS]" holds whole plays out for eval)')
    batch_lanes: int = _key(32, int, "B: parallel lanes, each a contiguous stream of whole conversations", "lanes", lo=1, hi=65536)
    window: int = _key(128, int, "T: tokens per window (truncated-BPTT length)", "tokens", lo=1, hi=1 << 20)
    micro_batches: int = _key(1, int, "windows per lane accumulated into one optimizer step", "windows", lo=1, hi=4096)
    carry_state: bool = _key(True, bool, "carry the hidden state from window to window of a lane (stateful truncated BPTT)")
    shuffle_block_windows: int = _key(0, int, "stateless only: shuffle blocks of this many windows per cycle (0 = off)", "windows", lo=0)
    lane_order: str = _key("corpus", str, "how conversations are laid into lanes: corpus order cut into B runs, longest first onto the least-loaded lane, or a permutation per cycle (seeded) cut into B runs",
                           choices=LANE_ORDERS)
    max_conversations: int = _key(0, int, "use only the first N conversations of the corpus (0 = all)", "conversations", lo=0)
    eval_fraction: float = _key(0.05, float, "share of conversations held out for eval (by content hash)", "fraction", lo=0, hi=0.5)
    prefix_dropout: float = _key(0.0, float, "probability that a lane's window has a prefix masked from the loss, the state reset at its end", "probability", lo=0, hi=1)
    prefix_max_fraction: float = _key(0.5, float, "longest masked prefix, as a share of the window", "fraction", lo=0, hi=1, lo_open=True, hi_open=True)


@dataclass(frozen=True)
class TrainConfig:
    optimizer: str = _key("adamw", str, "optimizer", choices=("adamw", "nadam"))
    lr: float = _key(1e-3, float, "peak learning rate (the stable phase of the schedule)", "", lo=0, hi=10, lo_open=True)
    beta1: float = _key(0.9, float, "first-moment decay", "", lo=0, hi=1, hi_open=True)
    beta2: float = _key(0.999, float, "second-moment decay", "", lo=0, hi=1, hi_open=True)
    eps: float = _key(1e-8, float, "optimizer denominator epsilon", "", lo=0, hi=1, lo_open=True)
    weight_decay: float = _key(0.0, float, "decoupled weight decay: p *= 1 - lr * weight_decay (matrices and embedding only)", "", lo=0, hi=1)
    clip: float = _key(1.0, float, "global gradient-norm clip (0 = off)", "L2 norm", lo=0)
    label_smoothing: float = _key(0.0, float, "label smoothing of the training loss", "", lo=0, hi=1, hi_open=True)
    dropout_embedding: float = _key(0.0, float, "embedding dropout (whole rows)", "probability", lo=0, hi=1, hi_open=True)
    dropout_hidden: float = _key(0.0, float, "variational dropout on each layer's GRU output", "probability", lo=0, hi=1, hi_open=True)
    gradh_clamp: float = _key(0.0, float, "per-timestep elementwise clamp of the BPTT hidden-state gradient (0 = off)", "", lo=0)
    spectral_bound: float = _key(0.0, float, "bound on each GRU gate block's spectral norm (0 = off)", "", lo=0)
    seed: int = _key(0, int, "run seed: init, dropout masks, block shuffle", "", lo=0, hi=2**32 - 1)
    total_steps: int = _key(0, int, "planned optimizer steps (set this or cycles, not both; 0 = unset)", "steps",
                            lo=0, hi=MAX_TOTAL_STEPS)
    cycles: float = _key(0.0, float, "planned passes over the train split (set this or total_steps; 0 = unset)", "cycles", lo=0)
    time_budget_s: float = _key(0.0, float, "wall-clock budget, start-up included: the schedule runs on elapsed time and the "
                                "run ends by then with a checkpoint and an eval; total_steps / cycles become optional "
                                "step caps (0 = off)", "seconds", lo=0)
    max_consecutive_skips: int = _key(25, int, "stop the run after this many skipped steps in a row (non-finite gradient or no valid targets)",
                                      "steps", lo=1, hi=10**6)
    precision: str = _key("fp32", str, "GEMM operands: fp32, or fp16 (rounded to float16, float32 sums, dynamic loss "
                          "scaling; buffers stay float32)", choices=PRECISIONS, refused=tuple(REFUSED.items()))


@dataclass(frozen=True)
class ScheduleConfig:
    warmup_fraction: float = _key(0.02, float, "linear warmup, share of total_steps (or of the time budget's training time)", "fraction", lo=0, hi=1)
    cooldown_fraction: float = _key(0.1, float, "cooldown to lr_min at the end, share of total_steps (or of the time budget's training time)", "fraction", lo=0, hi=1)
    cooldown_shape: str = _key("cosine", str, "shape of the cooldown", choices=("cosine", "linear"))
    lr_min: float = _key(0.0, float, "learning rate at the end of the cooldown (<= train.lr)", "", lo=0)


@dataclass(frozen=True)
class EvalConfig:
    eval_every_seqs: int = _key(0, int, "evaluate each time the seqs count crosses a multiple of this (0 = off)", "seqs", lo=0)
    eval_windows: int = _key(16, int, "held-out windows (of B lanes) per eval, from the eval split's start (0 = all)", "windows", lo=0)
    free_running: bool = _key(True, bool, "also evaluate free-running (teacher forcing 0: the model's own argmax fed back)")
    # hi: three samples per eval, one stream each, decoded at batch 1 (~3-40k chars/s: lavapipe to
    # an H200, docs/generation.md): 10**6 characters add minutes to every eval, more would stall training
    sample_chars: int = _key(200, int, "characters of each sample saved per eval in samples/ (greedy, T 0.5, T 0.8; 0 = none)", "characters",
                             lo=0, hi=10**6)


@dataclass(frozen=True)
class CheckpointConfig:
    checkpoint_every_seqs: int = _key(0, int, "checkpoint each time the seqs count crosses a multiple of this (0 = off)", "seqs", lo=0)
    keep_last: int = _key(3, int, "checkpoints kept on disk, newest first (0 = keep all)", "checkpoints", lo=0)


@dataclass(frozen=True)
class LogConfig:
    tensorboard: bool = _key(True, bool, "also write TensorBoard event files to RUN/tensorboard/ (needs tensorboardX: pip install 'catchat[live]'; "
                             "without it the run says so once and trains on)")


@dataclass(frozen=True)
class TeacherForcingConfig:
    start: float = _key(1.0, float, "teacher forcing at the start: probability that an input is the data's token", "probability", lo=0, hi=1)
    floor: float = _key(0.7, float, "teacher forcing never decays below this", "probability", lo=0, hi=1)
    schedule: str = _key("constant", str, "decay shape from start to floor over decay_cycles (constant = stay at start)",
                         choices=("constant", "linear", "exponential", "inverse_sigmoid"))
    hold_cycles: float = _key(0.0, float, "cycles at start before the decay begins", "cycles", lo=0)
    decay_cycles: float = _key(1.0, float, "cycles the decay takes (linear reaches floor; the others ~1% above it)", "cycles", lo=0, lo_open=True)
    choice: str = _key("argmax", str, "the fed-back token: the model's argmax or a sample from its top_k", choices=("argmax", "topk"))
    top_k: int = _key(5, int, "k for choice = \"topk\"", "tokens", lo=1, hi=16)


@dataclass(frozen=True)
class DistributedConfig:  # several ranks only (docs/distributed.md); a single process ignores it
    overlap: bool = _key(True, bool, "exchange each backward layer group's gradient while the GPU runs the groups below it")
    exchange_dtype: str = _key("fp32", str, "what the gradient exchange moves: float32, or float16 scaled by a power of two "
                               "per block (the sums stay float32)", choices=EXCHANGE_DTYPES)
    hierarchical: bool = _key(False, bool, "sum within each host first, then across the hosts (the same number of ranks "
                              "on every host)")


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    teacher_forcing: TeacherForcingConfig = field(default_factory=TeacherForcingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]


def key_specs() -> dict[str, dict[str, tuple[Spec, Any]]]:
    """section -> key -> (Spec, default), in file order (what docs/config.md documents)."""
    return {
        sec: {f.name: (f.metadata["spec"], f.default) for f in dataclasses.fields(cls)}
        for sec, cls in SECTIONS.items()
    }


_SPECS = key_specs()
_ALL_KEYS = [f"{s}.{k}" for s, keys in _SPECS.items() for k in keys]


# ---------------------------------------------------------------------------------------------
# Loading and validation
# ---------------------------------------------------------------------------------------------

def load(path: str | Path, overrides: Iterable[str] = ()) -> Config:
    """Read a TOML config, apply `--set section.key=value` overrides, validate, return a Config."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"config file {path} does not exist", "pass an existing .toml file, e.g. configs/tiny.toml") from None
    except OSError as e:
        raise UsageError(f"cannot read config file {path}: {e.strerror}", "check the path and its permissions") from None
    return loads(raw.decode("utf-8", errors="replace"), source=str(path), overrides=overrides)


def loads(text: str, *, source: str = "<string>", overrides: Iterable[str] = ()) -> Config:
    """Parse TOML text (see `load`). `source` names the text in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{source} is not valid TOML: {e}", "fix the syntax at the line it names") from None
    origins: dict[tuple[str, str], str] = {}
    for item in overrides:
        section, key, value = parse_override(item)
        data.setdefault(section, {})
        if not isinstance(data[section], dict):
            raise UsageError(f"{source}: [{section}] must be a table", f"write it as a [{section}] section")
        data[section][key] = value
        origins[(section, key)] = f"--set {_shown(item)}"
    return from_dict(data, source=source, origins=origins)


def parse_override(item: str) -> tuple[str, str, Any]:
    """Split `section.key=value`; the value is read as a TOML value (a bare word is a string)."""
    name, sep, text = item.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not section or not key or "." in key:
        raise UsageError(f"--set expects section.key=value, got {item!r}", "e.g. --set train.lr=0.0005")
    section, key, text = section.strip(), key.strip(), text.strip()
    _check_name(section, key, f"--set {_shown(item)}")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        spec = _SPECS[section][key][0]
        if spec.kind is not str or not text:
            raise UsageError(f"--set {_shown(item)}: {text!r} is not a TOML value",
                             f"{section}.{key} takes {_kind_name(spec.kind)}, e.g. {_example(section, key)}") from None
        value = text  # a bare word for a string key: --set data.corpus=shakespeare
    return section, key, value


def from_dict(data: dict, *, source: str = "<dict>", origins: dict | None = None) -> Config:
    """Validate a parsed TOML document (section -> key -> value) and build the Config."""
    origins = origins or {}
    cfg = Config(**_sections(data, source, origins))
    _check_cross(cfg, source, origins)
    return cfg


def load_values(path: str | Path) -> dict[str, dict[str, Any]]:
    """section -> key -> value of a config file (every key: defaults where the file sets none), each
    key checked on its own but not the rules across keys: --set may complete a file. A resume compares
    it with the file as the run last read it (catchat/training/plan.py)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"cannot read config file {path}: {e.strerror}", "check the path and its permissions") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path} is not valid TOML: {e}", "fix the syntax at the line it names") from None
    return to_dict(Config(**_sections(data, str(path), {})))


def _sections(data: dict, source: str, origins: dict) -> dict[str, Any]:
    """section name -> its validated dataclass, for the sections `data` has (each key checked alone)."""
    sections = {}
    for section, body in data.items():
        if section not in SECTIONS:
            if not isinstance(body, dict):  # a top-level key outside any section
                hint = _suggest_key(section, None)
                raise UsageError(f"{source}: unknown top-level key {section!r} (every key belongs to a section)", hint)
            raise UsageError(f"{source}: unknown section [{_shown(section)}]", _suggest_section(section))
        if not isinstance(body, dict):
            raise UsageError(f"{source}: {section} must be a [{section}] section, got a {_type_name(body)}",
                             f"write it as [{section}] followed by its keys")
        values = {}
        for key, value in body.items():
            where = origins.get((section, key), source)
            _check_name(section, key, where)
            values[key] = _check_value(section, key, value, where)
        sections[section] = SECTIONS[section](**values)
    return sections


def _check_name(section: str, key: str, where: str) -> None:
    if section not in SECTIONS:
        raise UsageError(f"{where}: unknown section [{_shown(section)}]", _suggest_section(section))
    if key not in _SPECS[section]:
        raise UsageError(f"{where}: unknown key {section}.{_shown(key)}", _suggest_key(key, section))


def _shown(name: str) -> str:
    """A user-given name as it can be shown on one line (control characters escaped)."""
    return name if name.isprintable() else repr(name)[1:-1]


def _suggest_section(name: str) -> str:
    close = difflib.get_close_matches(name, list(SECTIONS), n=1, cutoff=0.5)
    valid = "valid sections: " + ", ".join(SECTIONS)
    return f"did you mean [{close[0]}]? {valid}" if close else valid


def _suggest_key(key: str, section: str | None) -> str:
    """The closest valid key: first within the section, then anywhere (a key in the wrong section)."""
    if section is not None:
        close = difflib.get_close_matches(key, list(_SPECS[section]), n=1, cutoff=0.6)
        if close:
            return f"did you mean {section}.{close[0]}?"
    by_key = {k.split(".", 1)[1]: k for k in _ALL_KEYS}
    close = difflib.get_close_matches(key, list(by_key), n=1, cutoff=0.6)
    if close:
        return f"did you mean {by_key[close[0]]}?"
    if section is not None:
        return f"valid keys in [{section}]: " + ", ".join(_SPECS[section])
    return "valid sections: " + ", ".join(SECTIONS)


def _type_name(value) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", dict: "table", list: "array"}.get(
        type(value), type(value).__name__)


def _kind_name(kind: type) -> str:
    return {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}[kind]


def _example(section: str, key: str) -> str:
    spec, default = _SPECS[section][key]
    return f"{key} = {_toml_value(spec.choices[0] if spec.choices else default)}"


def _check_value(section: str, key: str, value, where: str):
    spec, _ = _SPECS[section][key]
    name = f"{section}.{key}"
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[spec.kind]
    if not ok:
        shown = json.dumps(value) if isinstance(value, (str, bool, int, float)) else _type_name(value)
        raise UsageError(f"{where}: {name} must be {_kind_name(spec.kind)}, got {_type_name(value)} {shown}",
                         f"e.g. {_example(section, key)}")
    if spec.kind is float:
        value = float(value)
        if not math.isfinite(value):
            raise UsageError(f"{where}: {name} must be a finite number, got {value}", f"e.g. {_example(section, key)}")
    why = dict(spec.refused).get(value)
    if why:
        raise UsageError(f"{where}: {name} = {_toml_value(value)} is not supported: {why}",
                         f"{name}: {spec.range_text()}")
    if not spec.accepts(value):
        hint = f"{name}: {spec.doc}" + (f" ({spec.unit})" if spec.unit else "")
        close = difflib.get_close_matches(value, spec.choices, n=1, cutoff=0.5) if spec.choices else []
        if close:
            hint = f'did you mean {name} = "{close[0]}"? ({hint})'
        raise UsageError(f"{where}: {name} must be {spec.range_text()}, got {_toml_value(value)}", hint)
    if spec.kind is int and not -INT64_MAX - 1 <= value <= INT64_MAX:  # keys without an upper bound
        raise UsageError(f"{where}: {name} must be {spec.range_text()} and fit in 64 bits (TOML's integer range), "
                         f"got {value}", f"{name}: {spec.doc}" + (f" ({spec.unit})" if spec.unit else ""))
    return value


def _check_cross(cfg: Config, source: str, origins: dict) -> None:
    """Rules that involve more than one key."""

    def where(*keys: str) -> str:
        for k in keys:
            s, _, n = k.partition(".")
            if (s, n) in origins:
                return origins[(s, n)]
        return source

    d, t, s = cfg.data, cfg.train, cfg.schedule
    if d.carry_state and d.shuffle_block_windows > 0:
        raise UsageError(
            f"{where('data.shuffle_block_windows', 'data.carry_state')}: data.shuffle_block_windows = "
            f"{d.shuffle_block_windows} with data.carry_state = true: stateful truncated BPTT needs contiguous "
            "windows; shuffling would feed one conversation's hidden state into another (docs/lessons.md, lesson 5)",
            "set data.shuffle_block_windows = 0, or data.carry_state = false to train stateless")
    if t.total_steps > 0 and t.cycles > 0 or t.total_steps == 0 and t.cycles == 0 and t.time_budget_s == 0:
        both = t.total_steps > 0
        raise UsageError(
            f"{where('train.total_steps', 'train.cycles')}: "
            + ("both train.total_steps and train.cycles are set" if both else "neither train.total_steps nor train.cycles is set")
            + ": the run length needs exactly one of them (or a train.time_budget_s)",
            "set the other one to 0 (e.g. --set train.cycles=0)" if both else
            "e.g. train.total_steps = 1000, train.cycles = 2 or train.time_budget_s = 300")
    if t.cycles / seqs_per_step(cfg) > MAX_TOTAL_STEPS:  # a cycle is at least one seq: surely too long
        raise UsageError(
            f"{where('train.cycles')}: train.cycles = {t.cycles:g} plans more than {MAX_TOTAL_STEPS} optimizer steps",
            f"the step count is a 32-bit word on the GPU: plan at most {MAX_TOTAL_STEPS} steps")
    if seqs_per_step(cfg) * d.window > MAX_TOKENS_PER_STEP:
        raise UsageError(
            f"{where('data.micro_batches', 'data.batch_lanes', 'data.window')}: data.micro_batches * data.batch_lanes * "
            f"data.window = {seqs_per_step(cfg) * d.window} tokens per optimizer step exceeds {MAX_TOKENS_PER_STEP} "
            "(the step's valid-target count is a 32-bit word on the GPU)",
            "lower data.micro_batches, data.batch_lanes or data.window")
    if s.warmup_fraction + s.cooldown_fraction > 1:
        raise UsageError(
            f"{where('schedule.warmup_fraction', 'schedule.cooldown_fraction')}: schedule.warmup_fraction + "
            f"schedule.cooldown_fraction = {s.warmup_fraction + s.cooldown_fraction:g} exceeds 1",
            "make the two phases fit in the run, e.g. warmup_fraction = 0.02, cooldown_fraction = 0.1")
    if s.lr_min > t.lr:
        raise UsageError(
            f"{where('schedule.lr_min', 'train.lr')}: schedule.lr_min = {s.lr_min:g} exceeds train.lr = {t.lr:g}",
            "the cooldown goes down to lr_min: set it at or below train.lr (e.g. lr / 10)")


# ---------------------------------------------------------------------------------------------
# Derived quantities
# ---------------------------------------------------------------------------------------------

def seqs_per_step(cfg: Config) -> int:
    """Seqs (windows of one lane) one optimizer step consumes: micro_batches * batch_lanes."""
    return cfg.data.micro_batches * cfg.data.batch_lanes


def planned_total_steps(cfg: Config, seqs_per_cycle: int) -> int:
    """The run's planned optimizer steps: train.total_steps, or train.cycles converted through
    `seqs_per_cycle` (from `Lanes.seqs_per_cycle`), rounded up to whole steps (at least 1, at
    most MAX_TOTAL_STEPS: a UsageError names train.cycles beyond it). With a time budget these
    are a step cap, and 0 (neither set) means none: the budget alone plans the run."""
    if cfg.train.total_steps > 0:
        return cfg.train.total_steps
    if cfg.train.cycles == 0 and cfg.train.time_budget_s > 0:
        return 0
    if seqs_per_cycle <= 0:
        raise UsageError("the train split has no windows, so train.cycles cannot be turned into steps",
                         "use a larger corpus or set train.total_steps")
    steps = cfg.train.cycles * seqs_per_cycle / seqs_per_step(cfg)  # float: huge cycles give inf, not an error
    if not steps <= MAX_TOTAL_STEPS:
        raise UsageError(f"train.cycles = {cfg.train.cycles:g} of {seqs_per_cycle} seqs each plans "
                         f"{steps:.3g} optimizer steps, more than {MAX_TOTAL_STEPS}",
                         f"the step count is a 32-bit word on the GPU: lower train.cycles to at most "
                         f"{MAX_TOTAL_STEPS * seqs_per_step(cfg) / seqs_per_cycle:.6g}")
    return max(1, math.ceil(steps - 1e-9))


def model_spec(cfg: Config, vocab_size: int = 101):
    """The architecture part of the config as catchat.model.ModelSpec."""
    from catchat.model import ModelSpec

    m = cfg.model
    return ModelSpec(vocab_size=vocab_size, hidden=m.hidden, layers=m.layers,
                     tie_embeddings=m.tie_embeddings, norm_eps=m.norm_eps)


def to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    """section -> key -> value (plain Python values; JSON-able, e.g. for state.json)."""
    return {sec: dataclasses.asdict(getattr(cfg, sec)) for sec in SECTIONS}


def budget_overrides(time_budget: float | None, overrides) -> list[str]:
    """`--time-budget S` as overrides: the budget and no step plan first, so that the user's own `--set`
    of a step cap comes after them and wins (`catchat train`, the speedrun's PyTorch row)."""
    if time_budget is None:
        return list(overrides)
    return [f"train.time_budget_s={time_budget!r}", "train.total_steps=0", "train.cycles=0", *overrides]


def with_changes(cfg: Config, **changes: dict[str, Any]) -> Config:
    """A validated copy with some keys changed: with_changes(cfg, train={"lr": 3e-4})."""
    data = to_dict(cfg)
    for section, keys in changes.items():
        data.setdefault(section, {}).update(keys)
    return from_dict(data, source="with_changes()")


# ---------------------------------------------------------------------------------------------
# Writing back
# ---------------------------------------------------------------------------------------------

def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write non-finite float {value} to TOML")
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=True)  # JSON string escapes are valid TOML basic-string escapes
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def resolved_toml(cfg: Config, header: str = "") -> str:
    """The fully resolved config as TOML (every key, with its unit and doc as a comment).
    `loads(resolved_toml(cfg)) == cfg`."""
    from catchat import __version__

    lines = [f"# catchat {__version__}: resolved run config (every key; see docs/config.md)"]
    lines += [f"# {line}" for line in header.splitlines()]
    for section, keys in _SPECS.items():
        lines += ["", f"[{section}]"]
        values = getattr(cfg, section)
        for key, (spec, _) in keys.items():
            text = f"{key} = {_toml_value(getattr(values, key))}"
            unit = f" [{spec.unit}]" if spec.unit else ""
            lines.append(f"{text:<34} # {spec.doc}{unit}")
    return "\n".join(lines) + "\n"
