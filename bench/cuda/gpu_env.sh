# Sourced on the GPU machine (bash): makes a carried .gpu/ (bench/cuda/pack_for_gpu.sh) runnable there.
#   source bench/cuda/gpu_env.sh     sets KILN_B (the build dir to use) and LD_LIBRARY_PATH
_kiln_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -f "$_kiln_root/.gpu/build_dir" ]; then
  _kiln_abs="$(cat "$_kiln_root/.gpu/build_dir")"
  # The build's RPATHs and the tests' compiled-in plugin directory name this absolute path.
  if [ ! -e "$_kiln_abs/bin/kiln" ]; then mkdir -p "$(dirname "$_kiln_abs")" && ln -sfn "$_kiln_root/.gpu/build" "$_kiln_abs"; fi
  KILN_B="$_kiln_abs"
fi
# Fashion-MNIST where the samples expect it, when it was packed (pack_for_gpu.sh --data).
if [ -d "$_kiln_root/.gpu/data/fashion-mnist" ] && [ ! -e /usr/share/datasets/fashion-mnist ]; then
  mkdir -p /usr/share/datasets && ln -sfn "$_kiln_root/.gpu/data/fashion-mnist" /usr/share/datasets/fashion-mnist
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
