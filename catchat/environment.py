"""Every environment variable catchat reads, in one table (docs/environment.md is its page;
tests/test_environment.py checks that the code, this table and that page name the same variables).

Three kinds: `user` (where things are, which device, how long to wait), `measure` (switches that force
one kernel variant or design, for comparisons and parity: an unset one leaves the program's choice)
and `test` (fault injection and the test suite's own hooks). A CATCHAT_ name catchat never reads is
most often a typo that silently changes nothing: `unknown` finds them, with the nearest real name, for
the warning every command prints and for `catchat doctor`."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path

PREFIX = "CATCHAT_"
USER, MEASURE, TEST = "user", "measure", "test"

VARIABLES: dict[str, tuple[str, str]] = {
    # where, which device, how long
    "CATCHAT_DEVICE": (USER, "the Vulkan device by index or name substring (--device wins; under mpiexec a "
                             "comma list)"),
    "CATCHAT_CACHE": (USER, "catchat's cache directory: compiled SPIR-V, tuning tables, built corpora, the kp wheel "
                            "(default $XDG_CACHE_HOME/catchat, else ~/.cache/catchat)"),
    "CATCHAT_CACHE_DIR": (USER, "the older name of CATCHAT_CACHE, still read for built corpora where CATCHAT_CACHE "
                                "is unset"),
    "CATCHAT_TUNE": (USER, "0 ignores the tuning cache that `catchat bench --tune` wrote (the tables' choices)"),
    "CATCHAT_GLSLC_NEWER": (USER, "the newer glslc for the cooperative_matrix2 shaders (default: the one `make setup` "
                                  "fetched into the cache)"),
    "CATCHAT_MPI_TIMEOUT": (USER, "seconds a rank waits on the others before the run stops with one line "
                                  "(default 600)"),
    "CATCHAT_EXCHANGE_THREADS": (USER, "threads per rank for the float16 gradient exchange's casts (default: the "
                                       "usable CPUs, at most 8)"),
    # one design or kernel variant forced, to measure or to check parity
    "CATCHAT_PERSISTENT": (MEASURE, "0: a dispatch per timestep; N: persistent sweeps of N workgroups"),
    "CATCHAT_SWEEP_COOP": (MEASURE, "the fp16 sweeps' design: resident, mixed (forward resident, backward "
                                    "streamed), stream, stream32 (streamed both ways, float32 saves; the default "
                                    "over 2+ layers where each sweep fits half the SMs), 1 (the default) or 0 "
                                    "(none on tensor cores)"),
    "CATCHAT_SWEEP_STREAM32": (MEASURE, "1 streams the fp32 sweeps where the resident tiles fit too; 0 never"),
    "CATCHAT_SWEEP_BIAS": (MEASURE, "0: the bias gradients as column sums over the rows after the backward sweep, "
                                    "not summed in it (streamed and resident sweeps)"),
    "CATCHAT_TOKEN_SUM_PARTS": (MEASURE, "N: the embedding's and table0's token sums in N row parts (1: one "
                                         "dispatch; default by the device)"),
    "CATCHAT_STREAM_FLAGS": (MEASURE, "1 or 0: the streamed sweeps wait on block flags, or on the grid barrier"),
    "CATCHAT_STREAM_DEPTH": (MEASURE, "F,B: the streamed fp16 sweeps' W_hh ring depths (forward, backward; "
                                       "the split forward's too, default 4)"),
    "CATCHAT_STREAM_RESIDENT": (MEASURE, "F,B: W_hh fragments the streamed fp16 sweeps keep in registers"),
    "CATCHAT_STREAM_KSPLIT": (MEASURE, "0: the streamed backward without its k-split (fp16 and fp32: on where it "
                                       "applies); 1: with it"),
    "CATCHAT_STREAM_SHARED": (MEASURE, "F,B: W_hh fragments the streamed fp16 sweeps keep in shared memory"),
    "CATCHAT_STREAM_BLOCKED": (MEASURE, "0: the streamed sweeps read W_hh row-major instead of in blocks"),
    "CATCHAT_FRAG_H": (MEASURE, "1 or 0: the streamed tensor-core forward's h_prev shadow in its fragments' own "
                                "order (one 16-byte load an invocation), or in blocks"),
    "CATCHAT_FRAG_W": (MEASURE, "1 or 0: the streamed forward's W_hh and the tensor-core decode step's weights "
                                "in their fragments' own order (one 16-byte load an invocation), or in blocks"),
    "CATCHAT_STREAM_PROBE": (MEASURE, "timing probes that skip loads (1: W_hh, 2: h_prev / dGh): wrong results"),
    "CATCHAT_STREAM_WCACHE": (MEASURE, "restrict or l2: the float16 sweeps' W_hh copy readonly restrict, or past L1"),
    "CATCHAT_STREAM32_DEPTH": (MEASURE, "N: the streamed fp32 backward's register ring depth (its k-split's too)"),
    "CATCHAT_GEMM32_SPLIT": (MEASURE, "0: a float32 program's GEMMs on the FMAs, not its large ones on tensor cores "
                                      "from float16 splits; 1: every one split (emulated without tensor cores)"),
    "CATCHAT_STREAM32_SPLIT": (MEASURE, "0: a float32 program's streamed forward on the FMAs, not on tensor "
                                        "cores from float16 splits of W_hh and h_prev (x = hi + 2^-11 lo)"),
    "CATCHAT_RESIDENT_SPLIT": (MEASURE, "1: a float32 program's register-resident forward sweeps (v3) on tensor cores "
                                        "from float16 splits of W_hh and h_prev, not on the FMAs (0, the default)"),
    "CATCHAT_STREAM32_SUBGROUP": (MEASURE, "0: the streamed fp32 backward's stages synced by workgroup barriers"),
    "CATCHAT_OVERLAP_DW": (MEASURE, "0: layer l's dW_hh in its place, not beside layer l-1's backward sweep"),
    "CATCHAT_WAVEFRONT": (MEASURE, "N: the forward and a training step's backward as wavefronts over the layers, "
                                   "in N chunks (1: layer by layer; unset: each direction in 4 where two of its "
                                   "sweeps fit the GPU at once, else layer by layer)"),
    "CATCHAT_WAVEFRONT_FORWARD": (MEASURE, "0: the wavefront's forward layer by layer"),
    "CATCHAT_WAVEFRONT_BACKWARD": (MEASURE, "0: the wavefront's backward layer by layer"),
    "CATCHAT_COOP_API": (MEASURE, "nv: the tensor-core GEMM on VK_NV_cooperative_matrix instead of the KHR one"),
    "CATCHAT_SWEEP_API": (MEASURE, "nv or khr: the tensor-core sweeps' and decode step's fragments on "
                                   "VK_NV_cooperative_matrix or VK_KHR_cooperative_matrix (unset: khr where it runs, "
                                   "but the register-resident sweeps nv until measured)"),
    "CATCHAT_COOPMAT2": (MEASURE, "1: the workgroup-scope GEMM (VK_NV_cooperative_matrix2) first where it runs, "
                                  "and its parity cases; 0: never"),
    "CATCHAT_DECODE": (MEASURE, "generation's step: fused, fused16, batched, coop (tensor cores), persistent, "
                                 "persistent16 (a chunk in one dispatch) or auto"),
    "CATCHAT_DECODE_TILE": (MEASURE, "the fused decode step's stream tile: 1, 2, 4, 8, 16 or 32"),
    "CATCHAT_DECODE_COOP_STREAMS": (MEASURE, "the tensor-core decode step's streams per workgroup: 16, 32 or 64"),
    "CATCHAT_DECODE_COOP_SUBGROUPS": (MEASURE, "the tensor-core decode step's subgroups per workgroup at most: 8 or "
                                               "16 (more k parts at once)"),
    "CATCHAT_DECODE_COOP_PROBE": (MEASURE, "timing probes of the tensor-core decode step (1: no W loads, "
                                            "2: no h16 / y16 loads): wrong results"),
    # fault injection and the tests' hooks
    "CATCHAT_FAULT": (TEST, "faults a real run meets on purpose, e.g. nan_grad@step=3 (docs/reliability.md)"),
    "CATCHAT_CRASH_AT": (TEST, "POINT[#K][:SIGNAL]: kill the process at a named point (the crash tests)"),
    "CATCHAT_MPI_FAKE_HOSTS": (TEST, "N: deal the ranks out to N pretend hosts (the hierarchical exchange's tests)"),
    "CATCHAT_SPIRV_RECORD": (TEST, "a file every shader variant asked for is appended to (tools/build_spirv.py)"),
    "CATCHAT_LAUNCHER_HELD_SIGINT": (TEST, "set by the installed launcher: Ctrl-C was held until catchat's first line"),
}


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    """The environment to read: the one given (tests), else this process's."""
    return os.environ if environ is None else environ


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """catchat's user cache: $CATCHAT_CACHE, else $XDG_CACHE_HOME/catchat, else ~/.cache/catchat."""
    env = _env(environ)
    return Path(env.get("CATCHAT_CACHE") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "catchat"))


def unknown(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """(name, the nearest variable catchat reads or None) for every set CATCHAT_ name it never reads."""
    env = _env(environ)
    return [(name, next(iter(difflib.get_close_matches(name, VARIABLES, n=1, cutoff=0.75)), None))
            for name in sorted(env) if name.startswith(PREFIX) and name not in VARIABLES]


def unknown_lines(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per unknown name: what it is and what to do."""
    return [f"{name} is set, but catchat reads no such variable: it changes nothing"
            + (f" (did you mean {near}?)" if near else " (docs/environment.md lists them)")
            for name, near in unknown(environ)]


PATHS = ("CATCHAT_CACHE", "CATCHAT_CACHE_DIR", "CATCHAT_GLSLC_NEWER", "CATCHAT_SPIRV_RECORD")  # where, not how


def settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every variable catchat reads that is set here, but those naming paths: what makes this process run
    other than by default (doctor shows them; `catchat bench --json` and `catchat parity --json` record them)."""
    env = _env(environ)
    return {name: env[name] for name in sorted(env) if name in VARIABLES and name not in PATHS}


def settings_text(environ: Mapping[str, str] | None = None) -> str:
    """`settings` as one "NAME=VALUE, ..." phrase ("" where none is set), as doctor and bench print it."""
    return ", ".join(f"{k}={v}" for k, v in settings(environ).items())
