"""tools/stream_variants.py's knobs: a variant names what it changes and leaves the rest to the program, so
its rows compare with what `catchat train` runs (a forward timed without the block flags the program uses
read 1.2 ms a layer slow at v5 until 2026-12-07)."""

from catchat.vk.kernels import gru
from catchat.vk.switches import env_override

from support import load_tool


def tool():
    return load_tool("stream_variants")


def test_a_variant_without_flags_keeps_the_programs_block_flags():
    knobs = tool().knobs("2,20/2,4")
    assert knobs == {gru.RESIDENT_ENV: "2,20", gru.DEPTH_ENV: "2,4", gru.SHARED_ENV: "0,0", gru.FLAGS_ENV: ""}
    with env_override(gru.FLAGS_ENV, knobs[gru.FLAGS_ENV]):  # the program's default: block flags on
        assert gru.stream_flags() and gru.stream_tiles(32, 2048, False).flags
    with env_override(gru.FLAGS_ENV, "0"):
        assert not gru.stream_tiles(32, 2048, False).flags
    assert tool().knobs("2,12/2,4/0,3/0")[gru.FLAGS_ENV] == "0"
    assert tool().knobs("2,12/2,4/0,3/1")[gru.FLAGS_ENV] == "1"
