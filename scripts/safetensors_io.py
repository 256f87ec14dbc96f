"""safetensors files read and written by hand, one way for the reference scripts
(jax_reference.py and torch_reference.py import it from beside them): an 8-byte little-endian
header length, a JSON header of dtype / shape / data_offsets, then the raw data."""

import json
import math
import struct


def read_header(path, fail):
    """(the file's bytes, its header without `__metadata__`, the offset of its data), or
    `fail(message)` where the file at `path` is not a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        fail(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        fail(f"{path}: not a safetensors file (header length {n} past the end)")
    try:
        header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    except ValueError as e:
        fail(f"{path}: not a safetensors file ({e})")
    header.pop("__metadata__", None)
    return raw, header, 8 + n


def read(path, fail, itemsize, by_offset=False):
    """[(name, dtype name, shape, the tensor's bytes)] of the file at `path`, in the header's
    order or (`by_offset`) the data's, each checked: `itemsize(dtype name)` is the element size,
    or None for a dtype the caller does not read; the offsets span exactly the shape's bytes,
    inside the file. `fail(message)` where a check fails."""
    raw, header, base = read_header(path, fail)
    items = list(header.items())
    if by_offset:
        items.sort(key=lambda kv: kv[1]["data_offsets"][0])
    out = []
    for name, info in items:
        size_of = itemsize(info["dtype"])
        if size_of is None:
            fail(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        shape = [int(d) for d in info["shape"]]
        start, end = info["data_offsets"]
        size = math.prod(shape) * size_of
        if end - start != size or base + end > len(raw):
            fail(f"{path}: tensor {name!r} has offsets {start}..{end}, not {size} bytes of {shape}")
        out.append((name, info["dtype"], shape, raw[base + start : base + end]))
    return out


def write(path, entries):
    """Writes `entries`, each (name, dtype name, shape, little-endian bytes), in their order as a
    safetensors file, the header padded to 8 bytes."""
    header, chunks, offset = {}, [], 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)
