"""Config: the shipped configs, round trips, --set overrides and every error path (lesson 9)."""

import dataclasses
import math
import tomllib
from pathlib import Path

import pytest

from catchat import config
from catchat.errors import UsageError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
MINIMAL = "[train]\ntotal_steps = 100\n"


def usage_error(text: str, overrides=()) -> UsageError:
    with pytest.raises(UsageError) as info:
        config.loads(text, source="t.toml", overrides=overrides)
    e = info.value
    assert e.exit_code == 2
    assert "\n" not in e.message and e.hint and "\n" not in e.hint  # one line + one fix line
    return e


@pytest.mark.parametrize("name", ["tiny", "catchat-v3", "catchat-v5", "speedrun"])
def test_shipped_configs_load_and_round_trip(name):
    cfg = config.load(CONFIGS / f"{name}.toml")
    text = config.resolved_toml(cfg)
    assert config.loads(text) == cfg
    assert tomllib.loads(text)["model"]["hidden"] == cfg.model.hidden


def test_v3_and_v5_recipes():
    v3 = config.load(CONFIGS / "catchat-v3.toml")
    assert (v3.model.hidden, v3.model.layers, v3.data.batch_lanes, v3.data.window) == (512, 3, 64, 1024)
    t, s = v3.train, v3.schedule
    assert (t.optimizer, t.lr, t.label_smoothing, t.dropout_hidden, t.dropout_embedding, t.clip, t.weight_decay) == \
        ("nadam", 1e-3, 0.1, 0.15, 0.10, 1.0, 0.1)
    assert (s.warmup_fraction, s.cooldown_fraction, s.cooldown_shape, s.lr_min) == (0.02, 0.10, "cosine", 1e-4)
    assert v3.data.carry_state and v3.data.shuffle_block_windows == 0
    v5 = config.load(CONFIGS / "catchat-v5.toml")
    assert (v5.model.hidden, v5.data.batch_lanes) == (2048, 32)
    assert v5.train == config.TrainConfig(**{**config.to_dict(v3)["train"], "seed": v5.train.seed})
    assert v5.schedule == v3.schedule and v5.model.layers == v3.model.layers and v5.data.window == v3.data.window


def test_speedrun_recipe_is_v3_budgeted_on_held_out_plays():
    """configs/speedrun.toml (docs/speedrun.md): v3's width and data shape at 4 layers (the 300 s runs'
    pick), 300 s of wall clock, and a final eval over all of the held-out plays, none of which is trained on."""
    v3, run = config.load(CONFIGS / "catchat-v3.toml"), config.load(CONFIGS / "speedrun.toml")
    assert run.model == dataclasses.replace(v3.model, layers=4)
    assert (run.data.batch_lanes, run.data.window) == (v3.data.batch_lanes, v3.data.window)
    assert run.train.time_budget_s == 300 and run.train.total_steps == 0
    assert run.data.corpus == "shakespeare:hold-out" and run.data.eval_fraction == 0.0
    assert run.eval.eval_windows == 0 and not run.eval.free_running


def test_tiny_is_small():
    tiny = config.load(CONFIGS / "tiny.toml")
    m, d = tiny.model, tiny.data
    flop_per_token = 6 * (m.layers * 6 * m.hidden ** 2 + 2 * 101 * m.hidden)
    total = flop_per_token * d.batch_lanes * d.window * d.micro_batches * tiny.train.total_steps
    assert total < 400e9  # a few minutes at 1-3 GFLOP/s on lavapipe
    assert d.corpus == "shakespeare" and tiny.train.total_steps >= 200


def test_defaults_and_minimal_file():
    cfg = config.loads(MINIMAL)
    assert cfg.model == config.ModelConfig() and cfg.train.total_steps == 100
    assert cfg.model.norm_eps == 1e-6 and cfg.data.corpus == "shakespeare"


def test_round_trip_every_value_type():
    cfg = config.loads(MINIMAL, overrides=["data.corpus=some dir/with \"quotes\" and \\ é", "model.norm_eps=1e-7",
                                          "train.lr=0.00025", "model.tie_embeddings=true", "train.seed=4294967295"])
    assert cfg.data.corpus == 'some dir/with "quotes" and \\ é'
    assert config.loads(config.resolved_toml(cfg)) == cfg


def test_int_accepted_for_float_key():
    cfg = config.loads("[train]\ncycles = 2\nclip = 1\n")
    assert cfg.train.cycles == 2.0 and isinstance(cfg.train.cycles, float) and isinstance(cfg.train.clip, float)


# --- unknown names: the closest valid key is named ----------------------------------------------

def test_unknown_key_names_closest():
    e = usage_error(MINIMAL + "lerning_rate = 0.1\nlr_ = 1\n")
    assert "unknown key train.lerning_rate" in e.message and "t.toml" in e.message
    e = usage_error(MINIMAL + "learning_rat = 0.1\n")
    assert "train.learning_rat" in e.message
    e = usage_error("[data]\nbatch_lane = 4\n" + MINIMAL)
    assert e.hint == "did you mean data.batch_lanes?"


def test_key_in_wrong_section_points_to_its_section():
    e = usage_error(MINIMAL + "warmup_fraction = 0.1\n")
    assert "unknown key train.warmup_fraction" in e.message and "schedule.warmup_fraction" in e.hint


def test_unknown_section():
    e = usage_error(MINIMAL + "[optimiser]\nlr = 1\n")
    assert "unknown section [optimiser]" in e.message
    e = usage_error(MINIMAL + "[schedul]\n")
    assert "[schedule]" in e.hint
    e = usage_error('name = "x"\n' + MINIMAL)
    assert "top-level key" in e.message


def test_section_must_be_table():
    e = usage_error("model = 3\n" + MINIMAL)
    assert "[model]" in e.message


# --- types and ranges ----------------------------------------------------------------------------

@pytest.mark.parametrize("line,needle", [
    ('[train]\ntotal_steps = 10\nlr = "0.001"', "train.lr must be a number, got string"),
    ("[data]\nwindow = 64.0\n" + MINIMAL, "data.window must be a whole number, got number"),
    ("[data]\ncarry_state = 1\n" + MINIMAL, "data.carry_state must be true or false, got integer"),
    ("[model]\nhidden = true\n" + MINIMAL, "model.hidden must be a whole number, got boolean"),
    ("[train]\ntotal_steps = 10\noptimizer = 3", "train.optimizer must be a string"),
    ("[data]\ncorpus = [1]\n" + MINIMAL, "data.corpus must be a string, got array"),
    ("[train]\ntotal_steps = 10\nlr = nan", "train.lr must be a finite number"),
])
def test_wrong_types(line, needle):
    assert needle in usage_error(line).message


@pytest.mark.parametrize("key,value,needle", [
    ("train.lr", "-0.001", "train.lr must be in (0, 10], got -0.001"),
    ("train.lr", "0", "train.lr must be in (0, 10]"),
    ("data.window", "0", "data.window must be in [1, 1048576], got 0"),
    ("data.batch_lanes", "0", "data.batch_lanes must be in [1, 65536]"),
    ("train.dropout_hidden", "1.0", "train.dropout_hidden must be in [0, 1), got 1.0"),
    ("train.dropout_embedding", "-0.1", "train.dropout_embedding must be in [0, 1)"),
    ("train.beta2", "1", "train.beta2 must be in [0, 1)"),
    ("train.label_smoothing", "1", "train.label_smoothing"),
    ("model.layers", "0", "model.layers must be in [1, 64]"),
    ("model.norm_eps", "0", "model.norm_eps must be in (0, 1)"),
    ("data.eval_fraction", "0.6", "data.eval_fraction must be in [0, 0.5]"),
    ("data.micro_batches", "0", "data.micro_batches"),
    ("train.clip", "-1", "train.clip must be >= 0"),
    ("train.seed", "-1", "train.seed"),
    ("train.optimizer", '"sgd"', 'train.optimizer must be one of "adamw", "nadam", got "sgd"'),
    ("schedule.cooldown_shape", '"cos"', 'schedule.cooldown_shape must be one of "cosine", "linear"'),
    ("data.lane_order", '"random"',
     'data.lane_order must be one of "corpus", "longest_first", "shuffle", got "random"'),
    ("eval.eval_every_seqs", "-5", "eval.eval_every_seqs must be >= 0"),
    ("checkpoint.keep_last", "-1", "checkpoint.keep_last"),
    ("data.corpus", '""', "data.corpus must be a non-empty string"),
])
def test_out_of_range_values_name_the_key(key, value, needle):
    section, name = key.split(".")
    body = f"[{section}]\n{name} = {value}\n"
    e = usage_error(body + ("total_steps = 100\n" if section == "train" else MINIMAL))
    assert needle in e.message
    assert key in e.hint  # the fix line says what the key is


def test_stateful_shuffle_refused_with_reason():
    e = usage_error("[data]\ncarry_state = true\nshuffle_block_windows = 4\n" + MINIMAL)
    assert "shuffle_block_windows" in e.message and "lesson 5" in e.message and "another" in e.message
    assert "carry_state = false" in e.hint
    cfg = config.loads("[data]\ncarry_state = false\nshuffle_block_windows = 4\n" + MINIMAL)
    assert cfg.data.shuffle_block_windows == 4


def test_exactly_one_of_total_steps_and_cycles():
    assert "neither" in usage_error("[train]\nlr = 0.1\n").message
    e = usage_error("[train]\ntotal_steps = 5\ncycles = 1\n")
    assert "both" in e.message and "=0" in e.hint
    assert config.loads("[train]\ncycles = 1.5\n").train.cycles == 1.5


def test_schedule_cross_checks():
    assert "exceeds 1" in usage_error("[schedule]\nwarmup_fraction = 0.6\ncooldown_fraction = 0.5\n" + MINIMAL).message
    assert "lr_min" in usage_error("[schedule]\nlr_min = 0.1\n[train]\nlr = 0.01\ntotal_steps = 3\n").message


def test_invalid_toml_and_missing_file(tmp_path):
    assert "not valid TOML" in usage_error("[train\nlr = 1").message
    with pytest.raises(UsageError, match="does not exist"):
        config.load(tmp_path / "nope.toml")
    p = tmp_path / "c.toml"
    p.write_text("[train]\ntotal_steps = 7\n[model]\nhiden = 3\n")
    with pytest.raises(UsageError, match=r"c\.toml: unknown key model\.hiden") as info:
        config.load(p)
    assert info.value.hint == "did you mean model.hidden?"


# --- --set overrides ------------------------------------------------------------------------------

def test_overrides_parse_toml_values():
    cfg = config.loads(MINIMAL, overrides=["train.lr=5e-4", "data.carry_state=false", "data.shuffle_block_windows=8",
                                          "data.corpus=corpora/chat", 'train.optimizer="nadam"', "model.hidden = 96"])
    assert cfg.train.lr == 5e-4 and cfg.data.carry_state is False and cfg.data.shuffle_block_windows == 8
    assert cfg.data.corpus == "corpora/chat" and cfg.train.optimizer == "nadam" and cfg.model.hidden == 96


def test_override_replaces_file_value_and_creates_section():
    cfg = config.loads("[model]\nhidden = 64\n" + MINIMAL, overrides=["model.hidden=128", "eval.eval_windows=3"])
    assert cfg.model.hidden == 128 and cfg.eval.eval_windows == 3


@pytest.mark.parametrize("item,needle", [
    ("train.lr", "--set expects section.key=value"),
    ("lr=0.1", "--set expects section.key=value"),
    ("train.lr.x=1", "--set expects section.key=value"),
    ("train.lrr=0.1", "--set train.lrr=0.1: unknown key train.lrr"),
    ("trian.lr=0.1", "unknown section [trian]"),
    ("train.lr=abc", "'abc' is not a TOML value"),
    ("data.window=12.5", "--set data.window=12.5: data.window must be a whole number"),
    ("train.lr=-1", "--set train.lr=-1: train.lr must be in (0, 10], got -1.0"),
    ("data.shuffle_block_windows=2", "--set data.shuffle_block_windows=2: data.shuffle_block_windows = 2"),
])
def test_override_errors(item, needle):
    e = usage_error(MINIMAL, overrides=[item])
    assert needle in e.message


def test_choice_typo_suggests():
    assert ('did you mean schedule.cooldown_shape = "cosine"?'
            in usage_error(MINIMAL, ["schedule.cooldown_shape=cos"]).hint)


def test_override_typo_suggests():
    assert usage_error(MINIMAL, overrides=["train.lr_mn=0.1"]).hint == "did you mean schedule.lr_min?"


# --- derived ----------------------------------------------------------------------------------------

def test_planned_total_steps():
    cfg = config.loads("[data]\nbatch_lanes = 4\nmicro_batches = 2\n[train]\ncycles = 1.5\n")
    assert config.seqs_per_step(cfg) == 8
    assert config.planned_total_steps(cfg, seqs_per_cycle=100) == math.ceil(150 / 8)
    cfg = config.loads("[data]\nbatch_lanes = 4\n[train]\ncycles = 2\n")
    assert config.planned_total_steps(cfg, seqs_per_cycle=40) == 20  # exact: no extra step
    assert config.planned_total_steps(config.loads(MINIMAL), seqs_per_cycle=40) == 100
    with pytest.raises(UsageError):
        config.planned_total_steps(cfg, 0)


def test_with_changes_and_model_spec():
    cfg = config.loads(MINIMAL)
    cfg2 = config.with_changes(cfg, train={"lr": 3e-4}, model={"hidden": 32})
    assert cfg2.train.lr == 3e-4 and cfg2.model.hidden == 32 and cfg.train.lr == 1e-3
    with pytest.raises(UsageError):
        config.with_changes(cfg, train={"lrr": 1})
    assert config.model_spec(cfg2).hidden == 32


def test_every_key_is_documented():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text()
    for section, keys in config.key_specs().items():
        for key in keys:
            assert f"`{section}.{key}`" in doc, f"{section}.{key} missing from docs/config.md"


# --- bounds that keep counters inside 32 bits (and TOML's 64-bit integers) ---------------------------

@pytest.mark.parametrize("key,value,needle", [
    ("train.total_steps", str(2**32), "train.total_steps must be in [0, 4294967295], got 4294967296"),
    ("train.total_steps", str(10**20), "train.total_steps must be in [0, 4294967295], got 100000000000000000000"),
    ("train.total_steps", "1e20", "train.total_steps must be a whole number, got number 1e+20"),
    ("train.max_consecutive_skips", "0", "train.max_consecutive_skips must be in [1, 1000000], got 0"),
    ("train.max_consecutive_skips", "1000001", "train.max_consecutive_skips must be in [1, 1000000], got 1000001"),
    ("train.max_consecutive_skips", "2.5", "train.max_consecutive_skips must be a whole number"),
    ("eval.sample_chars", "1000001", "eval.sample_chars must be in [0, 1000000], got 1000001"),
    ("eval.eval_every_seqs", str(2**63), "eval.eval_every_seqs must be >= 0 and fit in 64 bits"),
    ("checkpoint.keep_last", str(10**30), "checkpoint.keep_last must be >= 0 and fit in 64 bits"),
    ("data.shuffle_block_windows", str(2**64), "data.shuffle_block_windows must be >= 0 and fit in 64 bits"),
])
def test_upper_bounds(key, value, needle):
    section, name = key.split(".")
    body = f"[{section}]\n{name} = {value}\n"
    e = usage_error(body + ("cycles = 1\n" if section == "train" else MINIMAL))
    assert needle in e.message and name in e.hint  # the key's meaning, or an example of it
    assert needle in usage_error(MINIMAL, overrides=[f"{key}={value}"]).message  # --set: the same check


def test_upper_bounds_are_inclusive_and_round_trip():
    cfg = config.loads(f"[train]\ntotal_steps = {2**32 - 1}\nmax_consecutive_skips = 1000000\n"
                       f"[eval]\nsample_chars = 1000000\neval_every_seqs = {2**63 - 1}\n")
    assert cfg.train.total_steps == 2**32 - 1 and cfg.eval.eval_every_seqs == 2**63 - 1
    assert config.loads(config.resolved_toml(cfg)) == cfg
    assert config.planned_total_steps(cfg, seqs_per_cycle=1) == 2**32 - 1


def test_from_dict_checks_the_bounds():
    with pytest.raises(UsageError, match=r"train.total_steps must be in \[0, 4294967295\]"):
        config.from_dict({"train": {"total_steps": 2**40}})
    with pytest.raises(UsageError, match="fit in 64 bits"):
        config.from_dict({"train": {"total_steps": 5}, "eval": {"eval_windows": -2**63 - 1 + 2**128}})


def test_max_consecutive_skips_default_and_docs():
    assert config.loads(MINIMAL).train.max_consecutive_skips == 25
    assert config.loads(MINIMAL, overrides=["train.max_consecutive_skips=1"]).train.max_consecutive_skips == 1
    doc = (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text()
    assert "| `train.max_consecutive_skips` | int | `25` | in [1, 1000000] |" in doc


def test_tokens_per_step_fit_32_bits():
    # 2**32 - 1 = 255 * 257 * 65537: the largest count the device's uint32 words hold
    ok = config.loads("[data]\nmicro_batches = 255\nbatch_lanes = 257\nwindow = 65537\n" + MINIMAL)
    assert config.seqs_per_step(ok) * ok.data.window == 2**32 - 1
    e = usage_error("[data]\nmicro_batches = 4096\nbatch_lanes = 65536\nwindow = 16\n" + MINIMAL)
    assert "data.micro_batches * data.batch_lanes * data.window = 4294967296 tokens per optimizer step exceeds" \
        in e.message and "32-bit" in e.message
    e = usage_error("[data]\nmicro_batches = 4096\nbatch_lanes = 64\n" + MINIMAL, overrides=["data.window=1048576"])
    assert e.message.startswith("--set data.window=1048576: ")  # names the override that broke it


def test_cycles_cannot_plan_more_than_32_bit_steps():
    e = usage_error("[train]\ncycles = 1e300\n")
    assert "train.cycles = 1e+300 plans more than 4294967295 optimizer steps" in e.message
    cfg = config.loads("[train]\ncycles = 1e9\n")  # fits statically; too long for this corpus
    with pytest.raises(UsageError, match=r"train.cycles = 1e\+09 of 1000 seqs each plans 3.12e\+10 optimizer steps"):
        config.planned_total_steps(cfg, seqs_per_cycle=1000)
    assert config.planned_total_steps(cfg, seqs_per_cycle=4) == 125_000_000  # 1e9 * 4 / 32 lanes


def test_precision_key_and_its_refusals():
    assert config.loads(MINIMAL).train.precision == "fp32"
    assert config.loads(MINIMAL, overrides=["train.precision=fp16"]).train.precision == "fp16"
    e = usage_error(MINIMAL, overrides=["train.precision=bf16"])
    assert 'train.precision = "bf16" is not supported' in e.message and "bfloat16 cooperative matrices" in e.message
    assert "use fp16" in e.message
    e = usage_error(MINIMAL, overrides=["train.precision=fp8"])
    assert 'train.precision must be one of "fp32", "fp16", got "fp8"' in e.message
    e = usage_error("[train]\ncycles = 1\nprecision = 16\n")
    assert "train.precision must be a string" in e.message
