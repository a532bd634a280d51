"""Bad input through the real CLI (issue 8): damaged checkpoints, bad corpora, bad configs and flags.
Each must give one clear error line (plus a fix line), the right exit code and no traceback;
what must work (non-ASCII text, CRLF, a file of hundreds of MB in bounded memory) works. The tables
of inputs (one message each) run the command in this process (`catchat_here`); the other tests, as
a user runs it (a subprocess)."""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.data import corpus as corpus_mod
from catchat.data.corpus import Corpus
from catchat.data.corpus import jsonl as corpus_jsonl
from catchat.errors import UsageError
from catchat.train import Trainer

from support import assert_clean_error, catchat, sha256_of, snapshot

# ---------------------------------------------------------------------------------------- checkpoints

@pytest.fixture(scope="module")
def trained(dev, tmp_path_factory):
    """A run directory with a checkpoint after 2 steps, and its config file."""
    root = tmp_path_factory.mktemp("trained")
    src = root / "src"
    src.mkdir()
    for i in range(10):
        (src / f"s{i}.txt").write_text("ANNA: Is it raining?\nBO: Not yet.\n" * (1 + i % 3))
    corpus_mod.build([src], root / "corpus", eval_fraction=0.2, delimiter=None)
    body = {"model": {"hidden": 12, "layers": 2},
            "data": {"corpus": str(root / "corpus"), "batch_lanes": 2, "window": 8},
            "train": {"total_steps": 50}, "eval": {"free_running": False, "sample_chars": 0}}
    cfg = cfgmod.from_dict(body)
    (root / "cfg.toml").write_text(cfgmod.resolved_toml(cfg))
    Trainer(cfg, root / "run", dev).run(stop_after_steps=2)
    return root


@pytest.fixture
def catchat_here(cli):
    """`catchat ARGS` in this process (conftest.py's cli: the same main(), so the same exit code, stdout
    and stderr), as a CompletedProcess: a table's many inputs without a process start-up each (~0.6 s)."""
    def run(*args):
        code, out, err = cli(*args)
        return subprocess.CompletedProcess(list(args), code, out, err)
    return run


@pytest.fixture
def run(trained, tmp_path):
    """A private copy of the trained run and the path of its checkpoint."""
    shutil.copytree(trained / "run", tmp_path / "run")
    return tmp_path / "run", tmp_path / "run" / "checkpoints" / "step-0000002"


def _edit_state(ckpt_dir, change):
    p = ckpt_dir / "state.json"
    state = json.loads(p.read_text())
    change(state)
    p.write_text(json.dumps(state))


def test_corrupted_model_file_is_named(run, trained):
    rdir, c = run
    data = bytearray((c / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0x40
    (c / "model.safetensors").write_bytes(bytes(data))
    assert_clean_error(catchat("eval", rdir), 2, "model.safetensors is corrupt (sha256 differs")
    assert_clean_error(catchat("train", trained / "cfg.toml", "--run-dir", rdir, "--resume"), 2,
                       "model.safetensors is corrupt")


def test_truncated_model_file_without_a_recorded_hash(run):
    rdir, c = run
    (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:100])
    _edit_state(c, lambda s: s.pop("sha256"))
    assert_clean_error(catchat("eval", rdir), 2, "state.json records no sha256 for model.safetensors",
                       "--allow-unverified")
    r = catchat("eval", rdir, "--allow-unverified")  # the user's word: loaded with a warning, then read
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "is loaded unverified" in r.stderr and "model.safetensors is not a valid safetensors file" in r.stderr


def test_missing_optimizer_file(run, trained):
    """eval and sample need only the model; a resume needs the optimizer state too."""
    rdir, c = run
    (c / "optimizer.safetensors").unlink()
    r = catchat("eval", rdir, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["loss"] > 0, r.stderr
    r = catchat("sample", rdir, "--length", "5")
    assert r.returncode == 0, r.stderr
    assert_clean_error(catchat("train", trained / "cfg.toml", "--run-dir", rdir, "--resume"), 2,
                       "optimizer.safetensors is missing")


@pytest.mark.parametrize("content,needle", [
    ("{not json", "state.json is not a valid catchat state file"),
    ("[1, 2]", "state.json is not a valid catchat state file (format is 'list')"),
    ('{"format": "catchat-checkpoint"}', "state.json is damaged: no 'format_version' entry; no 'global_step' entry"),
    ("[" * 100000, "state.json is not a valid catchat state file (nested too deeply)"),
    ("\x00\xff\xfe garbage", "state.json is not a valid catchat state file"),
])
def test_corrupted_state_file_is_named(catchat_here, run, content, needle):
    rdir, c = run
    (c / "state.json").write_bytes(content.encode("latin-1"))
    assert_clean_error(catchat_here("eval", rdir), 2, needle)


def test_state_file_missing_or_wrong_entries_on_resume(run, trained):
    rdir, c = run
    _edit_state(c, lambda s: s.pop("cursor"))
    assert_clean_error(catchat("train", trained / "cfg.toml", "--run-dir", rdir, "--resume"), 2,
                       "state.json is damaged: no 'cursor' entry")
    _edit_state(c, lambda s: s.update(cursor=5))
    assert_clean_error(catchat("train", trained / "cfg.toml", "--run-dir", rdir, "--resume"), 2,
                       "state.json is damaged: cursor must be a table, got 5")


@pytest.mark.parametrize("change,needle", [
    (lambda s: s.update(global_step=1), "global_step is 1 but the directory is step-0000002"),
    (lambda s: s.update(global_step="2"), 'global_step must be a whole number in [0, 4294967295], got "2"'),
    (lambda s: s.update(global_step=True), "global_step must be a whole number"),
    (lambda s: s.update(global_step=-5), "global_step must be a whole number"),
    (lambda s: s.update(applied_steps=7), "applied_steps 7 exceeds global_step 2"),
    (lambda s: s.update(seqs=-1), "seqs must be a whole number >= 0, got -1"),
    (lambda s: s.update(seqs=1.5), "seqs must be a whole number >= 0, got 1.5"),
    (lambda s: s.update(config=[]), "config must be a table, got []"),
    (lambda s: s.update(format_version=9), "format_version must be 1, got 9"),
    (lambda s: s["sha256"].update({"model.safetensors": "xyz"}), "its sha256 entry is not a map"),
])
def test_edited_state_fields_are_refused_and_change_nothing(catchat_here, run, trained, change, needle):
    """Issue 17 item 6: every field of state.json is checked; a refused resume writes nothing."""
    rdir, c = run
    _edit_state(c, change)
    before = snapshot(rdir)
    assert_clean_error(catchat_here("train", trained / "cfg.toml", "--run-dir", rdir, "--resume"), 2, needle)
    assert snapshot(rdir) == before


def test_missing_checksums_need_the_users_word(run, trained):
    rdir, c = run
    _edit_state(c, lambda s: s.pop("sha256"))
    before = snapshot(rdir)
    assert_clean_error(catchat("train", trained / "cfg.toml", "--run-dir", rdir, "--resume"), 2,
                       "records no sha256 for model.safetensors", "--allow-unverified")
    assert snapshot(rdir) == before
    r = catchat("train", trained / "cfg.toml", "--run-dir", rdir, "--resume", "--allow-unverified",
                "--stop-after-steps", "1")
    assert r.returncode == 0 and "is loaded unverified" in r.stdout + r.stderr, r.stdout + r.stderr


def test_non_finite_weights_are_refused_at_load(run, trained):
    from catchat.run import tensorfile

    rdir, c = run
    tensors, meta = tensorfile.read(c / "model.safetensors")
    tensors["embedding.weight"][3, 1] = np.nan
    tensorfile.write(c / "model.safetensors", tensors, meta)
    _edit_state(c, lambda s: s["sha256"].update({"model.safetensors": sha256_of(c / "model.safetensors")}))
    for args in (("eval", rdir), ("train", trained / "cfg.toml", "--run-dir", rdir, "--resume")):
        assert_clean_error(catchat(*args), 2, "model.safetensors holds non-finite values (NaN or inf) in "
                                              "embedding.weight")


def test_checkpoint_of_another_vocabulary_is_refused(run):
    rdir, c = run
    _edit_state(c, lambda s: s.update(vocab_fingerprint="ab" * 32))
    assert_clean_error(catchat("eval", rdir), 2, "was made with another vocabulary (fingerprint abababababab")


def test_tensors_that_do_not_fit_their_own_state_are_refused(run):
    """A checkpoint of a catchat before state.json's copy in model.safetensors (which names such an
    edit first: test_state_edits.py): the shapes are still checked against the recorded model."""
    from catchat.run import statecopy, tensorfile

    rdir, c = run
    tensors, meta = tensorfile.read(c / "model.safetensors")
    del meta[statecopy.METADATA_KEY]
    tensorfile.write(c / "model.safetensors", tensors, meta)
    _edit_state(c, lambda s: s["sha256"].update({"model.safetensors": sha256_of(c / "model.safetensors")}))
    _edit_state(c, lambda s: s["config"]["model"].update(hidden=16))
    err = assert_clean_error(catchat("eval", rdir), 2, "model.safetensors does not match the model in its state.json")
    assert "embedding.weight: (101, 12) vs config (101, 16)" in err


def test_checkpoint_shapes_against_the_config_are_listed(run, trained):
    rdir, _ = run
    r = catchat("train", trained / "cfg.toml", "--run-dir", rdir, "--resume", "--set", "model.hidden=16",
                "--set", "model.layers=3")
    err = assert_clean_error(r, 2, "does not match the model config")
    for diff in ("layers.2.gru.weight_ih: missing", "embedding.weight: (101, 12) vs config (101, 16)",
                 "layers.0.gru.weight_hh: (36, 12) vs config (48, 16)"):
        assert diff in err


def test_latest_naming_nothing(run):
    rdir, _ = run
    (rdir / "checkpoints" / "latest").write_text("step-0000099\n")
    assert_clean_error(catchat("eval", rdir), 2, "names step-0000099, which is not a complete checkpoint",
                       "step-0000002")


def test_partial_rows_and_events_are_repaired_on_resume(dev, run, trained):
    """A crash can leave a half-written metrics row or event line: resume drops them, the run goes on."""
    rdir, _ = run
    with open(rdir / "metrics.csv", "a") as f:
        f.write("3,12,0,4")
    with open(rdir / "events.jsonl", "a") as f:
        f.write('{"event": "ev')
    t = Trainer(cfgmod.load(trained / "cfg.toml"), rdir, dev, resume="")
    t.run(stop_after_steps=1)
    lines = (rdir / "metrics.csv").read_text().splitlines()
    assert [x.split(",")[0] for x in lines[1:]] == ["1", "2", "3"]
    assert all(json.loads(x) for x in (rdir / "events.jsonl").read_text().splitlines())


# ------------------------------------------------------------------------------------------ corpora

def build_cli(tmp_path, *sources, extra=()):
    return catchat("corpus", "build", *sources, "-o", tmp_path / "out", *extra)


@pytest.mark.parametrize("name,data,needles", [
    ("empty.txt", b"", ["empty.txt is empty (0 bytes)"]),
    ("blank.txt", b"  \n\r\n\t\n", ["blank.txt holds no text"]),
    ("random.bin", np.random.default_rng(0).integers(0, 256, 20000, dtype=np.uint8).tobytes(),
     ["random.bin is not valid UTF-8: byte offset"]),
    ("control.bin", bytes(np.random.default_rng(1).integers(1, 32, 20000, dtype=np.uint8)),
     ["control.bin: ", "outside the cc101 vocabulary (at most 5.0% allowed)"]),
    ("latin1.txt", "caf\u00e9 au lait\n".encode("latin-1"), ["latin1.txt is not valid UTF-8: byte offset 3 (0xe9)"]),
    ("russian.txt", ("\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! " * 50).encode(),
     ["russian.txt: 69.3% of its characters are outside", "--max-unk-rate"]),
    ("bad.jsonl", b'{"text": "fine"}\n{"text": "fine"}\n{"text": oops}\n', ["bad.jsonl line 3: not valid JSON"]),
    ("shape.jsonl", b'{"text": "fine"}\n{"turns": [{"speaker": "A"}]}\n',
     ['shape.jsonl line 2: turns[0] needs a "text"']),
    ("utf.jsonl", b'{"text": "fine"}\n{"text": "\xff"}\n', ["utf.jsonl line 2 is not valid UTF-8"]),
])
def test_bad_corpus_sources(catchat_here, tmp_path, name, data, needles):
    (tmp_path / name).write_bytes(data)
    assert_clean_error(catchat_here("corpus", "build", tmp_path / name, "-o", tmp_path / "out"), 2, *needles)
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_bad_corpus_paths(tmp_path):
    assert_clean_error(build_cli(tmp_path, tmp_path / "nope.txt"), 2, "nope.txt does not exist")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".hidden").write_text("x")
    assert_clean_error(build_cli(tmp_path, tmp_path / "d"), 2, "holds no files")
    os.mkfifo(tmp_path / "fifo")
    assert_clean_error(build_cli(tmp_path, tmp_path / "fifo"), 2, "is not a regular file")
    (tmp_path / "a.txt").write_text("hello")
    assert build_cli(tmp_path, tmp_path / "a.txt").returncode == 0
    assert_clean_error(build_cli(tmp_path, tmp_path / "a.txt"), 2, "already exists", "--force")
    assert_clean_error(catchat("corpus", "info", tmp_path / "a.txt"), 2, "is a file, not a built corpus")


def test_non_ascii_text_is_normalised_and_the_unk_rate_reported(tmp_path):
    text = "\u201cCaf\u00e9\u201d \u2014 it\u2019s na\u00efve\u2026 and the rest is plain.\tTab.\n"
    (tmp_path / "n.txt").write_text(text * 20)
    r = build_cli(tmp_path, tmp_path / "n.txt")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["unk"] == 40 and 0.03 < m["unk_rate"] < 0.05  # only the two accented letters per line
    assert (f"unk rate {m['unk_rate']:.4%} (40 characters outside cc101: \u00e9 U+00E9 x20, \u00ef U+00EF x20)"
            in r.stdout), r.stdout  # the characters named, most frequent first, with their code points
    c = Corpus.open(tmp_path / "out")
    line = '"Caf\ufffd" -- it\'s na\ufffdve... and the rest is plain. Tab.\n'  # <unk> decodes as U+FFFD
    assert c.text(0, show_specials=False) == (line * 20).rstrip("\n")
    r = catchat("corpus", "build", tmp_path / "n.txt", "-o", tmp_path / "strict", "--max-unk-rate", "0.01")
    assert_clean_error(r, 2, f"{m['unk_rate']:.1%} of its characters are outside", "at most 1.0% allowed",
                       "most often \u00e9 U+00E9 x20, \u00ef U+00EF x20")


def test_crlf_line_ends_are_the_same_text(tmp_path):
    lf = "ANNA: one\nBO: two\n\n<|endoftext|>\nANNA: three\n"
    (tmp_path / "lf.txt").write_bytes(lf.encode())
    (tmp_path / "crlf.txt").write_bytes(lf.replace("\n", "\r\n").encode())
    (tmp_path / "cr.jsonl").write_bytes(b'{"text": "one\\r\\ntwo"}\r\n{"text": "three"}\r\n')
    for name in ("lf.txt", "crlf.txt"):
        corpus_mod.build([tmp_path / name], tmp_path / name.replace(".", "_"))
    a, b = (Corpus.open(tmp_path / d) for d in ("lf_txt", "crlf_txt"))
    assert np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens)) and len(a) == 2
    corpus_mod.build([tmp_path / "cr.jsonl"], tmp_path / "j")
    assert Corpus.open(tmp_path / "j").text(0, show_specials=False) == "one\ntwo"


def test_jsonl_line_longer_than_the_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_jsonl, "MAX_JSONL_LINE_BYTES", 1 << 20)
    (tmp_path / "big.jsonl").write_text('{"text": "ok"}\n' + json.dumps({"text": "x" * (2 << 20)}) + "\n")
    with pytest.raises(UsageError, match=r"big.jsonl line 2 is longer than 1 MiB") as info:
        corpus_mod.build([tmp_path / "big.jsonl"], tmp_path / "out")
    assert "split it" in info.value.hint


# Linux carries a process's RSS high-water mark into the children it forks and execs (exec takes the
# old address space's peak), so a child of this big pytest process would report pytest's peak. A
# small launcher process starts the build and reads the build's own peak with os.wait4.
_LAUNCH = """import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(p.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def _build_peak_rss_mb(src, out) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of a `catchat corpus build` process."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _LAUNCH, sys.executable, "-m", "catchat.cli", "corpus", "build",
                        str(src), "-o", str(out), "--max-unk-rate", "0.5"], capture_output=True, text=True,
                       timeout=600)
    code, kib = (int(x) for x in r.stdout.split()[-2:])
    assert code == 0, r.stderr
    return kib / 1024, time.monotonic() - t0


def _write_text(path, mb):
    """Generated text: 2,000-word lines (some over 1 MiB, so they arrive in pieces), non-ASCII words,
    a conversation delimiter every ~4 MB."""
    rng = np.random.default_rng(0)
    words = np.array(["the", "cat", "sat", "on", "a", "mat,", "and", "so", "caf\u00e9", "\u201cwell\u201d", "it's",
                      "ROMEO:", "O", "night.", "\u2014"])
    lines = [" ".join(rng.choice(words, 2000)) + "\n" for _ in range(64)]
    lines.append(" ".join(rng.choice(words, 300_000)) + "\n")  # one 1.4 MB line
    block = ("".join(lines) + "<|endoftext|>\n").encode()
    with open(path, "wb") as f:
        for _ in range(int(mb * 1e6) // len(block) + 1):
            f.write(block)
    return path.stat().st_size


@pytest.mark.slow
def test_huge_text_file_streams_with_bounded_memory(tmp_path):
    """An 80 MB text corpus (multi-GB files go the same way) is built by a child process whose peak
    RSS stays bounded: under 300 MiB, and within 30 MiB of a 4 MB build's (holding the text alone
    would take 80 MB more)."""
    free = shutil.disk_usage(tmp_path).free
    if free < 300e6:
        pytest.skip(f"needs ~300 MB free in {tmp_path} for an 80 MB source and its corpus, has {free / 1e6:.0f} MB")
    small = _write_text(tmp_path / "small.txt", 4)
    small_rss, _ = _build_peak_rss_mb(tmp_path / "small.txt", tmp_path / "small")
    big = _write_text(tmp_path / "big.txt", 80)
    big_rss, seconds = _build_peak_rss_mb(tmp_path / "big.txt", tmp_path / "big")
    m = json.loads((tmp_path / "big" / "manifest.json").read_text())
    assert big >= 80e6 and big > 15 * small and m["sources"][0]["bytes"] == big
    assert m["characters"] > 0.9 * big and (tmp_path / "big" / "tokens.bin").stat().st_size == m["tokens"]
    assert big_rss < 300, f"peak RSS {big_rss:.0f} MiB for a {big / 1e6:.0f} MB file"
    assert big_rss - small_rss < 30, f"peak RSS grew {small_rss:.0f} -> {big_rss:.0f} MiB with the input"
    print(f"80 MB build: peak RSS {big_rss:.0f} MiB (4 MB: {small_rss:.0f} MiB), {seconds:.1f} s")


# ------------------------------------------------------------------------------------ configs, flags

GOOD = "[train]\ntotal_steps = 10\n"


@pytest.mark.parametrize("config,args,code,needles", [
    (GOOD + "lrr = 0.1\n", [], 2, ["unknown key train.lrr", "did you mean train.lr?"]),
    (GOOD + "[trainer]\nlr = 0.1\n", [], 2, ["unknown section [trainer]", "did you mean [train]?"]),
    (GOOD + "[data]\nwindow = \"64\"\n", [], 2, ["data.window must be a whole number, got string"]),
    (GOOD + "[data]\nwindow = 0\n", [], 2, ["data.window must be in [1, 1048576], got 0"]),
    (GOOD, ["--set", "data.window=0"], 2, ["--set data.window=0: data.window must be in [1, 1048576], got 0"]),
    (GOOD, ["--set", "train.lr=-0.001"], 2, ["train.lr must be in (0, 10], got -0.001"]),
    (GOOD, ["--set", "train.dropout_hidden=1.0"], 2, ["train.dropout_hidden must be in [0, 1), got 1.0"]),
    (GOOD, ["--set", "train.dropout_embedding=1"], 2, ["train.dropout_embedding must be in [0, 1)"]),
    (GOOD, ["--set", "train.seed=1.5"], 2, ["train.seed must be a whole number, got number"]),
    (GOOD, ["--set", "train.lrr=1"], 2, ["unknown key train.lrr"]),
    (GOOD, ["--set", "lr"], 2, ["--set expects section.key=value"]),
    (GOOD, ["--temperature", "0.5"], 2, ["No such option", "--help"]),
    (GOOD, ["--stop-after-steps", "0"], 2, ["0 is not in the range x>=1"]),
    (GOOD, ["--resume", "--set"], 2, ["requires an argument"]),
    ("[train\nlr = 1\n", [], 2, ["is not valid TOML"]),
    ("\x00\x01\x02", [], 2, ["is not valid TOML"]),
    ("[train]\nlr = 0.1\n", [], 2, ["neither train.total_steps nor train.cycles is set"]),
])
def test_bad_configs_and_flags(catchat_here, tmp_path, config, args, code, needles):
    cfg = tmp_path / "c.toml"
    cfg.write_text(config)
    r = catchat_here("train", cfg, "--run-dir", tmp_path / "run", *args)
    assert_clean_error(r, code, *needles)
    assert not (tmp_path / "run").exists()


def test_bad_command_line(tmp_path):
    assert_clean_error(catchat("train", tmp_path / "nope.toml"), 2, "File", "does not exist")
    assert_clean_error(catchat("trian"), 2, "No such command 'trian'", "Did you mean 'train'?")
    assert_clean_error(catchat("corpus", "build", "x.txt"), 2, "Missing option '-o'")
    assert_clean_error(catchat("sample", tmp_path, "--top-p", "0"), 2, "--top-p")


# ---------------------------------------------------------------------------------------- issue 39 item 7
def _small_files():
    """A real kernel write failure (RLIMIT_FSIZE: EFBIG past 1 KiB), as a full disk fails with ENOSPC."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 10, 1 << 10))


def test_disk_full_at_start_up_and_in_corpus_build_names_the_path(trained, tmp_path):
    run = tmp_path / "run"
    r = catchat("train", trained / "cfg.toml", "--run-dir", run, preexec_fn=_small_files)
    assert_clean_error(r, 2, f"could not write {run}", "File too large", "make room in", "ulimit -f")
    assert not run.exists()
    (tmp_path / "big.txt").write_text("ANNA: Is it raining?\nBO: Not yet.\n" * 1000)
    r = catchat("corpus", "build", tmp_path / "big.txt", "-o", tmp_path / "out", preexec_fn=_small_files)
    assert_clean_error(r, 2, f"could not write {tmp_path / 'out'}: File too large", f"make room in {tmp_path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.txt"]


def test_run_dir_under_a_regular_file(trained, tmp_path):
    (tmp_path / "notes").write_text("mine")
    r = catchat("train", trained / "cfg.toml", "--run-dir", tmp_path / "notes" / "run")
    assert_clean_error(r, 2, f"{tmp_path / 'notes'} is a file, not a directory", "--run-dir")
    assert (tmp_path / "notes").read_text() == "mine"


def test_resume_before_the_first_checkpoint_says_start_without_it(trained, tmp_path):
    from catchat.run import faults

    run = tmp_path / "run"
    r = catchat("train", trained / "cfg.toml", "--run-dir", run, env={faults.CRASH_ENV: "save.written#1"})
    assert r.returncode == -9, r.stdout + r.stderr
    before = snapshot(run)
    r = catchat("train", trained / "cfg.toml", "--run-dir", run, "--resume")
    assert_clean_error(r, 2, "stopped before its first checkpoint", f"start it without --resume (catchat train "
                       f"CONFIG --run-dir {run})")
    assert "give a run directory" not in r.stderr and snapshot(run) == before
    r = catchat("train", trained / "cfg.toml", "--run-dir", tmp_path / "new", "--resume")
    assert_clean_error(r, 2, "nothing was trained there yet", "start it without --resume")
    assert not (tmp_path / "new").exists()


def test_a_one_conversation_corpus_says_why_its_eval_split_is_empty(trained, tmp_path):
    (tmp_path / "one.txt").write_text("ANNA: Is it raining?\nBO: Not yet.\n")
    assert build_cli(tmp_path, tmp_path / "one.txt").returncode == 0
    for extra in (("--set", "eval.eval_every_seqs=8"), ("--time-budget", "5", "--set", "eval.eval_every_seqs=0")):
        r = catchat("train", trained / "cfg.toml", "--run-dir", tmp_path / "run", "--set",
                    f"data.corpus={tmp_path / 'out'}", "--set", "data.batch_lanes=1", *extra)
        assert_clean_error(r, 2, "data.eval_fraction = 0.05 of its 1 conversation leaves none for eval",
                           "at least 2 conversations")
        assert "set data.eval_fraction > 0" not in r.stderr
