#!/usr/bin/env python3
"""Times JAX's training step for Kiln's samples (same models, data, optimizer as bench/step/torch_step.py): one
jax.jit-compiled step (params, opt_state, data set, batch indices -> new params, opt_state, loss) with optax.adam
(lr 1e-3, b1 0.9, b2 0.999, eps 1e-8), softmax cross-entropy. The Fashion-MNIST training set is held as one jnp array
(NHWC: 60000x28x28x1, the layout XLA's CPU convolutions use); each step numpy draws the batch's indices and the
jitted step gathers the rows. The timed region is index draw + step + block_until_ready; 20 warm-up steps (the first
one compiles, printed separately) then the median over STEPS.

usage: .venv-peers/bin/python bench/peers/jax_step.py {mlp|cnn} BATCH [STEPS] [--epoch] [--reshape-pool]
  --epoch  one full epoch instead: a fresh permutation, 60000 // BATCH full batches, no block between steps (JAX's
           asynchronous dispatch, as a user loop runs), one block_until_ready at the end; 5 warm-up steps first.
  --reshape-pool  the CNN's 2x2 max-pool as reshape + max instead of lax.reduce_window (flax.linen.max_pool's way)
Threads: XLA's CPU backend sizes its thread pool from the CPUs the process may run on. JAX_THREADS=N pins the process
to the first N CPUs (sched_setaffinity, before jax is imported); JAX_THREADS=1 also sets
XLA_FLAGS=--xla_cpu_multi_thread_eigen=false. Unset: all cores (2 here).
"""
import gzip
import os
import statistics
import sys
import time

import numpy as np

T = os.environ.get("JAX_THREADS")
if T:
    os.sched_setaffinity(0, range(int(T)))
    if T == "1":
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax import lax  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
kind, batch = args[0], int(args[1])
steps = int(args[2]) if len(args) > 2 else 200
epoch = "--epoch" in sys.argv
reshape_pool = "--reshape-pool" in sys.argv


def init(kind, key):
    """PyTorch's default init: weights and biases uniform(+-1/sqrt(fan_in)). Conv weights HWIO."""
    shapes = ([(784, 256), (256, 256), (256, 10)] if kind == "mlp" else
              [(3, 3, 1, 32), (3, 3, 32, 64), (3136, 128), (128, 10)])
    params = []
    for shape, k in zip(shapes, jax.random.split(key, len(shapes))):
        bound = 1.0 / np.sqrt(np.prod(shape[:-1]))
        kw, kb = jax.random.split(k)
        params.append((jax.random.uniform(kw, shape, jnp.float32, -bound, bound),
                       jax.random.uniform(kb, shape[-1:], jnp.float32, -bound, bound)))
    return params


def forward(params, x):
    if kind == "cnn":
        for w, b in params[:2]:
            x = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
            x = jax.nn.relu(x + b)
            if reshape_pool:  # 2x2 max as reshape + max: XLA's CPU backward of it beats reduce_window's here
                x = x.reshape(x.shape[0], x.shape[1] // 2, 2, x.shape[2] // 2, 2, x.shape[3]).max(axis=(2, 4))
            else:  # what flax.linen.max_pool does
                x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        params = params[2:]
    x = x.reshape(x.shape[0], -1)
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


opt = optax.adam(1e-3, b1=0.9, b2=0.999, eps=1e-8)


def loss_fn(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(forward(params, x), y).mean()


@jax.jit
def train_step(params, opt_state, X, Y, idx):
    loss, grads = jax.value_and_grad(loss_fn)(params, X[idx], Y[idx])
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


# Fashion-MNIST's directory: $KILN_FASHION_MNIST, default Debian's dataset-fashion-mnist.
D = os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist").rstrip("/") + "/"
X = np.frombuffer(gzip.open(D + "train-images-idx3-ubyte.gz").read()[16:], np.uint8).reshape(-1, 28, 28, 1)
X = jnp.asarray(X.astype(np.float32) / 255)
Y = jnp.asarray(np.frombuffer(gzip.open(D + "train-labels-idx1-ubyte.gz").read()[8:], np.uint8).astype(np.int32))
params = init(kind, jax.random.PRNGKey(0))
opt_state = opt.init(params)
rng = np.random.default_rng(0)
N = X.shape[0]
settings = (f"JAX_THREADS {T or 'unset'}, XLA_FLAGS {os.environ.get('XLA_FLAGS', 'unset')!r}, "
            f"cpus {len(os.sched_getaffinity(0))}, NHWC{', reshape-pool' if reshape_pool else ''}")

if epoch:
    n = N // batch
    t0 = time.perf_counter()
    for i in range(5):
        params, opt_state, loss = train_step(params, opt_state, X, Y, rng.integers(0, N, batch))
    loss.block_until_ready()
    warm = time.perf_counter() - t0
    c0, t0 = time.process_time(), time.perf_counter()
    perm = rng.permutation(N)
    for i in range(n):
        params, opt_state, loss = train_step(params, opt_state, X, Y, perm[i * batch:(i + 1) * batch])
    loss.block_until_ready()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"jax {kind} batch {batch}: epoch {dt:.2f} s ({n} steps, {n * batch / dt:.0f} examples/s, "
          f"warm-up 5 steps incl. compile {warm:.2f} s, cpu/wall {cpu / dt:.2f}, last loss {float(loss):.3f}, "
          f"{settings})")
    sys.exit()

times = []
for i in range(steps + 20):
    t0 = time.perf_counter()
    idx = rng.integers(0, N, batch)
    params, opt_state, loss = train_step(params, opt_state, X, Y, idx)
    loss.block_until_ready()
    times.append(time.perf_counter() - t0)
    if i == 19:
        c0 = time.process_time()
med = statistics.median(times[20:])
mean = statistics.mean(times[20:])
cpu = (time.process_time() - c0) / sum(times[20:])
print(f"jax {kind} batch {batch}: median {med*1e3:.3f} ms/step, {batch/med:.0f} examples/s "
      f"(mean {mean*1e3:.3f} ms, first step (compile) {times[0]:.2f} s, cpu/wall {cpu:.2f}, {settings})")
