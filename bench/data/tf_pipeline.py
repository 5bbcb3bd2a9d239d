"""tf.data on the samples' Fashion-MNIST pipelines, written as the TensorFlow guides write them, in examples/s.

    .venv-tf/bin/python bench/data/tf_pipeline.py --pipeline mlp|resnet [--consumer eager|graph] [--vectorized]
                                                  [--epochs N] [--data DIR]

The data comes in as keras.datasets.fashion_mnist.load_data() brings it (the gzip'd IDX files decompressed into
uint8 arrays, timed as part of the build), then:
  mlp:    from_tensor_slices > map(x / 255, num_parallel_calls=AUTOTUNE) > cache() > shuffle(60000) > batch(64) >
          prefetch(AUTOTUNE)  (the tensorflow_datasets MNIST example's order)
  resnet: from_tensor_slices > map(x / 255, normalize, AUTOTUNE) > cache() > map(random_flip_left_right, AUTOTUNE)
          > shuffle(60000) > batch(128) > prefetch(AUTOTUNE)
Images are NHWC (28, 28, 1) as Keras models take them. --consumer eager: a Python `for x, y in ds` loop, as a
custom training loop iterates; graph: the loop runs inside a tf.function (Dataset.reduce), as Keras' model.fit
drives it, without Python per batch. --vectorized (resnet): the flip maps over whole batches, after batch(), as the
tf.data performance guide's "vectorized mapping" advises (random_flip_left_right flips each image of a batch on its
own draw).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from peer_common import MEAN, PIPELINES, STD, arguments, load_train, run  # noqa: E402

AUTOTUNE = tf.data.AUTOTUNE


def build(a):
    def make():
        images, labels = load_train(a.data)
        ds = tf.data.Dataset.from_tensor_slices((images[..., None], labels))
        if a.pipeline == "mlp":
            ds = ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y), num_parallel_calls=AUTOTUNE).cache()
        else:
            ds = ds.map(lambda x, y: ((tf.cast(x, tf.float32) / 255.0 - MEAN) / STD, y), num_parallel_calls=AUTOTUNE)
            ds = ds.cache()
            if not a.vectorized:
                ds = ds.map(lambda x, y: (tf.image.random_flip_left_right(x), y), num_parallel_calls=AUTOTUNE)
        ds = ds.shuffle(60000).batch(PIPELINES[a.pipeline]["batch"])
        if a.pipeline == "resnet" and a.vectorized:
            ds = ds.map(lambda x, y: (tf.image.random_flip_left_right(x), y), num_parallel_calls=AUTOTUNE)
        return ds.prefetch(AUTOTUNE)

    return make


def main():
    def extra(ap):
        ap.add_argument("--consumer", choices=["eager", "graph"], default="eager")
        ap.add_argument("--vectorized", action="store_true")

    a = arguments(extra)
    tf.random.set_seed(1)

    def eager(ds):
        n = 0
        for x, _ in ds:
            n += int(x.shape[0])
        return n

    @tf.function
    def graph_count(ds):
        return ds.reduce(tf.constant(0, tf.int64), lambda n, b: n + tf.shape(b[0], out_type=tf.int64)[0])

    consume = eager if a.consumer == "eager" else (lambda ds: int(graph_count(ds)))
    vec = " vectorized" if a.vectorized else ""
    run(f"tf.data {a.pipeline} {a.consumer}{vec}", build(a), consume, a.epochs,
        f"TensorFlow {tf.__version__}, {a.consumer} consumer{vec}, batch {PIPELINES[a.pipeline]['batch']}")


if __name__ == "__main__":
    main()
