# Sourced on a GPU machine without the CUDA toolkit (bash): makes a build packed elsewhere by
# bench/cuda/pack_for_gpu.sh and copied here as .gpu/ runnable (bench/cuda/run_gpu_bench.sh --carried does this).
#   source bench/cuda/gpu_env.sh     sets KILN_B (the build dir to use), LD_LIBRARY_PATH, and KILN_FASHION_MNIST where
#                                    the packed data set cannot be linked to Debian's path
# PYTHON: the Python whose pip packages hold CUDA's libraries (default python3 on the PATH).
_kiln_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -f "$_kiln_root/.gpu/build_dir" ]; then
  _kiln_abs="$(cat "$_kiln_root/.gpu/build_dir")"
  # The build's RPATHs and the tests' compiled-in plugin directory name this absolute path.
  if [ ! -e "$_kiln_abs/bin/kiln" ]; then mkdir -p "$(dirname "$_kiln_abs")" && ln -sfn "$_kiln_root/.gpu/build" "$_kiln_abs"; fi
  KILN_B="$_kiln_abs"
fi
# Fashion-MNIST where the samples and the tests expect it, when it was packed (pack_for_gpu.sh --data); without the
# right to write there (not root), the bench scripts find it through KILN_FASHION_MNIST.
if [ -d "$_kiln_root/.gpu/data/fashion-mnist" ] && [ ! -e /usr/share/datasets/fashion-mnist ]; then
  { mkdir -p /usr/share/datasets && ln -sfn "$_kiln_root/.gpu/data/fashion-mnist" /usr/share/datasets/fashion-mnist; } \
    2>/dev/null || export KILN_FASHION_MNIST="${KILN_FASHION_MNIST:-$_kiln_root/.gpu/data/fashion-mnist}"
fi
# CUDA 13 libraries from PyTorch's pip packages (cudart, cuBLAS, cuDNN, NCCL), where there is no toolkit.
_kiln_py=${PYTHON:-python3}
_kiln_cuda_libs=$("$_kiln_py" - <<'PY' 2>/dev/null
import importlib, os
out = []
for m in ("nvidia.cuda_runtime", "nvidia.cublas", "nvidia.cudnn", "nvidia.nccl", "nvidia.cu13"):
    try:
        mod = importlib.import_module(m)
    except Exception:
        continue
    for base in list(getattr(mod, "__path__", [])):
        for sub in ("lib", "lib64"):
            d = os.path.join(base, sub)
            if os.path.isdir(d):
                out.append(d)
print(":".join(out))
PY
)
export LD_LIBRARY_PATH="$_kiln_root/.gpu/deps${_kiln_cuda_libs:+:$_kiln_cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KILN_B
unset _kiln_root _kiln_abs _kiln_py _kiln_cuda_libs
