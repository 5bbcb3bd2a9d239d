#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz harnesses into tests/fuzz/corpus/<name>/ (see README.md).

Seeds are small valid files plus a few near-misses, each prefixed with the harness's option byte(s). Rerunning
this script rewrites the seed-*.bin files only; inputs kept because they once crashed Kiln (crash-*) stay.
"""
import gzip
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def put(name, file, data):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, file), "wb") as f:
        f.write(data)


def gz(b):
    return gzip.compress(b, mtime=0)


# --- idx: opts, u16 images length, images, labels
def idx_images(n, r, c):
    return struct.pack(">IIII", 0x803, n, r, c) + bytes((i * 37) % 256 for i in range(n * r * c))


def idx_labels(n):
    return struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n))


def idx_input(opts, images, labels):
    return bytes([opts]) + struct.pack("<H", len(images)) + images + labels


put("idx", "seed-plain.bin", idx_input(0, idx_images(3, 2, 2), idx_labels(3)))
put("idx", "seed-limit.bin", idx_input(2, idx_images(4, 3, 1), idx_labels(4)))
put("idx", "seed-gzip.bin", idx_input(0, gz(idx_images(3, 2, 2)), gz(idx_labels(3))))
put("idx", "seed-short.bin", idx_input(0, idx_images(3, 2, 2)[:-3], idx_labels(3)))
put("idx", "seed-swapped.bin", idx_input(0, idx_labels(3), idx_images(3, 2, 2)))

# --- cifar: opts (files-1, limit), records
def cifar_records(labels):
    return b"".join(bytes([l]) + bytes((i + l) % 256 for i in range(3072)) for l in labels)


put("cifar", "seed-one.bin", bytes([0]) + cifar_records([3, 9]))
put("cifar", "seed-two-files.bin", bytes([1 | (1 << 2)]) + cifar_records([1, 2]))
put("cifar", "seed-gzip.bin", bytes([0]) + gz(cifar_records([0, 5])))
put("cifar", "seed-bad-label.bin", bytes([0]) + cifar_records([10]))

# --- csv: opts (header, delimiter, label, limit), text
put("csv", "seed-header.bin", bytes([1 | (1 << 3)]) + b"a,b,label\n1,2,0\n3.5,-1,1\n\n0,1e3,2\n")
put("csv", "seed-plain.bin", bytes([0]) + b"1,2,3\n4,5,6\r\n")
put("csv", "seed-semicolon.bin", bytes([1 | (1 << 1) | (2 << 3) | (1 << 5)]) + b"x;y\n\"1\";2\n 3 ;\t4\n")
put("csv", "seed-tab-gzip.bin", bytes([2 << 1 | (3 << 3)]) + gz(b"0\t1\t2\n3\t4\t5\n"))
put("csv", "seed-bad-number.bin", bytes([0]) + b"1,2\n3,nan\n")

# --- cache: opts (shapes, repair), file. Format of plugins/data/cache_file.cpp (native little endian).
SHAPES = [((2,), ()), ((1, 2, 2), ()), ((3,), (2,)), ((), ())]


def numel(s):
    n = 1
    for d in s:
        n *= d
    return n


def cache_file(shape_i, batches):
    x, y = SHAPES[shape_i]
    payload = b""
    examples = 0
    for b in batches:
        n = b if b > 0 else 1
        examples += n
        payload += struct.pack("<q", b) + struct.pack("<%df" % (n * (numel(x) + numel(y))),
                                                      *[float(i) for i in range(n * (numel(x) + numel(y)))])
    shapes = struct.pack("<I", len(x)) + b"".join(struct.pack("<q", d) for d in x)
    shapes += struct.pack("<I", len(y)) + b"".join(struct.pack("<q", d) for d in y)
    hlen = 44 + len(shapes) + 4
    h = b"KILNCAC1" + struct.pack("<IIQQQI", 1, hlen, len(batches), examples, len(payload), zlib.crc32(payload))
    h += shapes
    h += struct.pack("<I", zlib.crc32(h))
    return h + payload


put("cache", "seed-single.bin", bytes([0]) + cache_file(0, [0, 0, 0]))
put("cache", "seed-batched.bin", bytes([1]) + cache_file(1, [2, 1]))
put("cache", "seed-xy.bin", bytes([2 | 4]) + cache_file(2, [0, 3]))
put("cache", "seed-scalar.bin", bytes([3 | 4]) + cache_file(3, [5]))
put("cache", "seed-wrong-shape.bin", bytes([1]) + cache_file(0, [0]))


# --- checkpoint: opts (repair checksum), file. Format of core/src/train/checkpoint.cpp.
def fnv(b):
    h = 1469598103934665603
    for c in b:
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def checkpoint(epoch, step, data_state, tensors):
    b = b"KILNCKP1" + struct.pack("<qqQ", epoch, step, len(data_state)) + data_state
    b += struct.pack("<Q", len(tensors))
    for name, dims in tensors:
        b += struct.pack("<I", len(name)) + name.encode() + struct.pack("<I", len(dims))
        b += b"".join(struct.pack("<q", d) for d in dims)
        b += struct.pack("<%df" % numel(dims), *[0.5 * i for i in range(numel(dims))])
    return b + struct.pack("<Q", fnv(b))


put("checkpoint", "seed-two.bin", bytes([1]) + checkpoint(2, 40, b"state", [("dense_1.w", (2, 3)), ("dense_1.b", (3,))]))
put("checkpoint", "seed-scalar.bin", bytes([1]) + checkpoint(0, 1, b"", [("step", ())]))
put("checkpoint", "seed-empty.bin", bytes([0]) + checkpoint(1, 0, b"", []))

# --- session: TOML text (no '/' or '\\': the harness skips such inputs).
SESSION = {
    "mlp": """[run]
name = "mlp"
seed = 3
[model]
input_shape = [1, 2, 2]
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 8
activation = "relu"
[[model.layers]]
type = "dense"
units = 10
[optimizer]
type = "adam"
learning_rate = 0.001
[train]
epochs = 2
batch_size = 2
[data.train]
stages = [{type = "idx", images = "images", labels = "labels"}, {type = "scale", factor = 0.5}, {type = "shuffle", buffer = 4}, {type = "batch", size = 2}]
[data.test]
stages = [{type = "idx", images = "images", labels = "labels", limit = 2}]
""",
    "cnn": """[model]
input_shape = [3, 32, 32]
[[model.layers]]
type = "conv2d"
filters = 4
kernel = 3
padding = "same"
activation = "relu"
[[model.layers]]
type = "max_pool2d"
pool = 2
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 10
[memory]
recompute = "auto"
[device]
backend = "cpu"
memory_limit = "64MiB"
[train]
batch_size = 2
[data.train]
stages = [{type = "cifar10", files = ["data.bin"]}, {type = "map", ops = [{op = "random_crop", size = [32, 32], padding = 2}]}, {type = "cache", kind = "memory"}, {type = "batch", size = 2}, {type = "prefetch", depth = 2}]
""",
    "csv": """[model]
input_shape = [2]
[[model.layers]]
type = "dense"
units = 3
[optimizer]
type = "sgd"
learning_rate = 0.1
momentum = 0.9
[strategy]
type = "data_parallel"
[train]
batch_size = 3
[data.train]
stages = [{type = "csv", path = "data.csv", header = true, label = "label"}, {type = "batch", size = 3}]
""",
    "synthetic": """[model]
input_shape = [4]
[[model.layers]]
type = "dense"
units = 2
[data.train]
stages = [{type = "synthetic", examples = 8, shape = [4], classes = 2}]
[train]
steps_per_epoch = 2
memory_policy = "fit"
""",
}
# The samples, their data paths pointed at the harness's small files and their comments dropped.
SAMPLES = os.path.join(HERE, "..", "..", "samples")
for f in sorted(os.listdir(SAMPLES)):
    if not f.endswith(".toml"):
        continue
    text = open(os.path.join(SAMPLES, f)).read()
    lines = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if "#" in line and '"' not in line.split("#", 1)[1]:
            line = line.split("#", 1)[0].rstrip()
        lines.append(line)
    text = "\n".join(lines) + "\n"
    for old, new in (("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", "images"),
                     ("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz", "images"),
                     ("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz", "labels"),
                     ("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", "labels")):
        text = text.replace(old, new)
    if "/" not in text and "\\" not in text:
        SESSION["sample-" + f[:-5]] = text
for k, v in SESSION.items():
    put("session", "seed-%s.toml" % k, v.encode())
