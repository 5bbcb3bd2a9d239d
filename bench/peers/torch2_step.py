#!/usr/bin/env python3
"""Times PyTorch 2's training step (eager, or torch.compile with inductor) exactly as bench/step/torch_step.py times
Debian's PyTorch 1.13: the real Fashion-MNIST training set held as tensors, a random batch gathered each step
(torch.randint, seeded), Adam lr 1e-3, CrossEntropy, 20 warm-up steps then the median over STEPS.

usage: .venv-peers/bin/python bench/peers/torch2_step.py {mlp|cnn} BATCH [STEPS] [--compile[=model|step]] [--epoch]
                                                         [--amp=bf16]
  --compile / --compile=model  torch.compile(model) (forward and its backward compiled; Adam eager)
  --compile=step               torch.compile of the whole step function (graph-breaks at backward(); Adam compiled)
  --epoch                      one full epoch instead (torch_epoch.py; --loader gather|dataloader)
  --amp=bf16                   torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss
Threads: TORCH_THREADS (default 2). Run it with MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_epoch import VERSION, build, load, make_step, parse_compile, run_epoch  # noqa: E402
import torch  # noqa: E402

a = sys.argv[1:]
args = [x for i, x in enumerate(a) if not x.startswith("--") and (i == 0 or a[i - 1] != "--loader")]
kind, batch = args[0], int(args[1])
steps = int(args[2]) if len(args) > 2 else 200
compile_mode = parse_compile(a)
if "--epoch" in a:
    run_epoch(kind, batch, a[a.index("--loader") + 1] if "--loader" in a else "gather", compile_mode)
    sys.exit()

amp = next((x.split("=", 1)[1] for x in a if x.startswith("--amp=")), None)
step = make_step(build(kind), compile_mode, amp)
X, Y = load()
g = torch.Generator().manual_seed(0)
times = []
for i in range(steps + 20):
    t0 = time.perf_counter()
    idx = torch.randint(0, X.shape[0], (batch,), generator=g)
    step(X[idx], Y[idx]).item()
    times.append(time.perf_counter() - t0)
    if i == 19:
        c0 = time.process_time()
med = statistics.median(times[20:])
mean = statistics.mean(times[20:])
cpu = (time.process_time() - c0) / sum(times[20:])
peer = f"torch{VERSION}" + ("+compile" if compile_mode else "") + (f"+autocast-{amp}" if amp else "")
print(f"{peer} {kind} batch {batch}: median {med*1e3:.3f} ms/step, {batch/med:.0f} examples/s "
      f"(mean {mean*1e3:.3f} ms, torch threads {torch.get_num_threads()}, compile {compile_mode or 'none'}"
      f"{f', first step (compile) {times[0]:.2f} s' if compile_mode else ''}, cpu/wall {cpu:.2f}, "
      f"MALLOC_MMAP_THRESHOLD_ {os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')})")
