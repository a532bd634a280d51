"""The environment variables catchat reads: one table (catchat/environment.py), every name the code
uses in it and on docs/environment.md, and a name catchat never reads called out (a typo)."""

import re
from pathlib import Path

from catchat import environment
from catchat.cli.doctor import environment_check
from catchat.data.corpus import store

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"CATCHAT_[A-Z0-9_]*[A-Z0-9]")
NOT_VARIABLES = {"CATCHAT_SLOTS_GLSL"}  # a GLSL include guard in a generated header, not an environment variable


def names_in(paths) -> set[str]:
    return {n for p in paths for n in NAME.findall(p.read_text(encoding="utf-8"))}


def test_the_table_holds_every_variable_the_code_reads_and_no_other():
    code = [*(ROOT / "catchat").rglob("*.py"), *(ROOT / "tools").glob("*.py"), *(ROOT / "tools").glob("*.sh")]
    used = names_in(code) - NOT_VARIABLES
    assert used == set(environment.VARIABLES), (sorted(used - set(environment.VARIABLES)),
                                                sorted(set(environment.VARIABLES) - used))
    assert {kind for kind, _ in environment.VARIABLES.values()} == {environment.USER, environment.MEASURE,
                                                                    environment.TEST}
    assert set(environment.PATHS) <= set(environment.VARIABLES)


def test_the_docs_page_has_a_row_for_each_and_names_no_other():
    page = (ROOT / "docs" / "environment.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(CATCHAT_[A-Z0-9_]+)`", page, re.MULTILINE))
    assert rows == set(environment.VARIABLES)
    typo = {"CATCHAT_WAVEFRNT"}  # the page's example of the warning
    assert names_in([ROOT / "docs" / "environment.md"]) - typo <= set(environment.VARIABLES)


def test_a_name_catchat_never_reads_is_found_with_the_nearest_real_one():
    env = {"CATCHAT_WAVEFRNT": "8", "CATCHAT_DEVICE": "0", "CATCHAT_ZZZ": "1", "PATH": "/bin"}
    assert environment.unknown(env) == [("CATCHAT_WAVEFRNT", "CATCHAT_WAVEFRONT"), ("CATCHAT_ZZZ", None)]
    lines = environment.unknown_lines(env)
    assert "did you mean CATCHAT_WAVEFRONT?" in lines[0] and "changes nothing" in lines[0]
    assert "docs/environment.md" in lines[1]
    assert environment.unknown({"CATCHAT_DEVICE": "0"}) == []


def test_settings_are_what_makes_a_run_differ_not_where_files_go():
    env = {"CATCHAT_WAVEFRONT": "8", "CATCHAT_TUNE": "0", "CATCHAT_CACHE": "/c", "CATCHAT_GLSLC_NEWER": "/g",
           "CATCHAT_TYPO": "1", "HOME": "/root"}
    assert environment.settings(env) == {"CATCHAT_TUNE": "0", "CATCHAT_WAVEFRONT": "8"}


def test_every_command_warns_of_an_unknown_name_and_still_runs(cli, monkeypatch):
    monkeypatch.setenv("CATCHAT_WAVEFRNT", "8")
    code, out, err = cli("corpus", "plays")
    assert code == 0 and "Macbeth" in out
    assert err.splitlines()[0].startswith("warning: CATCHAT_WAVEFRNT is set, but catchat reads no such variable")
    monkeypatch.delenv("CATCHAT_WAVEFRNT")
    code, out, err = cli("corpus", "plays")
    assert code == 0 and "CATCHAT_" not in err


def test_doctor_fails_on_an_unknown_name_and_lists_what_is_set(monkeypatch):
    monkeypatch.setenv("CATCHAT_PERSISTNT", "0")
    check = environment_check()
    assert not check.ok and "did you mean CATCHAT_PERSISTENT?" in check.detail and "unset it" in check.fix
    monkeypatch.delenv("CATCHAT_PERSISTNT")
    monkeypatch.setenv("CATCHAT_PERSISTENT", "0")
    check = environment_check()
    assert check.ok and "CATCHAT_PERSISTENT=0" in check.detail and "CATCHAT_TUNE=0" in check.detail


def test_one_cache_root_and_the_older_name_still_read_for_corpora(monkeypatch, tmp_path):
    for name in ("CATCHAT_CACHE", "CATCHAT_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store.cache_root() == environment.cache_root() == tmp_path / "xdg" / "catchat"
    monkeypatch.setenv("CATCHAT_CACHE_DIR", str(tmp_path / "old"))
    assert store.cache_root() == tmp_path / "old"
    monkeypatch.setenv("CATCHAT_CACHE", str(tmp_path / "new"))
    assert store.cache_root() == environment.cache_root() == tmp_path / "new"
