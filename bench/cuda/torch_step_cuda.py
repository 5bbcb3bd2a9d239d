#!/usr/bin/env python3
"""Times PyTorch's training step on the GPU for Kiln's samples (same models, batch, Adam, random data), the
counterpart of `kiln_step_bench CONFIG --set device.backend=cuda`.

usage: python3 bench/cuda/torch_step_cuda.py {mlp|cnn} BATCH [STEPS] [--graphs] [--tf32] [--amp=bf16|f16]
  --graphs  capture the whole step as one CUDA graph (torch.cuda.graph, Adam(capturable=True))
  --tf32    allow TF32 in matmul and cuDNN (default off: exact FP32 like Kiln's default)
  --amp=bf16|f16  the forward pass under torch.autocast in that type (Kiln's [precision] compute = "bfloat16" /
            "float16"); f16 scales the loss with GradScaler, which is not captured, so it runs eagerly only
Each timed step ends with loss.item(), as Kiln reads the loss back every step.
"""
import statistics
import sys
import time

import torch
import torch.nn as nn

args = [a for a in sys.argv[1:] if not a.startswith("--")]
graphs, tf32 = "--graphs" in sys.argv, "--tf32" in sys.argv
amp = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--amp=")), None)
if amp not in (None, "bf16", "f16"):
    sys.exit(f"torch_step_cuda: --amp takes bf16 or f16, found {amp!r}")
if amp == "f16" and graphs:
    sys.exit("torch_step_cuda: --amp=f16 uses GradScaler, whose step is not captured by torch.cuda.graph; run eagerly")
amp_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(amp) if amp else None
kind, batch = args[0], int(args[1])
steps = int(args[2]) if len(args) > 2 else 200
if not torch.cuda.is_available():
    sys.exit("torch_step_cuda: torch.cuda.is_available() is False")
torch.backends.cuda.matmul.allow_tf32 = tf32
torch.backends.cudnn.allow_tf32 = tf32
torch.backends.cudnn.benchmark = True
dev = torch.device("cuda")

if kind == "mlp":
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
else:
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
model = model.to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=graphs)
loss_fn = nn.CrossEntropyLoss()
x = torch.rand(batch, 1, 28, 28, device=dev)
y = torch.randint(0, 10, (batch,), device=dev)


scaler = torch.amp.GradScaler("cuda") if amp == "f16" else None


def forward_loss():
    if amp_dtype is None:
        return loss_fn(model(x), y)
    # No weight-cast cache: inside a captured graph every replay must cast the current weights.
    with torch.autocast("cuda", dtype=amp_dtype, cache_enabled=False):
        return loss_fn(model(x), y)


def eager_step():
    opt.zero_grad(set_to_none=True)
    loss = forward_loss()
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss
    loss.backward()
    opt.step()
    return loss


if graphs:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph requires
        for _ in range(3):
            eager_step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = forward_loss()
        static_loss.backward()
        opt.step()

    def step():
        g.replay()
        return static_loss
else:
    step = eager_step

times = []
for i in range(steps + 20):
    t0 = time.perf_counter()
    step().item()
    dt = time.perf_counter() - t0
    if i >= 20:
        times.append(dt)
med = statistics.median(times)
print(f"torch {kind} batch {batch}: median {med*1e3:.3f} ms/step, {batch/med:.0f} examples/s "
      f"({torch.cuda.get_device_name()}, {'CUDA graph' if graphs else 'eager'}, "
      f"{'autocast ' + amp if amp else 'TF32' if tf32 else 'FP32'}, "
      f"torch {torch.__version__})")
