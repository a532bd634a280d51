"""Output and signals never cost a run its work (issue 39): a reader that closes stdout (`| head`),
SIGHUP (a closed SSH session), Ctrl-C while the imports run or while the process shuts down.
docs/reliability.md has the table."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from catchat.run import checkpoint as ck

from support import TOTAL, assert_same_as_straight, resume_cli, rows_logged, wait_for_rows

HANG_GUARD = 180  # seconds: only against a hang, never a measure


def _popen(args, *, hangup=signal.SIG_DFL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, code=None):
    """`catchat ARGS` (or `python -c CODE ARGS`) with SIGHUP's disposition set as a shell would
    leave it (SIG_DFL; nohup: SIG_IGN) and SIGINT at its default, as a terminal's foreground job has
    it, whatever the test runner's own are (a suite run as a background job has SIGINT ignored)."""
    head = [sys.executable, "-c", code] if code else [sys.executable, "-m", "catchat.cli"]

    def shell_like():
        signal.signal(signal.SIGHUP, hangup)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    return subprocess.Popen([*head, *map(str, args)], stdout=stdout, stderr=stderr, text=True,
                            preexec_fn=shell_like)


def _last_event(run) -> dict:
    return json.loads((run / "events.jsonl").read_text().splitlines()[-1])


# --------------------------------------------------------------------------- a reader that goes away
def test_a_reader_that_closes_stdout_does_not_stop_training(cfg_path, straight, tmp_path):
    """`catchat train ... | head -3`: the console goes silent, the run trains to its end, writes its
    final checkpoint and `end` event, exits 0 with nothing on stderr, and equals a straight run."""
    run, err = tmp_path / "run", tmp_path / "stderr.txt"
    with open(err, "w") as err_file:
        proc = _popen(["train", cfg_path, "--run-dir", run], stderr=err_file)
        lines = [proc.stdout.readline() for _ in range(3)]
        proc.stdout.close()  # the reader is gone: every later write meets EPIPE
        assert rows_logged(run) < TOTAL, "the reader closed only after the run ended: the test saw nothing"
        assert proc.wait(timeout=HANG_GUARD) == 0, err.read_text()
    assert all(lines) and err.read_text() == ""
    end = _last_event(run)
    assert end["event"] == "end" and end["reason"] == "done" and end["global_step"] == TOTAL
    assert ck.load_checkpoint(run).global_step == TOTAL and rows_logged(run) == TOTAL
    assert_same_as_straight(run, straight)


def test_closed_stdout_and_stderr_together(cfg_path, tmp_path):
    """Both streams into one pipe whose reader closes: the run still ends done, exit 0."""
    run = tmp_path / "run"
    proc = _popen(["train", cfg_path, "--run-dir", run, "--set", "train.total_steps=12"])
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=HANG_GUARD) == 0
    assert _last_event(run)["reason"] == "done" and ck.load_checkpoint(run).global_step == 12


# --------------------------------------------------------------------------- SIGHUP, SIGTERM
@pytest.mark.parametrize("stop", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_sighup_stops_like_ctrl_c_then_resume_is_bitwise_identical(cfg_path, straight, tmp_path, stop):
    """A closed SSH session (SIGHUP), or `kill` (SIGTERM): the step in flight finishes, a checkpoint of
    every step logged, an `end` event naming the signal, exit 130 (as Ctrl-C); --resume ends bitwise
    equal to a straight run."""
    run = tmp_path / "run"
    proc = _popen(["train", cfg_path, "--run-dir", run])
    wait_for_rows(proc, run, 9)
    proc.send_signal(stop)
    out, _ = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and f"interrupted ({stop.name})" in out
    ckpt = ck.load_checkpoint(run)
    assert 0 < ckpt.global_step < TOTAL and ckpt.global_step == rows_logged(run)
    end = _last_event(run)
    assert end["event"] == "end" and end["reason"] == f"interrupted ({stop.name})"
    resume_cli(cfg_path, run)
    assert_same_as_straight(run, straight)


def test_a_terminal_that_hangs_up(cfg_path, tmp_path):
    """The real SSH case: the run's controlling terminal (a pty, the progress bar live on it) is
    closed: the kernel sends SIGHUP and every later write fails with EIO. The run stops after the
    step in flight with its checkpoint and `end` event, exit 130, as for SIGHUP alone."""
    import fcntl
    import pty
    import termios

    run = tmp_path / "run"
    master, slave = pty.openpty()

    def own_terminal():  # a session of its own whose controlling terminal is the pty, as an SSH login's
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([sys.executable, "-m", "catchat.cli", "train", str(cfg_path), "--run-dir", str(run)],
                            stdin=slave, stdout=slave, stderr=slave, preexec_fn=own_terminal)
    os.close(slave)
    shown = b""
    while b"tok/s" not in shown:  # the progress bar is up: training
        shown += os.read(master, 4096)
    os.close(master)  # the terminal hangs up
    assert proc.wait(timeout=HANG_GUARD) == 130
    end = _last_event(run)
    assert end["event"] == "end" and end["reason"] == "interrupted (SIGHUP)"
    assert ck.load_checkpoint(run).global_step == end["global_step"] == rows_logged(run)


def test_a_signal_that_lands_inside_the_progress_bars_lock_does_not_wait_for_it():
    """The handler says "stopping" from a thread of its own: a signal that lands while the main thread
    holds a lock the printing needs (the progress bar's, whose refresh thread may hold the console's
    and wait for it) returns at once, and the message comes once the lock is let go. Printing from
    the handler itself deadlocked a hung-up terminal's run (test_a_terminal_that_hangs_up, once)."""
    import threading

    from catchat.training.signals import StopSignals

    held, said, spoke = threading.Lock(), [], threading.Event()

    def report(kind, **fields):
        if threading.current_thread() is threading.main_thread():  # inside its own lock: would wait forever
            said.append(("said inside the lock", {}))
            return
        with held:
            said.append((kind, fields))
        spoke.set()

    stops = StopSignals(report)
    with held:  # the main thread inside the bar's lock when the signal comes
        stops.handle(signal.SIGHUP, None)
        assert stops.caught == "SIGHUP" and said == []
    assert spoke.wait(timeout=60)  # only against a hang: the lock is free now
    assert said == [("stopping", {"signal": "SIGHUP"})]
    with pytest.raises(KeyboardInterrupt):  # a second signal stops at once
        stops.handle(signal.SIGINT, None)


def test_under_nohup_sighup_is_left_ignored(cfg_path, tmp_path):
    """Started with SIGHUP ignored (nohup): the run was asked to outlive its terminal, and does."""
    run = tmp_path / "run"
    proc = _popen(["train", cfg_path, "--run-dir", run, "--set", "train.total_steps=12"], hangup=signal.SIG_IGN)
    wait_for_rows(proc, run, 3)
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 0, out
    assert _last_event(run)["reason"] == "done"


# --------------------------------------------------------------------------- Ctrl-C during imports
# Python code that sends this process SIGINT when it first imports MODULE, then runs the CLI: a
# Ctrl-C that lands exactly inside that import, every time.
_TRIP = textwrap.dedent("""
    import os, signal, sys
    module = sys.argv.pop(1)

    class Trip:
        def find_spec(self, name, path=None, target=None):
            if name == module:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, Trip())
    from catchat.cli import main
    main()
""")


@pytest.mark.parametrize("command", ["train", "inspect"])
@pytest.mark.parametrize("module", ["click", "rich.console", "catchat.cli.analysis", "numpy", "catchat.train"])
def test_ctrl_c_during_the_imports_is_one_line_and_exit_130(cfg_path, tmp_path, command, module):
    """Ctrl-C inside an import (catchat.cli's own, before main; or a command's, inside it): the one
    line "interrupted", exit 130, no traceback. inspect never imports catchat.train: it runs."""
    args = ["train", cfg_path, "--run-dir", tmp_path / "run"] if command == "train" else ["inspect", tmp_path]
    proc = _popen([module, *args], code=_TRIP, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=HANG_GUARD)
    assert "Traceback" not in out + err, err
    if command == "inspect" and module == "catchat.train":
        return  # never imported: the command ran (its own error on an empty directory)
    # one line (click ends a terminal's "^C" line with an empty one first, inside a command)
    assert proc.returncode == 130 and err.strip() == "interrupted", (proc.returncode, err)
    assert not (tmp_path / "run").exists()  # nothing was written


# Runs the CLI, saying "up" on stdout when catchat.cli starts importing click (its start-up handler
# is in place by then).
_UP = textwrap.dedent("""
    import sys

    class Up:
        def find_spec(self, name, path=None, target=None):
            if name == "click":
                sys.meta_path.remove(self)
                sys.stdout.write("up\\n")
                sys.stdout.flush()
            return None

    sys.meta_path.insert(0, Up())
    from catchat.cli import main
    main()
""")


@pytest.mark.parametrize("delay_ms", [0, 2, 5, 10, 20, 40, 70, 100, 150, 250])
def test_ctrl_c_at_a_real_early_moment(cfg_path, tmp_path, delay_ms):
    """The real thing: SIGINT at fixed short delays after catchat.cli's first lines have run (its
    first import, of click, says "up"), wherever start-up has got to then: "interrupted", exit 130,
    never a traceback. What comes before those lines (the interpreter's start, site and the
    environment's .pth files, finding the package: ~30 ms) is Python's own: docs/reliability.md."""
    proc = _popen(["train", cfg_path, "--run-dir", tmp_path / "run"], code=_UP, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == "up\n"
    time.sleep(delay_ms / 1000)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=HANG_GUARD)
    assert "Traceback" not in out + err, err
    assert proc.returncode == 130, (proc.returncode, err)


# --------------------------------------------------------------------------- Ctrl-C while shutting down
def test_ctrl_c_after_the_final_checkpoint_while_shutting_down(cfg_path, tmp_path):
    """A thread still running at exit holds the interpreter in threading._shutdown (the 1-in-22
    traceback of issue 39): a Ctrl-C there is ignored; the run ended done, exit 0."""
    code = ("import sys, threading, time\n"
            "threading.Thread(target=time.sleep, args=(4,)).start()\n"
            "from catchat.cli import main\nmain()\n")
    run = tmp_path / "run"
    proc = _popen(["train", cfg_path, "--run-dir", run, "--set", "train.total_steps=6"], code=code)
    out = ""
    while "run ended" not in out:
        line = proc.stdout.readline()
        assert line, out
        out += line
    time.sleep(1.0)  # past main(): the interpreter waits for the thread
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 0 and "Traceback" not in out + rest, out + rest
    assert _last_event(run)["reason"] == "done"


# --------------------------------------------------------------------------- Ctrl-C at any moment of start-up
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(os.path.dirname(sys.executable), "catchat")  # the venv's console script


def _launcher(bin_dir, *, env_can_block=True) -> str:
    """tools/install-launcher.sh's launcher in bin_dir; env_can_block=False: as installed where env has
    no --block-signal (a stand-in `env` that refuses it comes first on PATH while it installs)."""
    path = os.environ["PATH"]
    if not env_can_block:
        fake = bin_dir / "fake-env"
        fake.mkdir(parents=True)
        (fake / "env").write_text("#!/bin/sh\nexit 125\n")
        (fake / "env").chmod(0o755)
        path = f"{fake}:{path}"
    subprocess.run(["bash", os.path.join(ROOT, "tools", "install-launcher.sh"), str(bin_dir)], check=True,
                   capture_output=True, env={**os.environ, "PATH": path})
    text = (bin_dir / "catchat").read_text()
    assert ("--block-signal=INT" in text) == env_can_block, text
    return str(bin_dir / "catchat")


def _entry(kind, tmp_path) -> list[str]:
    return {"launcher": lambda: [_launcher(tmp_path / "bin")],
            "launcher-without-blocking": lambda: [_launcher(tmp_path / "bin", env_can_block=False)],
            "console-script": lambda: [SCRIPT],
            "module": lambda: [sys.executable, "-m", "catchat.cli"],
            "package": lambda: [sys.executable, "-m", "catchat"]}[kind]()


def _start(cmd, env=None):
    """The command as a shell starts it: SIGINT at its default (whatever the test runner's is)."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.parametrize("entry", ["launcher", "launcher-without-blocking", "console-script", "module", "package"])
@pytest.mark.parametrize("point", ["start.package", "start.imported", "start.main"])
def test_ctrl_c_at_each_start_up_point_of_each_entry(straight, tmp_path, entry, point):
    """SIGINT exactly at catchat's first line (the package, its handler just installed), after
    catchat.cli's imports, and in main() before the command's handlers (CATCHAT_CRASH_AT=POINT:INT):
    from every entry point, the one line "interrupted", exit 130."""
    proc = _start([*_entry(entry, tmp_path), "scan", str(straight)], env={"CATCHAT_CRASH_AT": f"{point}:INT"})
    out, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 130 and err == "interrupted\n" and not out, (proc.returncode, out, err)


@pytest.mark.parametrize("entry", ["launcher", "launcher-without-blocking"])
def test_ctrl_c_at_any_moment_through_the_launcher(straight, tmp_path, entry):
    """SIGINT at 24 moments spread over a whole `catchat scan` (its start-up measured first, so the
    spread fits the machine's speed; no assertion depends on where a signal lands): never a
    traceback; exit 130 with "interrupted", or killed by SIGINT before the launcher's first line (a
    shell shows 130, nothing is printed), or 0 when it came after the end (or, without blocking,
    in the interpreter's start, where it is ignored)."""
    cmd = [*_entry(entry, tmp_path), "scan", str(straight)]
    began = time.monotonic()
    assert _start(cmd).wait(timeout=HANG_GUARD) == 0
    whole = time.monotonic() - began
    codes = set()
    for k in range(24):
        proc = _start(cmd)
        time.sleep(whole * k / 20)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=HANG_GUARD)
        assert "Traceback" not in out + err and "Fatal" not in err, (k, err)
        assert proc.returncode in (0, 130, -signal.SIGINT), (k, proc.returncode, err)
        if proc.returncode == 130:
            assert err.strip() == "interrupted", (k, err)
        elif proc.returncode == -signal.SIGINT:
            assert not err, (k, err)
        codes.add(proc.returncode)
    assert codes - {0}, "no SIGINT landed while the command ran"


# A command whose Ctrl-C Python cannot raise as it is: KeyboardInterrupt inside a finalizer (Python
# prints "Exception ignored in" and goes on) or wrapped (3.11: RuntimeError "Error calling __set_name__"
# when it lands while a class body is made; what one try of the test above met).
_ODD_PLACES = textwrap.dedent("""
    import sys, time
    from catchat.cli import cli, main

    class Finalized:
        def __del__(self):
            raise KeyboardInterrupt

    class Named:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    @cli.command()
    def finalizer():
        Finalized()
        time.sleep(60)  # not reached: the Ctrl-C ends the process in the finalizer

    @cli.command()
    def class_body():
        type("Made", (), {"field": Named()})

    sys.argv = ["catchat", sys.argv[1]]
    main()
""")


@pytest.mark.parametrize("command", ["finalizer", "class-body"])
def test_a_ctrl_c_python_cannot_raise_where_it_lands(command):
    proc = _popen([command], code=_ODD_PLACES, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 130 and err.strip() == "interrupted", (proc.returncode, out, err)
