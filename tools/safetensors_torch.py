#!/usr/bin/python3
"""Pure-Python safetensors reader/writer on top of torch and numpy (no `safetensors` package).

The format (https://github.com/huggingface/safetensors):

    [8 bytes: little-endian u64 N][N bytes: UTF-8 JSON object, space-padded][raw little-endian data]

The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} with offsets
relative to the first byte after the header, and may hold "__metadata__": {str: str}. The data
section must be covered exactly: no holes, no overlaps, nothing after the last tensor.

Library use:
    import safetensors_torch as st
    tensors, meta = st.load("model.safetensors")      # dict name -> torch.Tensor, dict str -> str
    st.save(tensors, "copy.safetensors", metadata=meta)

CLI (run with Debian's /usr/bin/python3, which has torch):
    safetensors_torch.py info FILE                      metadata and a tensor table
    safetensors_torch.py roundtrip IN OUT               load into torch, check finite, write as F32
    safetensors_torch.py convert IN OUT --dtype f16|bf16  cast the floating tensors
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

# dtype name -> (torch dtype, numpy little-endian dtype used to move the bytes, item size).
# BF16 has no numpy type: its bytes travel as int16 and are reinterpreted with Tensor.view.
DTYPES = {
    "F64": (torch.float64, "<f8", 8),
    "F32": (torch.float32, "<f4", 4),
    "F16": (torch.float16, "<f2", 2),
    "BF16": (torch.bfloat16, "<i2", 2),
    "I64": (torch.int64, "<i8", 8),
    "I32": (torch.int32, "<i4", 4),
    "U8": (torch.uint8, "u1", 1),
    "BOOL": (torch.bool, "u1", 1),
}
TORCH_TO_NAME = {v[0]: k for k, v in DTYPES.items()}
FLOAT_NAMES = ("F64", "F32", "F16", "BF16")

# A header larger than this is refused before it is read (the Rust implementation uses 100 MB).
MAX_HEADER = 100 * 1000 * 1000


class FormatError(ValueError):
    """Malformed safetensors input; the message names the file and, where known, the byte offset."""


def _fail(path, what, offset=None):
    where = f"{path}" if offset is None else f"{path}: offset {offset}"
    raise FormatError(f"{where}: {what}")


def parse_header(buf, path="<memory>"):
    """Validates the header of the file contents buf (bytes). Returns (entries, metadata, data_start)
    with entries a list of (name, dtype, shape, begin, end) sorted by begin."""
    size = len(buf)
    if size < 8:
        _fail(path, f"file is {size} bytes, shorter than the 8-byte header length", 0)
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n > MAX_HEADER:
        _fail(path, f"header length {n} exceeds the {MAX_HEADER}-byte limit", 0)
    if 8 + n > size:
        _fail(path, f"header length {n} runs past the end of the {size}-byte file", 0)
    raw = bytes(buf[8:8 + n])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        _fail(path, f"header is not UTF-8 ({e.reason})", 8 + e.start)
    if not text.startswith("{"):
        _fail(path, "header does not start with '{'", 8)
    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        dup = next((k for k in keys if keys.count(k) > 1), None)
        if dup is not None:
            _fail(path, f"header names '{dup}' twice", 8)
        return dict(pairs)

    try:
        header = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
        _fail(path, f"header is not valid JSON ({e.msg})", 8 + e.pos)
    if not isinstance(header, dict):
        _fail(path, "header is not a JSON object", 8)
    data_start = 8 + n
    data_len = size - data_start
    meta = header.pop("__metadata__", None)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        _fail(path, "__metadata__ must map strings to strings", 8)
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            _fail(path, f"tensor '{name}': entry is not an object", 8)
        dt = info.get("dtype")
        if dt not in DTYPES:
            _fail(path, f"tensor '{name}': unsupported dtype {dt!r} (supported: {', '.join(DTYPES)})", 8)
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                  for s in shape):
            _fail(path, f"tensor '{name}': shape {shape!r} is not a list of non-negative integers", 8)
        offs = info.get("data_offsets")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            _fail(path, f"tensor '{name}': data_offsets {offs!r} is not a pair of integers", 8)
        b, e = offs
        if not (0 <= b <= e <= data_len):
            _fail(path, f"tensor '{name}': data_offsets [{b}, {e}] outside the {data_len}-byte data section",
                  data_start + min(max(b, 0), data_len))
        numel = math.prod(shape)
        if e - b != numel * DTYPES[dt][2]:
            _fail(path, f"tensor '{name}': {e - b} bytes for shape {shape} of {dt} "
                  f"(expected {numel * DTYPES[dt][2]})", data_start + b)
        entries.append((name, dt, shape, b, e))
    # the data section must be indexed entirely: sorted by offset, each tensor starts where the last ended
    entries.sort(key=lambda t: (t[3], t[4]))
    pos = 0
    for name, _, _, b, e in entries:
        if b != pos:
            what = "overlaps the previous tensor" if b < pos else f"leaves a hole of {b - pos} bytes"
            _fail(path, f"tensor '{name}': data_offsets [{b}, {e}] {what}", data_start + b)
        pos = e
    if pos != data_len:
        _fail(path, f"{data_len - pos} trailing bytes after the last tensor", data_start + pos)
    return entries, meta, data_start


def _to_tensor(raw, dt, shape):
    tdt, npdt, _ = DTYPES[dt]
    arr = np.frombuffer(raw, dtype=npdt).copy()  # copy: writable, owned, native order
    if dt == "BOOL":
        if arr.size and arr.max() > 1:
            raise FormatError("BOOL tensor holds a byte other than 0/1")
        t = torch.from_numpy(arr.astype(np.bool_))
    else:
        t = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("=")))
        if dt == "BF16":
            t = t.view(torch.bfloat16)
    return t.reshape(shape)


def load(path):
    """Reads a safetensors file. Returns (dict name -> torch.Tensor in file order, metadata dict)."""
    with open(path, "rb") as f:
        buf = f.read()
    entries, meta, start = parse_header(buf, path)
    tensors = {}
    for name, dt, shape, b, e in entries:
        try:
            tensors[name] = _to_tensor(buf[start + b:start + e], dt, shape)
        except FormatError as err:
            _fail(path, f"tensor '{name}': {err}", start + b)
    return tensors, dict(meta)


def _tensor_bytes(t):
    """(dtype name, shape, little-endian bytes) of a torch tensor or numpy array."""
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(t))
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor or numpy array, got {type(t).__name__}")
    t = t.detach().cpu().contiguous()
    if t.dtype not in TORCH_TO_NAME:
        raise TypeError(f"dtype {t.dtype} cannot be stored (supported: {', '.join(DTYPES)})")
    dt = TORCH_TO_NAME[t.dtype]
    if dt == "BF16":
        arr = t.view(torch.int16).numpy()
    elif dt == "BOOL":
        arr = t.numpy().astype(np.uint8)
    else:
        arr = t.numpy()
    return dt, list(t.shape), arr.astype(DTYPES[dt][1], copy=False).tobytes()


def save(tensors, path, metadata=None):
    """Writes tensors (dict name -> torch.Tensor / numpy array) to path: header with "__metadata__"
    first, then tensors in sorted-name order, contiguous. Written to path.tmp and renamed so a crash
    never leaves a torn file."""
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata must map strings to strings")
    header = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    chunks, pos = [], 0
    for name in sorted(tensors):
        if name == "__metadata__":
            raise ValueError("'__metadata__' is reserved and cannot name a tensor")
        dt, shape, raw = _tensor_bytes(tensors[name])
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    hb = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    hb += b" " * (-len(hb) % 8)  # pad so the data section starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for c in chunks:
            f.write(c)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- CLI

def _fmt_shape(shape):
    return "(" + ", ".join(str(s) for s in shape) + ")"


def cmd_info(args):
    with open(args.file, "rb") as f:
        buf = f.read()
    entries, meta, start = parse_header(buf, args.file)
    tensors, _ = load(args.file)
    print(f"{args.file}: {len(buf)} bytes, header {start - 8} bytes, {len(entries)} tensors")
    print("metadata:" if meta else "metadata: (none)")
    for k in sorted(meta):
        v = meta[k]
        print(f"  {k} = {v if len(v) <= 200 else v[:200] + '...'}")
    w = max([len(e[0]) for e in entries] + [4])
    print(f"{'name':<{w}}  {'dtype':<5}  {'shape':<14}  {'begin':>8}  {'end':>8}  {'min':>11}  {'max':>11}")
    for name, dt, shape, b, e in entries:
        t = tensors[name]
        if t.numel() and dt != "BOOL":
            td = t.double()
            lo, hi = f"{td.min().item():.4g}", f"{td.max().item():.4g}"
        else:
            lo = hi = "-"
        print(f"{name:<{w}}  {dt:<5}  {_fmt_shape(shape):<14}  {b:>8}  {e:>8}  {lo:>11}  {hi:>11}")
    return 0


def cmd_roundtrip(args):
    tensors, meta = load(args.input)
    out = {}
    for name, t in tensors.items():
        if t.is_floating_point():
            if not torch.isfinite(t).all():
                bad = (~torch.isfinite(t)).nonzero()[0].tolist()
                print(f"safetensors_torch: {args.input}: tensor '{name}' is not finite at {bad}", file=sys.stderr)
                return 1
            out[name] = t.to(torch.float32)
        else:
            out[name] = t  # integer / bool tensors keep their dtype
    save(out, args.output, meta)
    # read the written file back and check it holds exactly what was meant to be written
    back, bmeta = load(args.output)
    if bmeta != meta or set(back) != set(out):
        print(f"safetensors_torch: {args.output}: names or metadata differ after writing", file=sys.stderr)
        return 1
    for name, t in out.items():
        if back[name].dtype != t.dtype or not torch.equal(back[name], t):
            print(f"safetensors_torch: {args.output}: tensor '{name}' differs after writing", file=sys.stderr)
            return 1
    n = sum(t.numel() for t in out.values())
    print(f"roundtrip: {args.input} -> {args.output}: {len(out)} tensors, {n} values, all finite, "
          f"written as F32 by torch {torch.__version__} and read back identical")
    return 0


def cmd_convert(args):
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    tensors, meta = load(args.input)
    out = {name: (t.to(tdt) if t.is_floating_point() else t) for name, t in tensors.items()}
    save(out, args.output, meta)
    nf = sum(1 for t in tensors.values() if t.is_floating_point())
    print(f"convert: {args.input} -> {args.output}: {nf} of {len(out)} tensors cast to {TORCH_TO_NAME[tdt]}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="safetensors_torch.py",
                                 description="safetensors in pure Python + torch: inspect, round-trip, convert")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="print the metadata and a tensor table")
    p.add_argument("file")
    p.set_defaults(fn=cmd_info)
    p = sub.add_parser("roundtrip", help="load into torch, check finite, write back as F32")
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(fn=cmd_roundtrip)
    p = sub.add_parser("convert", help="write a copy with floating tensors cast to --dtype")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--dtype", choices=["f16", "bf16", "f32"], required=True)
    p.set_defaults(fn=cmd_convert)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
    except (FormatError, OSError) as e:
        print(f"safetensors_torch: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
