#!/usr/bin/python3
"""PyTorch peer of `specmoe bench layer`: one MoE layer, forward + backward + Adam step, float32, CPU.

The layer is the Hugging Face Mixtral sparse-MoE block with ReLU MLP experts (what specmoe's "topk"
router + expert MLPs compute): router Linear(d, E, bias=False) -> softmax -> top-k -> renormalise;
loop over experts, gather the expert's tokens with torch.where on the one-hot expert mask, run
Linear(d,h) -> ReLU -> Linear(h,d), scale by the routing weight, index_add_ into the output.
A step is zero_grad, forward, loss = sum(out * G) for a fixed random G, backward (x requires grad,
as specmoe's backward always produces dx), Adam step.

Threads: torch.set_num_threads(N) sets ATen's OpenMP pool, but Debian's torch does its GEMMs in
OpenBLAS (pthreads build), whose pool only follows OPENBLAS_NUM_THREADS read at load time; so this
script sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS to N *before* importing torch, then reports what
both pools really are, and per shape the measured CPU time / wall time (about N if N threads work).
The two pools are separate, so by default OMP_WAIT_POLICY=passive stops idle OpenMP workers from
spinning on the cores the OpenBLAS workers need: measured on 2 cores with the default (active)
policy the peer ran 2-4x slower (T=1024 d=256 h=512 E=8 k=2: 6.1k tokens/s active, 26k passive;
OPENBLAS_NUM_THREADS=1 instead gave 21k there but 1.7x less on T=4096 d=512 h=2048). The peer
should be PyTorch at its best on this machine, so passive is the default (--omp-wait-policy).

Output, one line per shape on stdout (diagnostics go to stderr):
    bench-peer T=256 d=64 h=256 E=8 k=2 threads=2 ms_per_step=1.234 tokens_per_s=123456

Usage: /usr/bin/python3 tools/bench_peer.py [--threads N] [--seconds S] [--shapes "T,d,h,E,k;..."]
"""
import argparse
import ctypes
import ctypes.util
import os
import sys
import time

DEFAULT_SHAPES = "256,64,256,8,2;256,128,256,10,2;1024,256,512,8,2;4096,512,2048,8,2;2048,256,1024,32,4"


def parse_args():
    ap = argparse.ArgumentParser(description="PyTorch peer of `specmoe bench layer`")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    ap.add_argument("--seconds", type=float, default=1.0, help="minimum timed seconds per shape (default 1)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per shape (default 2)")
    ap.add_argument("--min-steps", type=int, default=3, help="minimum timed steps per shape (default 3)")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help='"T,d,h,E,k;..." (default: the specmoe bench shapes)')
    ap.add_argument("--blas-threads", type=int, default=0, help="OpenBLAS threads (default: --threads)")
    ap.add_argument("--omp-wait-policy", choices=["passive", "active"], default="passive",
                    help="OMP_WAIT_POLICY for torch's OpenMP pool (default passive, see above)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    if args.blas_threads < 0:
        ap.error("--blas-threads must be >= 1 (0: same as --threads)")
    args.blas_threads = args.blas_threads or args.threads
    shapes = []
    for s in args.shapes.split(";"):
        if not s.strip():
            continue
        try:
            T, d, h, E, k = (int(v) for v in s.split(","))
        except ValueError:
            ap.error(f"bad shape '{s}': expected T,d,h,E,k")
        if min(T, d, h, E, k) < 1 or k > E:
            ap.error(f"bad shape '{s}': all sizes must be >= 1 and k <= E")
        shapes.append((T, d, h, E, k))
    args.shapes = shapes
    return args


args = parse_args()
# before torch (and with it OpenBLAS and libgomp) is loaded: their pools are sized at load time
os.environ["OMP_NUM_THREADS"] = str(args.threads)
os.environ["OPENBLAS_NUM_THREADS"] = str(args.blas_threads)
os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Expert(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.w1 = nn.Linear(d, h)
        self.w2 = nn.Linear(h, d)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


class SparseMoeBlock(nn.Module):
    """transformers' MixtralSparseMoeBlock.forward, with ReLU MLP experts and no jitter noise."""

    def __init__(self, d, h, E, k):
        super().__init__()
        self.E, self.k = E, k
        self.gate = nn.Linear(d, E, bias=False)
        self.experts = nn.ModuleList(Expert(d, h) for _ in range(E))

    def forward(self, x):  # x (T,d)
        router_logits = self.gate(x)                                    # (T,E)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected = torch.topk(routing_weights, self.k, dim=-1)
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(x.dtype)
        out = torch.zeros_like(x)
        expert_mask = F.one_hot(selected, num_classes=self.E).permute(2, 1, 0)  # (E,k,T)
        for e in range(self.E):
            idx, top_x = torch.where(expert_mask[e])
            if top_x.numel() == 0:
                continue
            cur = x[top_x]
            y = self.experts[e](cur) * routing_weights[top_x, idx, None]
            out.index_add_(0, top_x, y)
        return out


def openblas_threads():
    """Threads of the OpenBLAS torch loaded (None if it cannot be asked)."""
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)  # already loaded by torch: the same instance is returned
            lib.openblas_get_num_threads.restype = ctypes.c_int
            return lib.openblas_get_num_threads()
        except (OSError, AttributeError):
            pass
    return None


def system_busy_seconds():
    """CPU seconds all processes have spent busy since boot (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait
    except (OSError, ValueError, IndexError):
        return None


def bench(shape, threads, seconds, warmup, min_steps, seed):
    T, d, h, E, k = shape
    torch.manual_seed(seed)
    layer = SparseMoeBlock(d, h, E, k)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-3)
    x = torch.randn(T, d, requires_grad=True)
    G = torch.randn(T, d)

    def step():
        opt.zero_grad(set_to_none=True)
        x.grad = None
        out = layer(x)
        (out * G).sum().backward()
        opt.step()

    for _ in range(warmup):
        step()
    n = 0
    b0, c0, t0 = system_busy_seconds(), time.process_time(), time.perf_counter()
    while True:
        step()
        n += 1
        wall = time.perf_counter() - t0
        if wall >= seconds and n >= min_steps:
            break
    cpu = time.process_time() - c0
    b1 = system_busy_seconds()
    others = max(0.0, b1 - b0 - cpu) if b0 is not None and b1 is not None else 0.0
    per = wall / n
    print(f"bench-peer T={T} d={d} h={h} E={E} k={k} threads={threads} ms_per_step={per * 1e3:.3f} "
          f"tokens_per_s={T / per:.0f}", flush=True)
    print(f"#   T={T} d={d} h={h} E={E} k={k}: {n} timed steps in {wall:.2f} s, cpu/wall = {cpu / wall:.2f}, "
          f"other processes {others:.2f} cpu-s", file=sys.stderr, flush=True)
    if others > 0.05 * wall * (os.cpu_count() or 1):
        # OpenMP / OpenBLAS pools slow down far more than proportionally when a worker is descheduled
        print(f"# bench-peer: WARNING: other processes used {others:.2f} cpu-s of the {wall:.2f} s run: "
              f"this timing is not trustworthy", file=sys.stderr, flush=True)


def main():
    torch.set_num_threads(args.threads)
    got = torch.get_num_threads()
    ob = openblas_threads()
    print(f"# bench-peer: torch {torch.__version__}, set_num_threads({args.threads}) -> get_num_threads() = {got}, "
          f"OpenBLAS threads = {ob if ob is not None else 'unknown'}, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
          f"cores = {os.cpu_count()}", file=sys.stderr, flush=True)
    if got != args.threads or (ob is not None and ob != args.blas_threads):
        print(f"# bench-peer: WARNING: asked for {args.threads} torch / {args.blas_threads} OpenBLAS threads, "
              f"got {got} / {ob}", file=sys.stderr, flush=True)
    torch.set_grad_enabled(True)
    for shape in args.shapes:
        bench(shape, got, args.seconds, args.warmup, args.min_steps, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
