"""An edited state.json is refused, naming the field (issue 39 item 3): every leaf of a real
checkpoint's state.json edited in turn, the fields the issue names through the real CLI, every
command that loads a checkpoint, an unedited resume still bitwise, and a checkpoint written before
the copy existed still loading. docs/reliability.md has the rows."""

import json
import shutil

import pytest

from catchat import config as cfgmod
from catchat.run import checkpoint as ck
from catchat.run import statecopy, tensorfile
from catchat.train import Trainer

from support import assert_clean_error, assert_same_as_straight, catchat, resume_cli, sha256_of, snapshot

STEP = "step-0000006"
FIX = "restore it (the saved values are in model.safetensors's metadata 'state')"


@pytest.fixture(scope="module")
def trained(dev, cfg_path, tmp_path_factory):
    """A run of the exact config stopped after 6 steps (checkpoints 3 and 6)."""
    run = tmp_path_factory.mktemp("edits") / "run"
    with Trainer(cfgmod.load(cfg_path), run, dev) as t:
        t.run(stop_after_steps=6)
    return run


@pytest.fixture
def run(trained, tmp_path):
    """A private copy of the trained run and its checkpoint at step 6."""
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run", tmp_path / "run" / "checkpoints" / STEP


def _edit(ckpt_dir, change):
    p = ckpt_dir / ck.STATE_FILE
    state = json.loads(p.read_text())
    change(state)
    p.write_text(json.dumps(state, indent=1, sort_keys=True))


def _set(path: list, value):
    def change(state):
        node = state
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return change


def _leaf_paths(value, prefix=()):
    """(key path, value) of every leaf, as statecopy counts them."""
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from _leaf_paths(v, prefix + (k,))
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            yield from _leaf_paths(v, prefix + (i,))
    else:
        yield prefix, value


def _other(value):
    """A different value of the same kind (what a hand edit would write)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 if value else 0.5
    if isinstance(value, str):
        if len(value) == 64 and all(c in "0123456789abcdef" for c in value):  # a hash: still a hash
            return value[:-1] + ("0" if value[-1] != "0" else "1")
        return value + "x"
    if value is None:
        return 1
    return {"x": 1} if isinstance(value, dict) else [1]


def _dotted(path) -> str:
    out = ""
    for k in path:
        if isinstance(k, int):
            out += f"[{k}]"
        else:
            out += ("." if out else "") + statecopy._key(k)
    return out


# Fields an earlier check refuses first, with its own message (each names the field or what it is).
EARLIER = {
    "format": "format is 'catchat-checkpointx'",
    "format_version": "format_version must be 1, got 2",
    "global_step": "global_step is 7 but the directory is step-0000006",
    "applied_steps": "applied_steps 7 exceeds global_step 6",
    "vocab_fingerprint": "was made with another vocabulary",
    'sha256."model.safetensors"': "model.safetensors is corrupt (sha256 differs",
    'sha256."optimizer.safetensors"': "optimizer.safetensors is corrupt (sha256 differs",
    "config.train.time_budget_s": "no 'budget' entry (the run clock of a time-budgeted run)",
}


def test_every_leaf_of_state_json_edited_is_refused_naming_it(cli, cfg_path, run):
    """Each leaf of state.json changed in turn (`catchat train --resume`, in this process): exit 2,
    one error line naming the field and a fix line, and no file of the run touched."""
    rdir, c = run
    good = (c / ck.STATE_FILE).read_bytes()
    leaves = list(_leaf_paths(json.loads(good)))
    assert len(leaves) > 100 and set(EARLIER) <= {_dotted(p) for p, _ in leaves}
    before = snapshot(rdir)
    for path, value in leaves:
        _edit(c, _set(list(path), _other(value)))
        code, _, err = cli("train", cfg_path, "--run-dir", rdir, "--resume")
        name = _dotted(path)
        lines = err.strip().splitlines()
        assert code == 2 and "Traceback" not in err, (name, err)
        assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].lstrip().startswith("fix: "), err
        needle = EARLIER.get(name, f"state.json was changed after it was saved: {name} is ")
        assert needle in lines[0], (name, err)
        if name not in EARLIER:
            assert FIX in lines[1], err
        (c / ck.STATE_FILE).write_bytes(good)
        assert snapshot(rdir) == before, name


@pytest.mark.parametrize("path,value,needle", [
    (["applied_steps"], 5, "applied_steps is 5, saved 6"),
    (["cursor", "window"], 2, "cursor.window is 2, saved "),
    (["cursor", "cycle"], 3, "cursor.cycle is 3, saved 0"),
    (["model", "hidden"], 16, "model.hidden is 16, saved 12"),
    (["schedule", "lr_next"], 0.5, "schedule.lr_next is 0.5, saved "),
    (["schedule", "total_steps"], 60, "schedule.total_steps is 60, saved 30"),
    (["run_seed"], 4, "run_seed is 4, saved 3"),
    (["config", "train", "lr"], 0.02, "config.train.lr is 0.02, saved 0.01"),
    (["tokens_seen"], 1, "tokens_seen is 1, saved "),
])
def test_the_fields_the_issue_names_through_the_cli(cfg_path, run, path, value, needle):
    """Each was trusted or silently ignored before: other weights with exit 0 and a clean scan."""
    rdir, c = run
    _edit(c, _set(path, value))
    before = snapshot(rdir)
    assert_clean_error(catchat("train", cfg_path, "--run-dir", rdir, "--resume"), 2, needle, FIX)
    assert snapshot(rdir) == before


def test_every_command_that_loads_a_checkpoint_refuses_an_edited_state(cfg_path, run):
    rdir, c = run
    _edit(c, _set(["cursor", "cycle"], 3))
    before = snapshot(rdir)
    for args in (("eval", rdir), ("sample", rdir, "--length", "5"), ("inspect", rdir),
                 ("eval", rdir, "--allow-unverified")):
        assert_clean_error(catchat(*args), 2, "cursor.cycle is 3, saved 0", FIX)
    assert snapshot(rdir) == before


def test_allow_unverified_does_not_excuse_an_edit(cfg_path, run):
    """Without a recorded sha256 the flag loads the files on the user's word; a state.json that
    differs from the copy is still a difference found, and refused."""
    rdir, c = run
    _edit(c, lambda s: (s.pop("sha256"), s.update(run_seed=4)))
    assert_clean_error(catchat("train", cfg_path, "--run-dir", rdir, "--resume", "--allow-unverified"), 2,
                       "run_seed is 4, saved 3")


def test_an_edited_copy_breaks_the_model_files_hash(cfg_path, run):
    """The other half: editing the copy inside model.safetensors to match an edit is caught too."""
    rdir, c = run
    tensors, meta = tensorfile.read(c / ck.MODEL_FILE)
    copy = json.loads(meta[statecopy.METADATA_KEY])
    copy["run_seed"] = 4
    meta[statecopy.METADATA_KEY] = statecopy.canonical(copy)
    tensorfile.write(c / ck.MODEL_FILE, tensors, meta)
    _edit(c, _set(["run_seed"], 4))
    assert_clean_error(catchat("train", cfg_path, "--run-dir", rdir, "--resume"), 2,
                       "model.safetensors is corrupt (sha256 differs")


def test_an_unedited_resume_is_still_bitwise(cfg_path, straight, run):
    rdir, c = run
    saved = json.loads((c / ck.STATE_FILE).read_text())
    meta = tensorfile.read_metadata(c / ck.MODEL_FILE)
    assert meta[statecopy.METADATA_KEY] == statecopy.canonical(saved)  # the copy is state.json less sha256
    (c / ck.STATE_FILE).write_text(json.dumps(saved))  # reformatted, not changed: the same state
    resume_cli(cfg_path, rdir)
    assert_same_as_straight(rdir, straight)


def _strip_copy(c):
    """Make `c` a checkpoint of a catchat before the copy: no 'state' in the model's metadata."""
    tensors, meta = tensorfile.read(c / ck.MODEL_FILE)
    del meta[statecopy.METADATA_KEY]
    tensorfile.write(c / ck.MODEL_FILE, tensors, meta)
    _edit(c, lambda s: s["sha256"].update({ck.MODEL_FILE: sha256_of(c / ck.MODEL_FILE)}))


def test_a_checkpoint_without_the_copy_loads_as_before(cfg_path, straight, run):
    rdir, c = run
    _strip_copy(c)
    r = resume_cli(cfg_path, rdir)
    assert "warning" not in r.stderr, r.stderr
    assert_same_as_straight(rdir, straight)


def test_the_copy_survives_json_round_trips():
    """Tuples become lists and integer keys strings in state.json: the copy is made as it reads back."""
    state = {"a": (1, 2), "b": {3: "x", 10: "y"}, "sha256": {"m": "0" * 64}, "f": 0.1 + 0.2}
    copy = statecopy.saved_copy(state)
    assert "sha256" not in json.loads(copy)
    assert statecopy.differences(json.loads(json.dumps(state, indent=1, sort_keys=True)), copy) == []
    edited = json.loads(json.dumps(state))
    edited["b"]["10"] = "z"
    edited["f"] = 0.3
    edited["new"] = True
    assert statecopy.differences(edited, copy) == ['b.10 is "z", saved "y"', "f is 0.3, saved 0.30000000000000004",
                                                   "new is new (true; not saved)"]
