#!/usr/bin/env python3
"""Times Keras 3 (TensorFlow backend) training Kiln's samples as its users run it: model.fit over the Fashion-MNIST
training set (numpy arrays, NHWC 60000x28x28x1, shuffle=True; or a tf.data pipeline), Adam (lr 1e-3, beta_1 0.9,
beta_2 0.999, epsilon 1e-8: Keras's default epsilon is 1e-7), SparseCategoricalCrossentropy(from_logits=True).
The per-step time is on_train_batch_begin -> on_train_batch_end of a Callback (it holds the train function's call,
which takes the batch from the input iterator; a Python callback makes Keras wait for each step's loss); 20 warm-up
steps (the first traces the tf.function, printed separately) then the median over STEPS.

usage: .venv-peers/bin/python bench/peers/keras_step.py {mlp|cnn} BATCH [STEPS] [--epoch] [--data numpy|tfdata] [--jit]
  --epoch        one full epoch instead: fit(epochs=1) over 60000 // BATCH full batches (the arrays cut to that many
                 images, or drop_remainder), after a 5-step fit() that traces; prints on_epoch_begin -> on_epoch_end
                 and the whole fit() call
  --data tfdata  Dataset.from_tensor_slices((X, Y)).shuffle(60000).batch(BATCH, drop_remainder=True).prefetch(AUTOTUNE)
  --jit          compile(jit_compile=True): XLA. Keras's default ("auto") turns XLA off on a CPU-only machine.
Threads: TF_INTRA_THREADS and TF_INTER_THREADS (tf.config.threading.set_intra/inter_op_parallelism_threads; unset
or 0 = TensorFlow's own choice: all cores). oneDNN is on (TensorFlow's default on x86).
"""
import gzip
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
from keras import layers  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TF_INTRA_THREADS") or 0))
tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("TF_INTER_THREADS") or 0))
a = sys.argv[1:]
args = [x for i, x in enumerate(a) if not x.startswith("--") and (i == 0 or a[i - 1] != "--data")]
kind, batch = args[0], int(args[1])
steps = int(args[2]) if len(args) > 2 else 200
data = a[a.index("--data") + 1] if "--data" in a else "numpy"
epoch = "--epoch" in a

keras.utils.set_random_seed(0)
if kind == "mlp":
    body = [layers.Flatten(), layers.Dense(256, activation="relu"), layers.Dense(256, activation="relu")]
else:
    body = [layers.Conv2D(32, 3, padding="same", activation="relu"), layers.MaxPooling2D(2),
            layers.Conv2D(64, 3, padding="same", activation="relu"), layers.MaxPooling2D(2),
            layers.Flatten(), layers.Dense(128, activation="relu")]
model = keras.Sequential([keras.Input((28, 28, 1))] + body + [layers.Dense(10)])
model.compile(optimizer=keras.optimizers.Adam(1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-8),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=True if "--jit" in a else "auto")

# Fashion-MNIST's directory: $KILN_FASHION_MNIST, default Debian's dataset-fashion-mnist.
D = os.environ.get("KILN_FASHION_MNIST", "/usr/share/datasets/fashion-mnist").rstrip("/") + "/"
X = np.frombuffer(gzip.open(D + "train-images-idx3-ubyte.gz").read()[16:], np.uint8).reshape(-1, 28, 28, 1)
X = X.astype(np.float32) / 255
Y = np.frombuffer(gzip.open(D + "train-labels-idx1-ubyte.gz").read()[8:], np.uint8).astype(np.int32)
n = X.shape[0] // batch


class Timer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps, self.epoch = [], None

    def on_train_batch_begin(self, batch, logs=None):
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(time.perf_counter() - self.t0)

    def on_epoch_begin(self, epoch, logs=None):
        self.e0, self.c0 = time.perf_counter(), time.process_time()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch, self.cpu = time.perf_counter() - self.e0, time.process_time() - self.c0


def fit(count, timer, repeat=False):
    """fit() for `count` steps over the shuffled training set, as numpy arrays or a tf.data pipeline."""
    if data == "tfdata":
        ds = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(X.shape[0], seed=0)
        ds = ds.batch(batch, drop_remainder=True)
        ds = (ds.repeat() if repeat else ds).prefetch(tf.data.AUTOTUNE)
        model.fit(ds, epochs=1, steps_per_epoch=count if repeat else None, shuffle=False, verbose=0,
                  callbacks=[timer])
    elif repeat:
        model.fit(X, Y, batch_size=batch, epochs=1, steps_per_epoch=count, shuffle=True, verbose=0, callbacks=[timer])
    else:
        model.fit(X[:n * batch], Y[:n * batch], batch_size=batch, epochs=1, shuffle=True, verbose=0, callbacks=[timer])


settings = (f"data {data}, jit_compile {model.jit_compile}, intra {tf.config.threading.get_intra_op_parallelism_threads()}"
            f", inter {tf.config.threading.get_inter_op_parallelism_threads()}, NHWC")
if epoch:
    warm = Timer()
    t0 = time.perf_counter()
    fit(5, warm, repeat=True)
    warm_s = time.perf_counter() - t0
    timer = Timer()
    t0 = time.perf_counter()
    fit(None, timer)
    call = time.perf_counter() - t0
    print(f"keras {kind} batch {batch}: epoch {timer.epoch:.2f} s ({len(timer.steps)} steps, "
          f"{len(timer.steps) * batch / timer.epoch:.0f} examples/s, fit() call {call:.2f} s, warm-up fit of 5 steps "
          f"{warm_s:.2f} s, median step {statistics.median(timer.steps) * 1e3:.3f} ms, slowest {max(timer.steps):.3f} s, "
          f"cpu/wall {timer.cpu / timer.epoch:.2f}, {settings})")
    sys.exit()

timer = Timer()
fit(steps + 20, timer, repeat=True)
t = timer.steps
med = statistics.median(t[20:])
print(f"keras {kind} batch {batch}: median {med*1e3:.3f} ms/step, {batch/med:.0f} examples/s "
      f"(mean {statistics.mean(t[20:])*1e3:.3f} ms, first step (trace) {t[0]:.2f} s, {settings})")
