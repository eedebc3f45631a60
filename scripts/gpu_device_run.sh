#!/usr/bin/env bash
# The GPU half of the CUDA selectors and NcclComm, for a machine with an NVIDIA GPU but no
# Rust toolchain (binaries are built here, on x86-64, and carried there).
#
#   here:  scripts/gpu_device_run.sh build [BUNDLE]        (default BUNDLE: gpu-bundle)
#   there: bash BUNDLE/gpu_device_run.sh run [BUNDLE] [OUT] (default OUT: $OUT, else gpu-out)
#
# `build` compiles the sparsify test binaries with `--features cuda`, the collectives `nccl`
# test binary and the release xtask with `--features cuda`, strips their debug info (the
# bundle must stay small enough to carry), and copies them with this script into BUNDLE.
#
# `run` finds the libraries the binaries load there and that are not carried: cudarc (built
# for CUDA 12.6 with dynamic loading) asks for libcuda.so / libcuda.so.1 (the driver's),
# libnvrtc.so / libnvrtc.so.12 / .11 / .10 / .9 / .1 and libnccl.so (never libnccl.so.2 or
# libnvrtc.so.13), so it links a private folder with `libnvrtc.so` -> the CUDA 13 NVRTC and
# `libnccl.so` -> libnccl.so.2 found on that machine, puts it first on LD_LIBRARY_PATH, then
# runs every test binary and `xtask bench --suite gpu`. The kernels are compiled by NVRTC
# at run time for the device's architecture (compute_90 on an H100/H200). Logs, the bench
# report and an environment summary go to OUT (at most 8 files). Each test binary runs
# under `timeout $GPU_TEST_TIMEOUT` (300 s) and the bench under `$GPU_BENCH_TIMEOUT` (420 s),
# so a hung kernel still leaves its log. Exits non-zero when any test or the bench fails.
set -uo pipefail

mode=${1:-}
bundle=${2:-gpu-bundle}

build() {
  set -e
  local root target exes
  root=$(cd "$(dirname "$0")/.." && pwd)
  cd "$root"
  target=${CARGO_TARGET_DIR:-$root/target}
  mkdir -p "$bundle/tests"
  rm -f "$bundle"/tests/* "$bundle/xtask"
  json() { cargo "$@" --message-format=json 2>/dev/null; }
  pick='import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        print(m["target"]["name"] + " " + m["executable"])'
  exes=$( { json test -p sparsify --features cuda --lib --test cuda --no-run;
            json test -p collectives --features nccl --test nccl --no-run; } | python3 -c "$pick")
  [ -n "$exes" ] || { echo "build: no test binaries found" >&2; exit 1; }
  while read -r name exe; do
    objcopy --strip-debug "$exe" "$bundle/tests/$name"
  done <<<"$exes"
  cargo build --release -q -p xtask --features cuda
  objcopy --strip-debug "$target/release/xtask" "$bundle/xtask"
  cp "$0" "$bundle/gpu_device_run.sh"
  { echo "commit $(git rev-parse HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')";
    echo "built $(date -u +%FT%TZ) on $(uname -m)";
    ls -l "$bundle"/tests "$bundle"/xtask; } >"$bundle/MANIFEST"
  du -sh "$bundle"
  echo "carry '$bundle' and run: bash $bundle/gpu_device_run.sh run $bundle"
}

# First file matching one of the globs, searching the usual places of a CUDA machine.
find_lib() {
  local pat d f
  local dirs=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64
              /usr/lib/x86_64-linux-gnu /usr/lib64)
  local py
  py=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
  for p in $py; do
    for d in "$p"/nvidia/*/lib "$p"/nvidia/cu*/lib; do [ -d "$d" ] && dirs+=("$d"); done
  done
  for pat in "$@"; do
    f=$(ldconfig -p 2>/dev/null | awk -v p="${pat%\*}" -v w="${pat: -1}" \
          '($1 == p || (w == "*" && index($1, p) == 1)) {print $NF; exit}')
    [ -n "$f" ] && { echo "$f"; return 0; }
    for d in "${dirs[@]}"; do
      for f in "$d"/$pat; do [ -e "$f" ] && { echo "$f"; return 0; }; done
    done
  done
  return 1
}

run() {
  local out status=0 lib nvrtc nccl b t
  b=$(cd "$bundle" && pwd)
  out=${3:-${OUT:-$PWD/gpu-out}}
  mkdir -p "$out"
  lib=$(mktemp -d)
  nvrtc=$(find_lib 'libnvrtc.so' 'libnvrtc.so.13*' 'libnvrtc.so.12*') || nvrtc=
  nccl=$(find_lib 'libnccl.so' 'libnccl.so.2*') || nccl=
  [ -n "$nvrtc" ] && ln -sf "$nvrtc" "$lib/libnvrtc.so"
  [ -n "$nccl" ] && ln -sf "$nccl" "$lib/libnccl.so"
  export LD_LIBRARY_PATH="$lib${nvrtc:+:$(dirname "$nvrtc")}${nccl:+:$(dirname "$nccl")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export RUST_BACKTRACE=1
  {
    echo "bundle: $(head -2 "$b/MANIFEST" 2>/dev/null | tr '\n' ' ')"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv 2>&1
    echo "nvrtc: ${nvrtc:-NOT FOUND}"
    echo "nccl: ${nccl:-NOT FOUND}"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())' 2>&1
  } >"$out/env.txt"
  cat "$out/env.txt"
  for t in "$b"/tests/*; do
    echo "== $(basename "$t")"
    # A hung kernel must not eat the whole lease: each binary gets its own time limit.
    timeout "${GPU_TEST_TIMEOUT:-300}" "$t" 2>&1 | tee "$out/test-$(basename "$t").log" || status=1
  done
  echo "== xtask bench --suite gpu"
  local rep
  rep=$(mktemp -d)
  timeout "${GPU_BENCH_TIMEOUT:-420}" "$b/xtask" bench --suite gpu --out "$rep" 2>&1 |
    tee "$out/bench.log" || status=1
  cp "$rep/report.md" "$rep/report.json" "$out/" 2>/dev/null || status=1
  echo "status $status (logs in $out)"
  return $status
}

case "$mode" in
  build) build ;;
  run) run "$@" ;;
  *) sed -n 2,21p "$0"; exit 2 ;;
esac
