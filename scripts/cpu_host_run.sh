#!/usr/bin/env bash
# Issue 17's CPU figures on a quiet many-core host without a Rust toolchain (the host of
# a lent GPU machine): the automatic choice against MPI's collectives, the calibrated fits
# and the planner check at P = 2, 3 and 4 under mpirun, and the topk suite on every core.
#
#   here:  scripts/cpu_host_run.sh build [BUNDLE]         (default BUNDLE: target/cpu-bundle)
#   there: bash BUNDLE/cpu_host_run.sh run [BUNDLE] [PARTS] [DEADLINE_S]
#
# `build` puts two stripped release binaries in BUNDLE: `xtask` (default features, for the
# topk suite; it loads no MPI library) and `xtask-mpi` (`--features mpi`, linked against
# this machine's libmpi.so.40, which Open MPI 4.1 and 5.0 both provide), with this script
# and a manifest. About 42 MB: within what the device tool carries (64 MiB).
#
# `run` runs PARTS (default "mpi topk"; each a word: mpi, topk, or topk_small and
# topk_large, the two size groups of topk on their own), each step under a time
# limit cut to what is left of DEADLINE_S (default 540), and after every step packs all
# it wrote into one archive, $OUT/cpu-host.tgz (else ./cpu-host.tgz): the device tool
# returns at most 8 files a call, and a step cut short still leaves the others'. Open MPI
# gets `--mca btl_vader_single_copy_mechanism none` only where a process cannot read a
# child's memory, as `xtask bench --mpi` decides.
#
# Wall times on the 16-core host of an H200 machine (2026-11-29): calibrate 11-24 s per P;
# bench of the three collectives 65 s (P = 2), 106 s (P = 3), 94 s (P = 4); the topk suite
# took more than 170 s for 2^14 … 2^22 with its peers (before their runs were capped) and
# 352 s in all in an earlier session. So the two parts need two calls in a 15-minute lease.
set -uo pipefail

mode=${1:-}
bundle=${2:-target/cpu-bundle}

build() {
  set -e
  local root target
  root=$(cd "$(dirname "$0")/.." && pwd)
  cd "$root"
  target=${CARGO_TARGET_DIR:-$root/target}
  mkdir -p "$bundle"
  cargo build --release -q -p xtask --features mpi
  objcopy --strip-debug "$target/release/xtask" "$bundle/xtask-mpi"
  cargo build --release -q -p xtask
  objcopy --strip-debug "$target/release/xtask" "$bundle/xtask"
  cp "$0" "$bundle/cpu_host_run.sh"
  { echo "commit $(git rev-parse HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')";
    echo "built $(date -u +%FT%TZ) on $(uname -m) with $(mpirun --version 2>/dev/null | head -1)";
    ls -l "$bundle"; } >"$bundle/MANIFEST"
  du -sh "$bundle"
  echo "carry '$bundle' and run: bash $bundle/cpu_host_run.sh run $bundle"
}

run() {
  local b parts deadline work archive t0
  b=$(cd "$bundle" && pwd)
  parts=${3:-mpi topk}
  deadline=${4:-540}
  work=$(mktemp -d)
  archive=${OUT:-$PWD}/cpu-host.tgz
  t0=$(date +%s)
  chmod +x "$b/xtask" "$b/xtask-mpi"
  pack() { rm -f "$work"/*/*.svg; tar czf "$archive" -C "$work" .; }
  # step NAME CAP CMD...: runs CMD under min(CAP, time left) seconds, logs to NAME.log.
  step() {
    local name=$1 cap=$2 left t s rc
    shift 2
    left=$((deadline - ($(date +%s) - t0)))
    t=$((cap < left - 10 ? cap : left - 10))
    if [ "$t" -lt 15 ]; then
      echo "$name skipped: ${left} s left" | tee -a "$work/steps.txt"
      return
    fi
    s=$(date +%s)
    timeout -k 5 "$t" "$@" >"$work/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc wall=$(($(date +%s) - s))s limit=${t}s" | tee -a "$work/steps.txt"
    # The verdict lines on stdout too: the device tool returns the output's tail even when
    # no file comes back.
    { grep -hE "worst relative|iteration: predicted|^- top-k with error feedback fused" "$work/$name.log"
      grep -hE "^\| this project's goal" "$work/$name"/report.md; } 2>/dev/null | cut -c1-400
    pack
  }
  {
    echo "bundle: $(head -2 "$b/MANIFEST" 2>/dev/null | tr '\n' ' ')"
    date -u; nproc; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|L3'; uptime
    mpirun --version 2>&1 | head -1
    python3 -c 'import numpy, torch; print("numpy", numpy.__version__, "torch", torch.__version__)' 2>&1
  } >"$work/env.txt"
  for part in $parts; do
    case "$part" in
      mpi)
        if ! command -v mpirun >/dev/null; then
          echo "mpi skipped: no mpirun here" | tee -a "$work/steps.txt"
          continue
        fi
        local mr=(mpirun --allow-run-as-root --oversubscribe)
        # The probe of `xtask bench --mpi` (`peer_memory::can_read_other_processes`). A
        # bundle without it is refused: taking its failure for "no" would run Open MPI
        # without its single copy where the kernel allows it, a slower baseline.
        local cma
        if ! cma=$("$b/xtask" cross-memory-attach); then
          echo "mpi skipped: this bundle's xtask has no cross-memory-attach probe; rebuild it" |
            tee -a "$work/steps.txt"
          continue
        fi
        [ "$cma" = yes ] || mr+=(--mca btl_vader_single_copy_mechanism none)
        echo "mpirun: ${mr[*]}" >>"$work/env.txt"
        # P = 3 first: its bench stalled twice on a 16-core host (2026-11-30). The
        # shared-memory waits drive MPI's progress since, which that host has yet to confirm.
        for p in 3 4 2; do
          step "cal_p$p" 75 "${mr[@]}" -n "$p" "$b/xtask-mpi" calibrate --mpi --out "$work/cal_p$p.json"
          step "bench_p$p" 150 "${mr[@]}" -n "$p" "$b/xtask-mpi" bench --mpi-child \
            --suite allreduce allgather reduce_scatter --calibration "$work/cal_p$p.json" \
            --out "$work/bench_p$p"
        done
        ;;
      topk | topk_small | topk_large)
        # Small sizes first, so that a cut-short run still leaves them.
        [ "$part" = topk_large ] ||
          step topk_small 240 "$b/xtask" bench --suite topk --topk-sizes 14 16 18 20 --out "$work/topk_small"
        [ "$part" = topk_small ] ||
          step topk_large 300 "$b/xtask" bench --suite topk --topk-sizes 22 24 26 --out "$work/topk_large"
        ;;
      *) echo "unknown part $part (mpi, topk, topk_small, topk_large)" | tee -a "$work/steps.txt" ;;
    esac
  done
  echo "total $(($(date +%s) - t0)) s" >>"$work/steps.txt"
  pack
  echo "archive: $archive"
}

case "$mode" in
  build) build ;;
  run) run "$@" ;;
  *) sed -n 2,24p "$0"; exit 2 ;;
esac
