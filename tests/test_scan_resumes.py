"""`catchat scan` on a run's lineage: resumes from another run's checkpoint, branches, a kill between a
checkpoint's rename and its event, and metrics.csv truncated from outside before a resume (issue 39)."""


from catchat.analysis.scan import FAIL, OK, WARN, scan_run

from scan_runs import make_run, plant, write


def _resume_from(tmp_path, name, source, **extra):
    rows, events = make_run(tmp_path / name, resumes=(40,))
    e = next(e for e in events if e["event"] == "resume")
    e.update({"from": source, **extra})
    write(tmp_path / name, rows, events)
    return scan_run(tmp_path / name).finding("resume signatures")


def test_resume_from_another_runs_checkpoint_is_a_warning(tmp_path, monkeypatch):
    other = str(tmp_path / "other" / "checkpoints" / "step-0000040")
    f = _resume_from(tmp_path, "a", other)
    assert f.status == WARN and f"step 40: resumed from another run's checkpoint {other}" in f.detail
    assert "did not log" not in f.detail
    monkeypatch.chdir(tmp_path)  # the trainer writes the path as it was given: relative to its cwd
    assert _resume_from(tmp_path, "b", "b/checkpoints/step-0000040").status == OK
    assert _resume_from(tmp_path, "c", "other/checkpoints/step-0000040").status == WARN
    assert _resume_from(tmp_path, "d", "d/checkpoints/../../other/checkpoints/step-0000040").status == WARN
    assert _resume_from(tmp_path, "e", "e/checkpoints/step-0000040", foreign=True).status == WARN  # its word
    assert _resume_from(tmp_path, "f", "/elsewhere/step-0000040", foreign=False).status == OK
    assert _resume_from(tmp_path, "g", "x\0/step-0000040").status == WARN  # not a usable path


def test_a_run_started_from_another_runs_checkpoint(tmp_path):
    """The trainer starts new telemetry there: the rows begin after the foreign checkpoint's step."""
    rows, events = make_run(tmp_path / "r", resumes=(40,))
    i = next(i for i, e in enumerate(events) if e["event"] == "resume")
    events = events[i:]
    events[0].update({"from": str(tmp_path / "other" / "checkpoints" / "step-0000040"), "foreign": True})
    write(tmp_path / "r", rows[40:], events)
    report = scan_run(tmp_path / "r")
    assert report.finding("step sequence").status == OK and "steps 41..90" in report.finding("step sequence").detail
    assert report.finding("resume signatures").status == WARN and not report.defects


def _branch(step, abandoned):
    return dict(event="branch", global_step=step, time=1.0, **{"from": f"step-{step:07d}"}, branch_step=step,
                abandoned_step=abandoned, side_dir=f"branches/01-after-step-{step:07d}", abandoned_checkpoints=[],
                abandoned_rows=abandoned - step)


def test_a_branch_is_not_a_defect(tmp_path):
    """Resuming from an older checkpoint (a branch): the trainer moves the abandoned rows and events
    aside and logs `branch`; should the abandoned rows still be in metrics.csv, the steps go back to
    the branch step + 1 and those rows are dropped rather than called a defect."""
    rows, events = make_run(tmp_path / "a", resumes=(20,))
    i = next(i for i, e in enumerate(events) if e["event"] == "resume")
    events.insert(i, _branch(20, 50))
    write(tmp_path / "a", rows, events)
    report = scan_run(tmp_path / "a")
    assert all(f.status == OK for f in report.findings), [(f.check, f.status, f.detail) for f in report.findings]
    assert "branched at step 20 from step-0000020: steps 21..50 abandoned, kept in branches/01-after-step-0000020" \
        in report.finding("step sequence").detail

    abandoned = [dict(r, loss="9.000000", tokens_per_s="10.0") for r in rows[20:50]]
    write(tmp_path / "a", rows[:50] + rows[20:], events)  # 1..50 then 21..90: the old rows not moved aside
    write(tmp_path / "a", rows[:20] + abandoned + rows[20:], events)
    report = scan_run(tmp_path / "a")
    assert all(f.status == OK for f in report.findings), [(f.check, f.status, f.detail) for f in report.findings]
    assert report.rows == 90 and "dropped after step(s) 20" in report.finding("step sequence").detail

    events.remove(events[i])  # the same rewind without a branch event: rows not truncated on resume
    write(tmp_path / "a", rows[:20] + abandoned + rows[20:], events)
    f = scan_run(tmp_path / "a").finding("step sequence")
    assert f.status == FAIL and "row 51 has step 21 after step 50" in f.detail and "logged more than once" in f.detail


# ---------------------------------------------------------------------------------------------
# a kill between a checkpoint's rename and its event; metrics.csv truncated from outside (issue 39)
# ---------------------------------------------------------------------------------------------

def _killed_after_save(tmp_path, name, *, end=False, on_disk=False):
    """A run whose first process was SIGKILLed right after renaming step-0000040 into place, before
    its `checkpoint` event (and so before any `end`), then resumed from it: the events file as the
    resumed trainer leaves it (the killed process's events after step 40 trimmed)."""
    rows, events = make_run(tmp_path / name, resumes=(40,))
    i = next(i for i, e in enumerate(events) if e["event"] == "resume")
    events[:] = [e for j, e in enumerate(events)
                 if not (e["event"] == "checkpoint" and e["global_step"] == 40)
                 and not (e["event"] == "end" and j < i and not end)]
    if on_disk:
        (tmp_path / name / "checkpoints" / "step-0000040").mkdir(parents=True)
    write(tmp_path / name, rows, events)
    return scan_run(tmp_path / name)


def test_a_checkpoint_whose_event_a_kill_cut_off_is_no_warning(tmp_path):
    """3 of 56 resumed runs warned 'resumed from a checkpoint this run did not log': a kill after the
    save's rename and before its event leaves just that. The killed process (no end event) reached the
    step: the checkpoint is its own, a note in the ok row."""
    report = _killed_after_save(tmp_path, "a")
    f = report.finding("resume signatures")
    assert f.status == OK, f.detail
    assert "did not log" not in f.detail
    assert "step 40: its checkpoint has no checkpoint event: the process before was killed right after saving it" \
        in f.detail
    assert not report.defects and report.finding("run end").status == OK

    # the process before ended (an end event): it would have logged its save, so the warning stands
    f = _killed_after_save(tmp_path, "b", end=True).finding("resume signatures")
    assert f.status == WARN and "step 40: resumed from a checkpoint this run did not log" in f.detail


def test_a_killed_saves_step_on_disk_when_its_row_is_gone(tmp_path):
    """Without the saved step's row (lost from metrics.csv), the checkpoint on disk shows the killed
    process reached the step: no warning for the missing event; the lost row is the defect."""
    rows, events = make_run(tmp_path / "r", resumes=(40,))
    i = next(i for i, e in enumerate(events) if e["event"] == "resume")
    events = [e for j, e in enumerate(events) if not (e["event"] in ("checkpoint", "end") and j < i
                                                      and e["global_step"] == 40)]
    (tmp_path / "r" / "checkpoints" / "step-0000040").mkdir(parents=True)
    write(tmp_path / "r", rows[:39] + rows[40:], events)
    f = scan_run(tmp_path / "r").finding("resume signatures")
    assert f.status == FAIL and f.steps == [40], f.detail
    assert "did not log" not in f.detail and "killed right after saving it" in f.detail
    assert "metrics.csv holds 39 of the 40 rows logged up to it (missing from step 40)" in f.detail


def test_metrics_truncated_from_outside_before_a_resume_is_a_defect(tmp_path):
    """metrics.csv cut after step 25 while the run was stopped at 40: the resume from step-0000040 goes
    on from 41, so 15 rows the run logged are gone. The step check sees a gap; the resume check names
    the resume and the likely cause."""
    def truncated(rows, events):
        del rows[25:40]

    report = plant(tmp_path / "a", truncated)
    f = report.finding("resume signatures")
    assert f.status == FAIL and f.steps == [40], f.detail
    assert ("step 40: resumed from a checkpoint at step 40, but metrics.csv holds 25 of the 40 rows logged up to "
            "it (missing from step 26): rows lost, metrics.csv truncated or edited from outside?") in f.detail
    assert report.finding("step sequence").status == FAIL

    def middle(rows, events):  # a hole in the middle: the first missing step is named
        del rows[9:12]

    f = plant(tmp_path / "b", middle).finding("resume signatures")
    assert f.status == FAIL and "holds 37 of the 40 rows logged up to it (missing from step 10)" in f.detail

    def after(rows, events):  # rows lost after the resume are not the resume's business (the step check's)
        del rows[60:62]

    r = plant(tmp_path / "c", after)
    assert r.finding("resume signatures").status == OK and r.finding("step sequence").status == FAIL


def test_a_run_begun_from_another_runs_checkpoint_has_no_rows_before_it(tmp_path):
    """Its rows start after the foreign checkpoint's step: none is missing before a later resume."""
    rows, events = make_run(tmp_path / "r", resumes=(40, 60))
    i = next(i for i, e in enumerate(events) if e["event"] == "resume")
    events = events[i:]
    events[0].update({"from": str(tmp_path / "other" / "checkpoints" / "step-0000040"), "foreign": True})
    write(tmp_path / "r", rows[40:], events)
    f = scan_run(tmp_path / "r").finding("resume signatures")
    assert f.status == WARN and "rows logged" not in f.detail, f.detail


def test_real_kill_after_a_saves_rename_then_resume_scans_ok(cfg_path, tmp_path):
    """The trainer itself, killed at save.renamed (the checkpoint in place, no event yet) and resumed:
    what 3 of 56 resumed runs showed. The scan has no warning about the resume."""
    from support import catchat

    run = tmp_path / "run"
    r = catchat("train", cfg_path, "--run-dir", run, env={"CATCHAT_CRASH_AT": "save.renamed#2"})
    assert r.returncode == -9, r.stdout + r.stderr
    r = catchat("train", cfg_path, "--run-dir", run, "--resume")
    assert r.returncode == 0, r.stdout + r.stderr
    report = scan_run(run)
    f = report.finding("resume signatures")
    assert f.status == OK and "step 6: its checkpoint has no checkpoint event" in f.detail, f.detail
    assert not report.defects and not report.warnings, [(g.check, g.detail) for g in report.warnings]
