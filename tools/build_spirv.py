#!/usr/bin/env python3
"""The SPIR-V a wheel ships: the list of shader variants, and their compilation at wheel-build time.

    python tools/build_spirv.py build DEST     # DEST/glsl (the GLSL) + DEST/spirv/NAME-KEY.spv
    python tools/build_spirv.py record [--replace] [--python PY] [--config CONFIG ...]
                                               # run catchat's workloads on this machine's default
                                               # device and add every variant they compile to the list

A variant is a shader plus its defines (catchat/vk/shaders.py); which ones run depends on the
model's sizes and the device (tiles, subgroup size, SMs), so they cannot all be known at build
time. tools/spirv-variants.txt lists those that the shipped workloads use (doctor, parity, and
each config's training, eval and generation), recorded by `record` on each device kind we have run
(lavapipe with configs/tiny.toml; an H200 with all three configs, 2026-12; re-run it on a new kind
of GPU to add its variants). `build` (setup.py's build_py runs it) compiles every listed variant
with glslc into the wheel (through the user cache, as the runtime does: a variant compiled on this
machine before is copied, one compiled for the wheel is kept there; where the cache cannot be written,
straight into the wheel), and copies the GLSL too, so a variant
not on the list is compiled into the user cache at run time, where glslc is installed. The list
holds variants, not keys: keys are computed here at build time (and again at run time), so a change
of the key scheme or of a generated include needs no re-record. Generated includes (slots.glsl,
from catchat/vk/slots.py) are not copied: the installed package makes them at every compile.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ROOT / "tools" / "spirv-variants.txt"
sys.path.insert(0, str(ROOT))

from catchat.vk import shaders  # noqa: E402  (stdlib, catchat.errors, catchat.vk.slots: no numpy at build time)


def read_variants(path: Path = VARIANTS) -> list[tuple[str, dict[str, str]]]:
    """The variants listed in `path` (blank lines and # comments skipped)."""
    lines = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
    return [shaders.parse_variant(ln) for ln in lines if ln]


def build(dest: Path, variants_file: Path = VARIANTS) -> int:
    """Copy glsl/ to DEST/glsl and compile every listed variant to DEST/spirv/NAME-KEY.spv (the
    generated includes, which are no files in glsl/, come from catchat/vk/shaders.py); returns the number
    of variants. Fails (ShaderCompileError) on the first that does not compile."""
    dest = Path(dest)
    glsl_out, spirv_out = dest / "glsl", dest / "spirv"
    for d in (glsl_out, spirv_out):
        shutil.rmtree(d, ignore_errors=True)
    (glsl_out / "include").mkdir(parents=True)
    spirv_out.mkdir(parents=True)
    for src in sorted(shaders.GLSL_DIR.glob("*.comp")) + sorted(shaders.INCLUDE_DIR.glob("*.glsl")):
        shutil.copy2(src, glsl_out / src.relative_to(shaders.GLSL_DIR))
    variants = read_variants(variants_file)
    # through the user cache, where it can be written (not in a packager's sandbox without a home): one
    # compiled here is kept for the runtime, which then compiles none of the wheel's variants again
    try:
        shaders.cache_dir().mkdir(parents=True, exist_ok=True)
        cache_ok = os.access(shaders.cache_dir(), os.W_OK)
    except OSError:
        cache_ok = False

    def one(variant):
        name, defines = variant
        path = shaders.GLSL_DIR / f"{name}.comp"
        if not path.exists():
            raise SystemExit(f"{variants_file.name}: no shader {name!r} (glsl/{name}.comp)")
        key = shaders.variant_key(path, defines)
        out = spirv_out / f"{name}-{key}.spv"
        if cache_ok:  # a variant this machine compiled (same sources, defines, flags, glslc) is copied
            shutil.copyfile(shaders.compile_cached(path, defines, key), out)
        else:
            shaders.glslc(path, defines, out)

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        list(pool.map(one, variants))
    return len(variants)


def workloads(tmp: str, configs: list[str], overrides: list[str] = ()) -> list[list[str]]:
    """The catchat commands whose shader variants a wheel ships prebuilt: doctor, parity, and for each
    config two training steps with evals (and the `--set` overrides), eval and generation (`talk`
    reads a line from stdin)."""
    out = [["doctor"], ["parity"]]
    sets = [a for o in overrides for a in ("--set", o)]
    for i, cfg in enumerate(configs):
        run = f"{tmp}/run{i}"
        out += [
            ["train", cfg, "--run-dir", run, "--stop-after-steps", "2",
             "--set", "eval.eval_every_seqs=1", "--set", "eval.eval_windows=1", *sets],
            ["eval", run, "--windows", "1"],
            ["sample", run, "--speaker", "ROMEO", "--prompt", "", "--length", "40", "--seed", "1"],
            ["sample", run, "--prompt", "x" * 150, "--length", "10", "--num", "4"],
            ["talk", run, "--length", "20"],
        ]
    return out


def record(python: str, replace: bool, configs: list[str], overrides: list[str] = ()) -> int:
    """Run the workloads with CATCHAT_SPIRV_RECORD set, then merge (or with `replace`, set) the list."""
    failed = []
    with tempfile.TemporaryDirectory(prefix="catchat-spirv-") as tmp:
        log = Path(tmp) / "variants.txt"
        log.touch()
        env = {**os.environ, shaders.ENV_RECORD: str(log)}
        for args in workloads(tmp, configs, overrides):
            print("+ catchat", " ".join(a if len(a) < 40 else a[:12] + "..." for a in args), flush=True)
            res = subprocess.run([python, "-m", "catchat", *args], cwd=ROOT, env=env, text=True, check=False,
                                 input="good morrow\n" if args[0] == "talk" else None,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if res.returncode != 0:  # keep going: the others' variants still count
                failed.append(f"catchat {args[0]} failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
                print(failed[-1], file=sys.stderr)
        seen = {ln.strip() for ln in log.read_text().splitlines() if ln.strip()}
    old = {shaders.format_variant(*v) for v in read_variants()} if VARIANTS.exists() and not replace else set()
    header = [ln for ln in VARIANTS.read_text().splitlines() if ln.startswith("#")] if VARIANTS.exists() else []
    VARIANTS.write_text("\n".join(header + sorted(old | seen)) + "\n")
    print(f"{len(seen)} variants used here, {len(seen - old)} new; "
          f"{len(old | seen)} listed in {VARIANTS.relative_to(ROOT)}")
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the listed variants into DEST/spirv, copy the GLSL to DEST/glsl")
    b.add_argument("dest", type=Path)
    b.add_argument("--variants", type=Path, default=VARIANTS)
    r = sub.add_parser("record", help="add the variants catchat's workloads use on this device to the list")
    r.add_argument("--python", default=sys.executable, help="the interpreter with catchat installed")
    r.add_argument("--replace", action="store_true", help="replace the list instead of adding to it")
    r.add_argument("--config", action="append", default=None,
                   help="a config to train, evaluate and sample (repeatable; default configs/tiny.toml)")
    r.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                   help="a config override for every training run, e.g. data.corpus=DIR (repeatable)")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        n = build(args.dest, args.variants)
        print(f"{n} SPIR-V variants in {args.dest / 'spirv'}")
        return 0
    return record(args.python, args.replace, args.config or ["configs/tiny.toml"], args.overrides)


if __name__ == "__main__":
    sys.exit(main())
