#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Runs every GPU test program of a build directory and prints a summary.
# Usage: tests/gpu/run-all.sh [BUILD_DIR] [LOG_DIR]
# Exit status: 0 when none failed (skips allowed), 1 otherwise.
build=${1:-build}
logs=${2:-}
dir=$build/tests/gpu
[[ -d $dir ]] || { echo "no $dir (was the build configured with CUDA?)" >&2; exit 1; }
[[ -n $logs ]] && mkdir -p "$logs"
pass=0 fail=0 skip=0 failed=()
for t in test_cuda_gemm test_gemm_plans test_workspace_race test_cuda_ipc test_cuda_lifecycle test_cuda_health test_cuda_attention test_cuda_layernorm test_cuda_fp8 test_cuda_share test_program_kernels; do
  exe=$dir/$t
  if [[ ! -x $exe ]]; then
    echo "== $t: missing"; fail=$((fail + 1)); failed+=("$t"); continue
  fi
  echo "== $t"
  start=$(date +%s.%N)
  if [[ -n $logs ]]; then
    timeout -k 10 600 "$exe" 2>&1 | tee "$logs/$t.log"; rc=${PIPESTATUS[0]}
  else
    timeout -k 10 600 "$exe" 2>&1; rc=$?
  fi
  secs=$(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo "?")
  case $rc in
    0) pass=$((pass + 1)); echo "== $t: PASS (${secs}s)";;
    77) skip=$((skip + 1)); echo "== $t: SKIP";;
    *) fail=$((fail + 1)); failed+=("$t"); echo "== $t: FAIL (exit $rc, ${secs}s)";;
  esac
done
# The Python GPU scripts of regen.torch (exit 77 without torch or a GPU).
here=$(cd "$(dirname "$0")" && pwd)
for t in test_program.py test_compile.py test_compile_soak.py test_torch_fp8.py test_torch_interop.py test_lifecycle_cycles.py test_regen_torch.py test_torch_nn.py test_torch_process_pool.py test_train_gpt.py test_keep_torch.py test_orphaned_wait.py test_mps.py test_nccl.py test_nccl_multi.py test_torch_dist_gpu.py test_nccl_netns.py; do
  echo "== $t"
  start=$(date +%s.%N)
  if [[ -n $logs ]]; then
    timeout -k 10 3600 python3 "$here/$t" "$build/daemon/regend" 2>&1 | tee "$logs/$t.log"; rc=${PIPESTATUS[0]}
  else
    timeout -k 10 3600 python3 "$here/$t" "$build/daemon/regend" 2>&1; rc=$?
  fi
  secs=$(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo "?")
  case $rc in
    0) pass=$((pass + 1)); echo "== $t: PASS (${secs}s)";;
    77) skip=$((skip + 1)); echo "== $t: SKIP";;
    *) fail=$((fail + 1)); failed+=("$t"); echo "== $t: FAIL (exit $rc, ${secs}s)";;
  esac
done
echo "$build: $pass passed, $fail failed, $skip skipped${failed:+ (failed: ${failed[*]})}"
[[ $fail -eq 0 ]]
