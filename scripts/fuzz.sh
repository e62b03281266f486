#!/usr/bin/env bash
# Runs sluice's fuzz targets (fuzz/fuzz_targets) with libFuzzer, each for a while.
#
#   scripts/fuzz.sh [--time SECONDS | --runs N] [--jobs N] [--build-only] [TARGET...]
#
#   --time S   run each target S seconds (default 20; the test command uses this)
#   --runs N   run each target N executions instead (the long runs in docs/results)
#   --jobs N   run N targets at a time, each on one CPU (default 1; the test command
#              uses 2, one per CPU of a 2-CPU machine)
#   --max-len B  inputs of at most B bytes (libFuzzer's default grows them to 4096)
#   --build-only build the targets, run none (the test command builds them while the
#              tests run, and runs them after)
#   TARGET     frame profile smc switch neigh config control (default: all)
#
# Needs the nightly toolchain (libFuzzer's coverage instrumentation); without one it says
# so and does nothing: the fuzz runs are skipped, the rest of the suite is not. cargo-fuzz
# is not needed: the targets are built here with the same instrumentation flags. `smc`,
# whose code under test reads shared memory with unsafe code, runs under
# AddressSanitizer; the others drive safe Rust (overflow checks and debug assertions on).
#
# Each target's corpus grows in fuzz/corpus/TARGET (seeded from fuzz/seeds/TARGET). A
# crash ends its target's run: its input is saved in fuzz/artifacts/TARGET/ and the
# command that replays it is printed; the other targets run on, and the script fails after
# them. Ends with one line per target: executions, coverage, corpus size.
set -euo pipefail
me="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/../fuzz"

ALL=(frame profile smc switch neigh config control)
mode=time
amount=20
jobs=1
build_only=false
targets=()
maxlen=()
while [ $# -gt 0 ]; do
    case "$1" in
        --time) mode=time; amount="${2:?--time needs seconds}"; shift 2 ;;
        --runs) mode=runs; amount="${2:?--runs needs a count}"; shift 2 ;;
        --jobs) jobs="${2:?--jobs needs a count}"; shift 2
            [[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --jobs needs a count of 1 or more" >&2; exit 2; } ;;
        --build-only) build_only=true; shift ;;
        --max-len) maxlen=(-max_len="${2:?--max-len needs bytes}"); shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$me" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *)
            if [[ " ${ALL[*]} " != *" $1 "* ]]; then
                echo "fuzz.sh: no target $1; the targets are: ${ALL[*]}" >&2
                exit 2
            fi
            targets+=("$1"); shift ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${ALL[@]}")

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: SKIPPED: no nightly toolchain (\`rustup toolchain install nightly\` enables the fuzz runs)"
    exit 0
fi

TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"
# The instrumentation cargo-fuzz uses for libFuzzer.
COVERAGE="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks \
-Cforce-frame-pointers"

want() { [[ " ${targets[*]} " == *" $1 "* ]]; }
plain=() names=()
for t in "${targets[@]}"; do [ "$t" = smc ] || { plain+=(--bin "$t"); names+=("$t"); }; done
if [ ${#plain[@]} -gt 0 ]; then
    echo "fuzz: building ${names[*]} (coverage, overflow checks)"
    RUSTFLAGS="$COVERAGE" cargo +nightly build --locked --quiet --release --target "$TRIPLE" \
        --target-dir target/plain "${plain[@]}"
fi
if want smc; then
    echo "fuzz: building smc (coverage, AddressSanitizer)"
    RUSTFLAGS="$COVERAGE -Zsanitizer=address" cargo +nightly build --locked --quiet --release --target "$TRIPLE" \
        --target-dir target/asan --no-default-features --bin smc
fi

if $build_only; then
    echo "fuzz: built ${targets[*]}"
    exit 0
fi

# One target's run: its log in artifacts/TARGET/last-run.log, its summary line in
# artifacts/TARGET/last-run.summary; a crash is reported, and the status is non-zero.
run_target() {
    local t="$1" dir=plain bin log seeds=() dict=() limit=() what runs cov corpus crash
    [ "$t" = smc ] && dir=asan
    bin="target/$dir/$TRIPLE/release/$t"
    mkdir -p "corpus/$t" "artifacts/$t"
    [ -d "seeds/$t" ] && seeds=("seeds/$t")
    [ -f "$t.dict" ] && dict=(-dict="$t.dict")
    if [ $mode = time ]; then limit=(-max_total_time="$amount"); what="${amount} s"; else limit=(-runs="$amount"); what="$amount runs"; fi
    echo "fuzz: $t ($what)"
    log="artifacts/$t/last-run.log"
    # -timeout: one input taking over 10 s is a hang, and a failure; -rss_limit_mb: so is
    # more than 2 GiB. -print_final_stats gives the execution count for the summary.
    if ! "$bin" "corpus/$t" "${seeds[@]}" "${dict[@]}" "${limit[@]}" "${maxlen[@]}" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="artifacts/$t/" -print_final_stats=1 >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        crash="$(grep -o "artifacts/$t/[a-z-]*-[0-9a-f]*" "$log" | tail -n 1 || true)"
        echo "fuzz: $t FAILED; input saved as fuzz/${crash:-artifacts/$t/}" >&2
        echo "fuzz: replay it with: (cd fuzz && $bin ${crash:-artifacts/$t/<file>})" >&2
        return 1
    fi
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
    cov="$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)"
    corpus="$(find "corpus/$t" -type f | wc -l)"
    printf '%-8s %12s executions  coverage %6s  corpus %6s  ok\n' "$t" "$runs" "${cov:-?}" "$corpus" \
        >"artifacts/$t/last-run.summary"
}

# --jobs targets at a time. A target that fails says so at once; the others run to their
# end, and the script fails after them. (Every target's summary file is written only by a
# run that passed: a missing one is a failure, whichever way its run ended.)
for t in "${targets[@]}"; do rm -f "artifacts/$t/last-run.summary"; done
# Each target's run in a process group of its own (job control on), so an interrupt ends
# its fuzzer with it.
set -m
stop_all() { for p in $(jobs -p); do kill -TERM -- "-$p" 2>/dev/null || true; done; }
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    run_target "$t" &
done
wait
set +m
failed=()
for t in "${targets[@]}"; do [ -s "artifacts/$t/last-run.summary" ] || failed+=("$t"); done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: all targets passed"
for t in "${targets[@]}"; do printf '  %s\n' "$(cat "artifacts/$t/last-run.summary")"; done
