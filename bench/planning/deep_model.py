#!/usr/bin/env python3
"""Writes a TOML config with N layers (dense 16 and relu activation alternating) for timing `kiln plan` on very deep models.

usage: deep_model.py N [OUT.toml]
"""
import sys

n = int(sys.argv[1])
out = open(sys.argv[2], "w") if len(sys.argv) > 2 else sys.stdout
out.write(f"""# {n} layers: dense 16 and relu activation alternating (bench/planning/run.sh)
[run]
name = "deep_{n}"

[device]
backend = "cpu"
memory_limit = "8GiB"

[model]
input_shape = [16]
loss = "softmax_cross_entropy"

""")
for i in range(n):
    if i % 2 == 0 or i == n - 1:
        out.write('[[model.layers]]\ntype = "dense"\nunits = 16\n\n')
    else:
        out.write('[[model.layers]]\ntype = "activation"\n\n')
out.write("""[optimizer]
type = "adam"

[train]
batch_size = 8
""")
