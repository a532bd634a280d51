"""What a run trains with: on a fresh start the CONFIG file and its --set overrides; on a resume the
plan the run recorded, changed only where the command line says so.

A run's plan is its resolved config as its checkpoint recorded it (state.json "config": the config
file with the overrides of the commands that started and resumed it). A resume continues that plan,
whatever the CONFIG file given now says, except where
- `--set SECTION.KEY=VALUE` (or --time-budget, --precision) on the resume command changes a key;
- the CONFIG file was edited since the run last read it (state.json "config_file": the file's values
  then, without overrides): that is refused, unless `--use-config-file` adopts the edited keys.
Every key that changes is printed (`changed: train.total_steps 40 -> 300`) and recorded in a
`plan_change` event; docs/training.md "Changing the plan on resume" says what the schedule does then.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from catchat import config as cfgmod
from catchat.errors import UsageError
from catchat.run import checkpoint as ck
from catchat.training.budget import keep_budget

# Keys a resume never changes that no later check refuses by itself: the size of a step
# (data.micro_batches: seqs and tokens per step, the unit every step count is in) and the model's
# function (model.norm_eps). The model's shapes, data.batch_lanes, the data layout (corpus, split,
# window, shuffling, lane order) and train.optimizer are refused where the checkpoint is loaded, each with its reason.
FIXED_KEYS = ("model.norm_eps", "data.micro_batches")
BY_COMMAND_LINE, BY_CONFIG_FILE, BY_CALLER = "command line", "config file", "config"
SHOWN_CHANGES = 6  # keys named in one message; the rest are counted


@dataclass(frozen=True)
class ConfigSource:
    """The config a command line gives: the CONFIG file, its overrides (--set, then --time-budget's and
    --precision's, as catchat/cli/training.py orders them) and --use-config-file."""

    path: str
    overrides: tuple[str, ...] = ()
    use_config_file: bool = False

    @classmethod
    def read(cls, path, overrides=(), use_config_file: bool = False) -> ConfigSource:
        """Check the file's keys and the overrides' names and values now, before any device work."""
        source = cls(str(path), tuple(overrides), use_config_file)
        cfgmod.load_values(source.path)
        for item in source.overrides:
            cfgmod.parse_override(item)
        return source

    def fresh(self) -> cfgmod.Config:
        """A new run's config: the file with the overrides, every rule checked."""
        return cfgmod.load(self.path, self.overrides)


@dataclass
class Plan:
    """A start's config and how it came about."""

    cfg: cfgmod.Config
    file_values: dict  # the config file's values without overrides: an edit is measured against them
    changes: list[tuple[str, Any, Any, str]] = field(default_factory=list)  # (section.key, old, new, by)
    notes: list[str] = field(default_factory=list)  # lines for the console before the run starts

    def event(self, old_schedule: dict | None, new_schedule: dict) -> dict | None:
        """The plan_change event's fields (None when nothing changed): each key's old and new value and
        what changed it, and the schedule's planned steps and next lr where they moved."""
        if not self.changes:
            return None
        moved = {k: {"old": (old_schedule or {}).get(k), "new": new_schedule.get(k)} for k in ("total_steps", "lr_next")
                 if k in new_schedule and (old_schedule or {}).get(k) != new_schedule.get(k)}
        return {"changes": {k: {"old": old, "new": new, "by": by} for k, old, new, by in self.changes},
                "schedule": moved}


def fresh_plan(source: ConfigSource | None, cfg: cfgmod.Config | None) -> Plan:
    """A new run: the command line's config (or the caller's, which is then also its file's values)."""
    if source is None:
        return Plan(cfg, cfgmod.to_dict(cfg))
    return Plan(source.fresh() if cfg is None else cfg, cfgmod.load_values(source.path))


def resume_plan(source: ConfigSource | None, cfg: cfgmod.Config | None, ckpt: ck.Checkpoint, report) -> Plan:
    """The plan a resume from `ckpt` trains with. source None (the Python API): the caller's `cfg` is the
    whole plan, every difference from the recorded config a change (a budget the caller leaves out is
    kept: catchat/training/budget.py keep_budget)."""
    # load_checkpoint checked the recorded config; made whole here (an older catchat's lacks later keys)
    recorded = cfgmod.to_dict(cfgmod.from_dict(ckpt.state["config"], source=str(ckpt.path / ck.STATE_FILE)))
    if source is None:
        cfg = keep_budget(cfg, ckpt, report)
        plan = Plan(cfg, cfgmod.to_dict(cfg), [(k, old, new, BY_CALLER) for k, (old, new)
                                                 in differences(recorded, cfgmod.to_dict(cfg)).items()])
    else:
        plan = _command_line_plan(source, recorded, ckpt)
    fixed = [c for c in plan.changes if c[0] in FIXED_KEYS]
    if fixed:
        raise UsageError(f"{ckpt.path}: the config does not match the model config and step size the run was "
                         f"trained with: {listed([c[:3] for c in fixed])}",
                         hint="a resumed run keeps its model and data.micro_batches: start a new run (another "
                              "--run-dir) to change them")
    return plan


def _command_line_plan(source: ConfigSource, recorded: dict, ckpt: ck.Checkpoint) -> Plan:
    """The recorded config, with the config file's edits (adopted by --use-config-file, else refused)
    and then the overrides on top."""
    now = cfgmod.load_values(source.path)
    then = ckpt.state.get("config_file")
    known = isinstance(then, dict)  # a checkpoint of an older catchat does not say what the file said
    parsed = [cfgmod.parse_override(item) for item in source.overrides]
    set_keys = {f"{s}.{k}" for s, k, _ in parsed}
    edited = {k: (old, new) for k, (old, new) in differences(then if known else recorded, now).items()
              if k not in set_keys and new != _value(recorded, k)}
    base, by, notes = copy.deepcopy(recorded), {}, []
    if edited and source.use_config_file:
        for k, (_, new) in edited.items():
            section, key = k.split(".")
            base[section][key] = new
            by[k] = BY_CONFIG_FILE
    elif edited and known:
        raise UsageError(f"{source.path} was edited since the run last read it: {listed(edited)}",
                         hint="a resume continues the run's recorded config: pass --set SECTION.KEY=VALUE for a "
                              "change you mean, or --use-config-file to adopt the edited file")
    elif edited:
        notes.append(f"{source.path} differs from the config the run recorded (recorded -> file: {listed(edited)}): "
                     "the recorded values are kept; --set or --use-config-file changes them")
    origins = {}
    for item, (section, key, value) in zip(source.overrides, parsed):
        base.setdefault(section, {})[key] = value
        origins[(section, key)] = f"--set {item}"
        by[f"{section}.{key}"] = BY_COMMAND_LINE
    cfg = cfgmod.from_dict(base, source=f"the config recorded in {ckpt.path / ck.STATE_FILE}", origins=origins)
    changes = [(k, old, new, by.get(k, BY_COMMAND_LINE))
               for k, (old, new) in differences(recorded, cfgmod.to_dict(cfg)).items()]
    budget = _value(recorded, "train.time_budget_s")
    if budget and "train.time_budget_s" not in {c[0] for c in changes}:
        notes.append(f"the checkpoint's time budget of {budget:g} s is kept (and its step cap, if any): "
                     "pass --time-budget to change it")
    return Plan(cfg, now, changes, notes)


def differences(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """section.key -> (old, new) for every config key whose value differs (absent: None)."""
    out = {}
    for section, keys in cfgmod.key_specs().items():
        for key in keys:
            a, b = _value(old, f"{section}.{key}"), _value(new, f"{section}.{key}")
            if a != b or type(a) is not type(b):
                out[f"{section}.{key}"] = (a, b)
    return out


def _value(values: dict, name: str):
    """values[section][key] of a section.key name, None where a level is missing or not a table."""
    section, key = name.split(".")
    table = values.get(section) if isinstance(values, dict) else None
    return table.get(key) if isinstance(table, dict) else None


def shown(value) -> str:
    """A config value as TOML writes it (None: absent)."""
    if value is None:
        return "(absent)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return json.dumps(value) if isinstance(value, str) else str(value)


def listed(changes) -> str:
    """'train.total_steps 40 -> 300, ...' for (key, old, new) triples or a {key: (old, new)} map."""
    items = list(changes.items()) if isinstance(changes, dict) else [(k, (o, n)) for k, o, n in changes]
    words = [f"{k} {shown(o)} -> {shown(n)}" for k, (o, n) in items[:SHOWN_CHANGES]]
    more = len(items) - SHOWN_CHANGES
    return ", ".join(words) + (f" and {more} more" if more > 0 else "")
