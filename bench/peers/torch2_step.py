#!/usr/bin/env python3
"""Times PyTorch 2's training step (eager, or torch.compile with inductor) exactly as bench/step/torch_step.py times
Debian's PyTorch 1.13: the real Fashion-MNIST training set held as tensors, a random batch gathered each step
(torch.randint, seeded), Adam lr 1e-3, CrossEntropy, 20 warm-up steps then the median over STEPS.

The kinds gpt and resnet time Kiln's GPT sample (samples/shakespeare_char.toml, BATCH 12 there) and ResNet sample
(samples/resnet_fashion_mnist.toml, BATCH 128) with their own optimizers, schedules, gradient clipping and real data
drawn each step (torch_models.py: random windows of tiny Shakespeare; random Fashion-MNIST images, normalized, each
flipped with probability 1/2).

usage: .venv-peers/bin/python bench/peers/torch2_step.py {mlp|cnn|gpt|resnet} BATCH [STEPS] [--compile[=model|step]]
                                                         [--epoch] [--amp=bf16] [--loss]
  --compile / --compile=model  torch.compile(model) (forward and its backward compiled; Adam eager)
  --compile=step               torch.compile of the whole step function (graph-breaks at backward(); Adam compiled)
  --epoch                      one full epoch instead (torch_epoch.py; --loader gather|dataloader; mlp and cnn)
  --amp=bf16                   torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss
  --loss                       also print the mean loss of the first and of the last 10 steps (a sanity check)
Threads: TORCH_THREADS (default 2). Run it with MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_epoch import VERSION, build, load, make_step, parse_compile, run_epoch  # noqa: E402
import torch  # noqa: E402
import torch_models  # noqa: E402

a = sys.argv[1:]
args = [x for i, x in enumerate(a) if not x.startswith("--") and (i == 0 or a[i - 1] != "--loader")]
kind, batch = args[0], int(args[1])
steps = int(args[2]) if len(args) > 2 else 200
compile_mode = parse_compile(a)
if kind not in ("mlp", "cnn") + torch_models.KINDS:
    sys.exit(f"torch2_step.py: unknown kind '{kind}': expected mlp, cnn, gpt or resnet")
if "--epoch" in a:
    if kind in torch_models.KINDS:
        sys.exit(f"torch2_step.py: --epoch runs torch_epoch.py's loop, which has mlp and cnn only, not '{kind}'")
    run_epoch(kind, batch, a[a.index("--loader") + 1] if "--loader" in a else "gather", compile_mode)
    sys.exit()

amp = next((x.split("=", 1)[1] for x in a if x.startswith("--amp=")), None)
if kind in torch_models.KINDS:
    step, draw = torch_models.sample(kind, batch, amp, compile_mode)
else:
    step = make_step(build(kind), compile_mode, amp)
    X, Y = load()

    def draw(g):
        idx = torch.randint(0, X.shape[0], (batch,), generator=g)
        return X[idx], Y[idx]
g = torch.Generator().manual_seed(0)
times, losses = [], []
for i in range(steps + 20):
    t0 = time.perf_counter()
    losses.append(step(*draw(g)).item())
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
if "--loss" in a:
    print(f"loss: first 10 steps {statistics.mean(losses[:10]):.4f}, last 10 steps {statistics.mean(losses[-10:]):.4f}")
