# Sourced by the tests/gpu/run_*.sh scripts after they set OUT: installs the carried wheels (.whl/) into
# /tmp/site, publishes the copied checkout's entry points (it is not installed, so the registry would find
# no plugins), sets PYTHONPATH, NVLink multicast off and the commit (SGLANG_MOE_PLUGINS_COMMIT or
# GIT_COMMIT: a copied tree's .git may be an older base), and records the machine in $OUT/env.txt.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$OUT/env.txt" 2>&1
rm -rf /tmp/di
PYTHONPATH=$PWD python3 benchmarks/checkout_dist_info.py /tmp/di >> "$OUT/env.txt" 2>&1
export PYTHONPATH=/tmp/site:/tmp/di:$PWD:$PWD/tests:$PWD/tests/gpu
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
COMMIT=${SGLANG_MOE_PLUGINS_COMMIT:-${GIT_COMMIT:-}}
[ -n "$COMMIT" ] || COMMIT="unknown (set GIT_COMMIT)"
export GIT_COMMIT="$COMMIT" SGLANG_MOE_PLUGINS_COMMIT="$COMMIT"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch, deep_gemm; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda); print('deep_gemm', deep_gemm.__version__, deep_gemm.__file__)"
  python3 -c "import triton; print('triton', triton.__version__)"
  python3 -c "import tvm_ffi; print('tvm_ffi', getattr(tvm_ffi, '__version__', '?'))"
  python3 -c "import importlib.metadata as m; print('entry points', sorted(e.name for e in m.entry_points(group='sglang_moe_plugins.kernels')))"
  echo "commit $GIT_COMMIT"
} >> "$OUT/env.txt" 2>&1
