"""The README's first lines as a new user meets them: its first block is the two commands (`make demo`,
`make test`), and the block it says to type next runs as written, in a shell where `catchat` comes
from the launcher `make setup` installs (tools/install-launcher.sh), not from an activated venv."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- tests/test_readme.py runs the next block's lines as written -->"


def _blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.DOTALL)


def test_the_first_lines_are_the_two_commands():
    first = _blocks((ROOT / "README.md").read_text())[0]
    commands = [line.split("#")[0].strip() for line in first.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


def test_the_commands_after_setup_run_as_written(tmp_path):
    readme = (ROOT / "README.md").read_text()
    assert MARKER in readme, "the README lost the block of first commands this test runs"
    block = _blocks(readme.split(MARKER, 1)[1])[0]
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines and all(line.startswith("catchat ") for line in lines)
    bin_dir = tmp_path / "bin"
    installed = subprocess.run(["bash", str(ROOT / "tools/install-launcher.sh"), str(bin_dir)],
                               capture_output=True, text=True, check=True)
    assert "catchat" in installed.stdout
    # a new user's shell: system directories and the launcher's, no venv on PATH, not in the checkout
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{bin_dir}:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
    for line in lines:
        res = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600)
        assert res.returncode == 0, f"`{line}` exited {res.returncode}: {res.stdout[-500:]}{res.stderr[-500:]}"
        assert res.stdout.strip(), f"`{line}` printed nothing"


def test_the_launcher_leaves_a_foreign_catchat_alone(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "catchat").write_text("#!/bin/sh\necho someone else's\n")
    res = subprocess.run(["bash", str(ROOT / "tools/install-launcher.sh"), str(bin_dir)],
                         capture_output=True, text=True, check=True)
    assert "left alone" in res.stderr
    assert "someone else's" in (bin_dir / "catchat").read_text()
