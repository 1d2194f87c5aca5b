#!/usr/bin/python3
"""PyTorch peer of `specmoe rl train --env minatar/breakout --agent dqn --preset minatar`.

The same agent and the same game, written the way a PyTorch user would, so that frames/s can be
compared like with like (issue 13, speed: "DQN on MinAtar Breakout ... at least 5x a PyTorch
implementation of the same agent and environment").

Agent (src/rl/dqn.c, preset "minatar"; Young & Tian 2019, Sec. 4):
  Q-network   Conv2d(4, 16, 3, stride 1, no padding) -> ReLU -> flatten (16 x 8 x 8 = 1024)
              -> Linear(1024, 128) -> ReLU -> Linear(128, 6); torch's default initialisation,
              which is specmoe's too (uniform +-1/sqrt(fan_in) for weights and biases)
  target      a copy of the online network every 1000 frames (tau = 1)
  loss        Huber (smooth L1, beta 1) of Q(s, a) - y, mean over the batch,
              y = r + 0.99 * (1 - terminal) * max_a' Q_target(s', a')
  optimiser   RMSprop, centered, lr 2.5e-4, alpha 0.95, eps 0.01 (torch semantics, as specmoe's)
  exploration epsilon 1 for the first 5000 frames (random play fills the replay), then linear
              1 -> 0.1 over 100k frames
  replay      100k transitions, observations and next observations stored as bytes, uniform
              sampling with replacement, batch 32, one update per frame from frame 5000 on
Environment: envs/minatar/breakout.c + envs/minatar/minatar.c (specmoe's own Breakout, written
from the MinAtar paper's rules) ported line by line to Python below: sticky actions p = 0.1, the
same paddle, ball, brick and termination rules, auto-reset, the final observation of an episode
as the next observation of its last transition. (MinAtar's own GPL code is neither used nor read.)

Threads: one. OMP_NUM_THREADS / MKL_NUM_THREADS / OPENBLAS_NUM_THREADS are set to 1 before torch
is imported (Debian's torch does GEMMs in OpenBLAS, whose pool only reads its variable at load
time), then torch.set_num_threads(1) and set_num_interop_threads(1).

Modes (one result line on stdout each; diagnostics on stderr):
  train (default)  --frames N: the whole loop (--eps-start E --eps-end E: a fixed exploration rate
                   after the warm-up, e.g. 0.1 for the regime of frames > 105k, as specmoe's flags); times the random warm-up and the learning phase
                   separately, wall clock and this process's CPU clock:
    peer-dqn frames=N warmup=5000 seconds=S SPS=X cpu_s=C cpu_us_per_frame=U learn_frames=L
             learn_SPS=Y learn_cpu_us_per_frame=V warmup_SPS=Z updates=K episodes=E mean_return=R
    (SPS = all N frames over the wall time of the loop, as `specmoe rl train` reports it)
  --update-only    the update alone, no environment and no replay sampling: target forward on
                   32 next states, online forward + backward on 32 states, Huber loss, RMSprop
                   step, on fixed random binary batches (--obs env: Breakout frames under a random
                   policy, as dqn_update's); --seconds S of timed updates. --net NAME takes another
                   Q-network of the same update: the Fig. 1 networks of `specmoe bench tokenize`
                   (baseline, baseline-x4, softmoe-4, softmoe-1-x4, expert-choice-1-x4; issue 14),
                   as tools/peers/compare_tokenize.sh times them against specmoe's:
    peer-dqn-update net=NAME obs=KIND batch=32 updates=K seconds=S updates_per_s=X us_per_update=U
                    cpu_us_per_update=V params=P
  --check FILE     the --net network with specmoe's parameters against specmoe's Q-values and its
                   gradients of the update's Huber loss, all from `build/dqn_update --dump FILE`
                   (same --arch): the peer computes the same function, forward and backward:
    peer-check net=NAME max_abs_diff=E max_abs_q=Q grad_max_rel_diff=G (PARAM) ok|MISMATCH
                   (exit status 1 on a mismatch: |dQ| > 1e-5 + 1e-4 max|Q|, or a gradient off by more
                   than 1e-3 of its tensor's largest entry)
  --random-episodes N  N episodes of a uniform random policy (to check the port against
                   `specmoe rl eval --env minatar/breakout --policy random --episodes N`):
    peer-breakout-random episodes=N mean_return=R std_return=D mean_length=L

Usage: /usr/bin/python3 tools/peers/dqn_minatar.py [--frames N] [--seed S]
       [--update-only [--seconds S] [--net NAME] [--obs random|env] [--profile]]
       [--random-episodes N]
"""
import argparse
import os
import random
import sys
import time

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_v] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# ---- the game: envs/minatar/minatar.h, minatar.c, breakout.c ----

N = 10  # the grid is N x N
NOOP, LEFT, UP, RIGHT, DOWN, FIRE, NUM_ACTIONS = 0, 1, 2, 3, 4, 5, 6
PADDLE, BALL, TRAIL, BRICK, CHANNELS = 0, 1, 2, 3, 4
BRICK_ROW0, BRICK_ROWS, FULL_ROW = 1, 3, 0x3FF
# row of ten cells from a 10-bit mask (bit x = column x): ma_set_row
ROW_OF_MASK = np.array([[(m >> x) & 1 for x in range(N)] for m in range(1 << N)], dtype=np.float32)


class Breakout:
    """specmoe's MinAtar Breakout (envs/minatar/breakout.c); see the rules in its header comment."""

    def __init__(self, seed, sticky=0.1):
        self.rng = random.Random(seed)
        self.sticky = sticky
        self.last_action = NOOP
        self.ep_return = 0.0
        self.ep_length = 0

    # ma_action: sticky actions (with probability p the previous action is executed instead)
    def _action(self, a):
        if a < 0 or a >= NUM_ACTIONS:
            a = NOOP
        if self.sticky > 0 and self.rng.random() < self.sticky:
            a = self.last_action
        self.last_action = a
        return a

    def _is_brick(self, y, x):
        r = y - BRICK_ROW0
        return 0 <= r < BRICK_ROWS and (self.bricks[r] >> x) & 1

    def _fill_bricks(self):
        self.bricks = [FULL_ROW] * BRICK_ROWS
        r = self.by - BRICK_ROW0
        if 0 <= r < BRICK_ROWS:
            self.bricks[r] &= ~(1 << self.bx)

    def _draw(self):
        obs = np.zeros((CHANNELS, N, N), dtype=np.float32)
        obs[PADDLE, N - 1, self.paddle] = 1
        obs[BALL, self.by, self.bx] = 1
        obs[TRAIL, self.ty, self.tx] = 1
        for r in range(BRICK_ROWS):
            obs[BRICK, BRICK_ROW0 + r] = ROW_OF_MASK[self.bricks[r]]
        return obs

    def reset(self):
        self.last_action = NOOP
        self.paddle = 4
        left = self.rng.randrange(2) == 0
        self.bx = 0 if left else N - 1
        self.by = 4
        self.dx = 1 if left else -1
        self.dy = 1
        self.tx, self.ty = self.bx, self.by
        self.done = False
        self._fill_bricks()
        return self._draw()

    def _ball(self):
        nx, ny = self.bx + self.dx, self.by + self.dy
        if nx < 0 or nx >= N:  # off a side wall: back into its own column
            self.dx = -self.dx
            nx = self.bx
        if ny < 0:  # off the top wall: along row 0
            self.dy = 1
            ny = self.by
        if self._is_brick(ny, nx):
            self.bricks[ny - BRICK_ROW0] &= ~(1 << nx)
            self.dy = -self.dy
            if (self.bricks[0] | self.bricks[1] | self.bricks[2]) == 0:
                self._fill_bricks()
            return 1.0
        if ny == N - 1:
            if self.paddle == nx or self.paddle == self.bx:
                if self.paddle == nx:  # near side: back the way it came
                    self.dx = -self.dx
                self.dy = -1
                return 0.0
            self.done = True
        self.tx, self.ty = self.bx, self.by
        self.bx, self.by = nx, ny
        return 0.0

    def step(self, a):
        """Returns (obs, reward, terminal); the caller resets after a terminal step (auto-reset)."""
        a = self._action(a)
        self.paddle = min(max(self.paddle + (-1 if a == LEFT else 1 if a == RIGHT else 0), 0), N - 1)
        r = self._ball()
        self.ep_return += r
        self.ep_length += 1
        return self._draw(), r, self.done


# ---- the agent: src/rl/dqn.c, preset "minatar" ----

class QNet(nn.Module):
    def __init__(self, in_c=CHANNELS, n_actions=NUM_ACTIONS, hidden=128):
        super().__init__()
        self.conv = nn.Conv2d(in_c, 16, kernel_size=3, stride=1, padding=0)
        self.fc = nn.Linear(16 * 8 * 8, hidden)
        self.head = nn.Linear(hidden, n_actions)

    def forward(self, x):
        x = F.relu(self.conv(x))
        x = F.relu(self.fc(x.flatten(1)))
        return self.head(x)


# ---- the networks of `specmoe bench tokenize` (issue 14), for --update-only --net NAME ----
# Written as a PyTorch user would write them, batched over the observations: the slots (SoftMoE) or
# the chosen tokens (expert choice) of the whole batch go through each expert in one call. The
# experts are a ModuleList of Linear -> ReLU -> Linear applied one after another (the common form;
# the experts' weights stacked into batched products, torch.baddbmm over (E, B p, d), is the other).
# Shapes: B observations, m = 64 tokens (the 8 x 8 positions of the convolution's output, PerConv),
# d = 16 channels, E experts, p slots (SoftMoE) or tokens (expert choice) per expert.

def experts(E, d, H):
    """E two-layer experts d -> H -> d with biases (nn.Linear's initialisation, which is specmoe's)."""
    return nn.ModuleList(nn.Sequential(nn.Linear(d, H), nn.ReLU(), nn.Linear(H, d)) for _ in range(E))


class SoftMoE(nn.Module):
    """Soft MoE (Puigcerver et al. 2024) over each observation's tokens, as src/nn/router_soft.c and
    src/nn/moe.c compute it: L = normalise(X) (scale normalise(Phi))^T / tau, dispatch softmax over the
    tokens (per slot), combine softmax over the slots (per token); slot inputs D^T X, outputs C Y~."""

    def __init__(self, d, E, p, H, tau=1.0):
        super().__init__()
        self.E, self.p, self.tau = E, p, tau
        self.phi = nn.Parameter(torch.randn(E * p, d) / d ** 0.5)  # (S, d), LeCun normal
        self.scale = nn.Parameter(torch.ones(()))
        self.experts = experts(E, d, H)

    def forward(self, x):  # (B, m, d) -> (B, m, d)
        B, m, d = x.shape
        logits = F.normalize(x, dim=-1) @ (self.scale * F.normalize(self.phi, dim=-1)).t() / self.tau  # (B, m, S)
        dispatch, combine = logits.softmax(dim=1), logits.softmax(dim=2)
        xs = (dispatch.transpose(1, 2) @ x).view(B, self.E, self.p, d)  # slot inputs
        ys = torch.stack([f(xs[:, e]) for e, f in enumerate(self.experts)], 1)  # (B, E, p, d)
        return combine @ ys.view(B, self.E * self.p, d)


class ExpertChoice(nn.Module):
    """Expert choice (Zhou et al. 2022) per observation, as src/nn/router_assign.c: S = softmax(x Wg^T)
    over the experts; each expert takes its top p = ceil(m / E) tokens by S[:, e], weighted by S."""

    def __init__(self, d, E, H):
        super().__init__()
        self.E = E
        self.gate = nn.Linear(d, E, bias=False)
        self.experts = experts(E, d, H)

    def forward(self, x):  # (B, m, d) -> (B, m, d)
        B, m, d = x.shape
        p = -(-m // self.E)
        g, idx = self.gate(x).softmax(dim=-1).transpose(1, 2).topk(p, dim=-1)  # (B, E, p)
        out = torch.zeros_like(x)
        for e, f in enumerate(self.experts):
            at = idx[:, e].unsqueeze(-1).expand(B, p, d)
            out = out.scatter_add(1, at, f(x.gather(1, at)) * g[:, e].unsqueeze(-1))
        return out


class TokenQNet(nn.Module):
    """conv:16:3:1:0,tokens,moe:H,flatten: the convolution's 64 positions as tokens of 16 channels
    (PerConv), the MoE layer over them, flattened (64 x 16 = 1024) into the head."""

    def __init__(self, moe, in_c=CHANNELS, n_actions=NUM_ACTIONS):
        super().__init__()
        self.conv = nn.Conv2d(in_c, 16, kernel_size=3, stride=1, padding=0)
        self.moe = moe
        self.head = nn.Linear(64 * 16, n_actions)

    def forward(self, x):
        tokens = F.relu(self.conv(x)).flatten(2).transpose(1, 2)  # (B, 64, 16)
        return self.head(self.moe(tokens).flatten(1))


# the networks by their variant names in `specmoe bench tokenize` (tools/peers/compare_tokenize.sh
# takes specmoe's flags for each from the tier's plan)
NETS = {
    "baseline": lambda: QNet(),
    "baseline-x4": lambda: QNet(hidden=512),
    "softmoe-4": lambda: TokenQNet(SoftMoE(16, 4, 16, 128)),
    "softmoe-1-x4": lambda: TokenQNet(SoftMoE(16, 1, 64, 512)),
    "expert-choice-1-x4": lambda: TokenQNet(ExpertChoice(16, 1, 512)),
}


class Config:
    buffer_size = 100_000
    batch_size = 32
    learning_starts = 5000
    train_freq = 1
    target_update = 1000
    gamma = 0.99
    lr = 2.5e-4
    rms_alpha = 0.95
    rms_eps = 0.01
    eps_start, eps_end, eps_frames = 1.0, 0.1, 100_000


def epsilon_at(c, frames):
    if frames < c.learning_starts:
        return 1.0
    f = min(1.0, (frames - c.learning_starts) / c.eps_frames)
    return c.eps_start + f * (c.eps_end - c.eps_start)


class Replay:
    """Observations and next observations as bytes, uniform sampling with replacement."""

    def __init__(self, capacity, obs_shape, rng):
        self.obs = np.zeros((capacity,) + obs_shape, dtype=np.uint8)
        self.next = np.zeros((capacity,) + obs_shape, dtype=np.uint8)
        self.act = np.zeros(capacity, dtype=np.int64)
        self.rew = np.zeros(capacity, dtype=np.float32)
        self.term = np.zeros(capacity, dtype=np.float32)
        self.capacity, self.head, self.size, self.rng = capacity, 0, 0, rng

    def add(self, obs, a, r, term, next_obs):
        i = self.head
        self.obs[i] = obs
        self.next[i] = next_obs
        self.act[i], self.rew[i], self.term[i] = a, r, term
        self.head = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, B):
        idx = self.rng.integers(0, self.size, B)
        return (torch.from_numpy(self.obs[idx]).float(), torch.from_numpy(self.act[idx]),
                torch.from_numpy(self.rew[idx]), torch.from_numpy(self.term[idx]),
                torch.from_numpy(self.next[idx]).float())


def make_agent(c, seed, net="baseline"):
    torch.manual_seed(seed)
    q = NETS[net]()
    qt = NETS[net]()
    qt.load_state_dict(q.state_dict())
    opt = torch.optim.RMSprop(q.parameters(), lr=c.lr, alpha=c.rms_alpha, eps=c.rms_eps, centered=True)
    return q, qt, opt


def update(c, q, qt, opt, s, a, r, term, s2):
    with torch.no_grad():
        y = r + c.gamma * (1 - term) * qt(s2).max(1).values
    q_sa = q(s).gather(1, a.unsqueeze(1)).squeeze(1)
    loss = F.smooth_l1_loss(q_sa, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def train(args):
    c = Config()
    c.eps_start, c.eps_end = args.eps_start, args.eps_end
    env = Breakout(args.seed)
    rng = random.Random(args.seed + 1)
    rb = Replay(c.buffer_size, (CHANNELS, N, N), np.random.default_rng(args.seed + 2))
    q, qt, opt = make_agent(c, args.seed)
    obs = env.reset()
    frames = updates = episodes = 0
    returns = []
    loss_sum, loss_n = 0.0, 0
    next_target = c.target_update
    t0, p0 = time.perf_counter(), time.process_time()
    tw = pw = None  # wall and CPU clocks when learning starts
    while frames < args.frames:
        if frames == c.learning_starts:
            tw, pw = time.perf_counter(), time.process_time()
        eps = epsilon_at(c, frames)
        if rng.random() < eps:
            a = rng.randrange(NUM_ACTIONS)
        else:
            with torch.no_grad():
                a = int(q(torch.from_numpy(obs).unsqueeze(0)).argmax(1).item())
        next_obs, r, term = env.step(a)
        rb.add(obs, a, r, term, next_obs)  # the final observation of an episode, not the reset's
        if term:
            returns.append(env.ep_return)
            episodes += 1
            env.ep_return, env.ep_length = 0.0, 0
            obs = env.reset()
        else:
            obs = next_obs
        frames += 1
        if frames >= c.learning_starts and frames % c.train_freq == 0:
            loss = update(c, q, qt, opt, *rb.sample(c.batch_size))
            updates += 1
            loss_sum += loss.item()
            loss_n += 1
        if frames >= next_target:
            qt.load_state_dict(q.state_dict())
            next_target += c.target_update
        if args.log_every and frames % args.log_every == 0:
            recent = sum(returns[-20:]) / len(returns[-20:]) if returns else float("nan")
            print(f"frame {frames} eps {eps:.3f} updates {updates} return(last 20) {recent:.2f} "
                  f"loss {loss_sum / max(loss_n, 1):.4f}", file=sys.stderr)
            loss_sum, loss_n = 0.0, 0
    t1, p1 = time.perf_counter(), time.process_time()
    wall, cpu = t1 - t0, p1 - p0
    fields = [f"frames={frames}", f"warmup={c.learning_starts}", f"seconds={wall:.2f}",
              f"SPS={frames / wall:.0f}", f"cpu_s={cpu:.2f}", f"cpu_us_per_frame={1e6 * cpu / frames:.1f}"]
    if tw is not None:
        lf = frames - c.learning_starts
        fields += [f"learn_frames={lf}", f"learn_SPS={lf / (t1 - tw):.0f}",
                   f"learn_cpu_us_per_frame={1e6 * (p1 - pw) / lf:.1f}",
                   f"warmup_SPS={c.learning_starts / (tw - t0):.0f}",
                   f"warmup_cpu_us_per_frame={1e6 * (pw - p0) / c.learning_starts:.1f}"]
    mean_ret = sum(returns) / len(returns) if returns else float("nan")
    fields += [f"updates={updates}", f"episodes={episodes}", f"mean_return={mean_ret:.3f}"]
    print("peer-dqn " + " ".join(fields))


def env_frames(seed, n):
    """n transitions of Breakout under a uniform random policy (dqn_update --obs env): each a frame
    and the one after it, the final frame of an episode as its next."""
    env, rng = Breakout(seed), random.Random(seed + 1)
    obs, s, s2 = env.reset(), [], []
    for _ in range(n):
        nxt, _, term = env.step(rng.randrange(NUM_ACTIONS))
        s.append(obs)
        s2.append(nxt)
        obs = env.reset() if term else nxt
    return torch.from_numpy(np.stack(s)), torch.from_numpy(np.stack(s2))


def update_only(args):
    c = Config()
    q, qt, opt = make_agent(c, args.seed, args.net)
    g = torch.Generator().manual_seed(args.seed)
    B = c.batch_size
    n_batches = 16  # a few distinct batches, reused round-robin

    def binary():
        return (torch.rand(B, CHANNELS, N, N, generator=g) < 0.1).float()

    if args.obs == "env":
        s, s2 = env_frames(args.seed, n_batches * B)
        states = [(s[i * B:(i + 1) * B], s2[i * B:(i + 1) * B]) for i in range(n_batches)]
    else:
        states = [(binary(), binary()) for _ in range(n_batches)]
    batches = [(st, torch.randint(0, NUM_ACTIONS, (B,), generator=g), (torch.rand(B, generator=g) < 0.05).float(),
                (torch.rand(B, generator=g) < 0.01).float(), st2) for st, st2 in states]
    for i in range(50):  # warm-up: allocator, optimiser state
        update(c, q, qt, opt, *batches[i % n_batches])
    k = 0
    t0, p0 = time.perf_counter(), time.process_time()
    while True:
        for _ in range(100):
            update(c, q, qt, opt, *batches[k % n_batches])
            k += 1
        t1 = time.perf_counter()
        if t1 - t0 >= args.seconds:
            break
    p1 = time.process_time()
    wall, cpu = t1 - t0, p1 - p0
    params = sum(t.numel() for t in q.parameters())
    if args.profile:  # where the time goes: torch's profiler over 20 more updates, on stderr
        with torch.autograd.profiler.profile() as prof:
            for i in range(20):
                update(c, q, qt, opt, *batches[i % n_batches])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), file=sys.stderr)
    print(f"peer-dqn-update net={args.net} obs={args.obs} batch={B} updates={k} seconds={wall:.2f} "
          f"updates_per_s={k / wall:.0f} us_per_update={1e6 * wall / k:.1f} cpu_us_per_update={1e6 * cpu / k:.1f} "
          f"params={params}")


def specmoe_names(q):
    """This Q-network's parameter names -> (specmoe's name in `dqn_update --dump`, expert index or None).
    The layouts agree: images NCHW, a convolution's weight (OC, C, K, K), a dense layer's (out, in),
    an expert's w1 (H, d) and w2 (d, H) (specmoe stacks them over the experts), the PerConv tokens
    position-major and flattened the same way."""
    names = {"conv.weight": ("layers.0.weight", None), "conv.bias": ("layers.0.bias", None),
             "head.weight": ("head.weight", None), "head.bias": ("head.bias", None)}
    if isinstance(q, QNet):
        names.update({"fc.weight": ("layers.1.weight", None), "fc.bias": ("layers.1.bias", None)})
        return names
    if isinstance(q.moe, SoftMoE):
        names.update({"moe.phi": ("layers.2.router.phi", None), "moe.scale": ("layers.2.router.scale", None)})
    else:
        names["moe.gate.weight"] = ("layers.2.router.weight", None)
    for e in range(len(q.moe.experts)):
        for k, name in (("0.weight", "w1"), ("0.bias", "b1"), ("2.weight", "w2"), ("2.bias", "b2")):
            names[f"moe.experts.{e}.{k}"] = (f"layers.2.experts.{name}", e)
    return names


def check(args):
    """The network of --net with specmoe's parameters must give specmoe's Q-values and the same
    gradients of the mean Huber loss (dqn_update --dump): the peer computes the same function,
    forward and backward, so the two sides' times are for the same work."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)) + "/..")
    import safetensors_torch  # tools/safetensors_torch.py

    t, _ = safetensors_torch.load(args.check)
    q = NETS[args.net]()
    params = dict(q.named_parameters())
    names = specmoe_names(q)

    def of(prefix, tn):
        sn, e = names[tn]
        v = t[prefix + sn]
        return (v if e is None else v[e]).reshape(params[tn].shape)

    q.load_state_dict({tn: of("", tn) for tn in names})  # strict: every parameter, nothing else
    with torch.no_grad():
        out = q(t["check.obs"])
    err = (out - t["check.q"]).abs().max().item()
    scale = t["check.q"].abs().max().item()
    ok = err <= 1e-5 + 1e-4 * scale
    # the gradients of the update's loss: mean Huber (beta 1) of Q(s, a) - y
    q_sa = q(t["check.obs"]).gather(1, t["check.act"].long().unsqueeze(1)).squeeze(1)
    F.smooth_l1_loss(q_sa, t["check.y"]).backward()
    worst, worst_name = 0.0, ""
    for tn in names:
        g = of("grad.", tn)
        rel = (params[tn].grad - g).abs().max().item() / max(g.abs().max().item(), 1e-12)
        if rel > worst:
            worst, worst_name = rel, tn
    ok = ok and worst <= 1e-3
    print(f"peer-check net={args.net} max_abs_diff={err:.3g} max_abs_q={scale:.3g} "
          f"grad_max_rel_diff={worst:.3g} ({worst_name}) {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def random_episodes(args):
    env = Breakout(args.seed)
    rng = random.Random(args.seed + 1)
    rets, lens = [], []
    env.reset()
    while len(rets) < args.random_episodes:
        _, _, term = env.step(rng.randrange(NUM_ACTIONS))
        if term:
            rets.append(env.ep_return)
            lens.append(env.ep_length)
            env.ep_return, env.ep_length = 0.0, 0
            env.reset()
    r = np.array(rets)
    print(f"peer-breakout-random episodes={len(rets)} mean_return={r.mean():.3f} std_return={r.std():.3f} "
          f"mean_length={np.mean(lens):.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=20000, help="frames of the run, warm-up included (default 20000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eps-start", type=float, default=1.0, help="exploration after the warm-up, start (default 1)")
    ap.add_argument("--eps-end", type=float, default=0.1, help="exploration after 100k frames of decay (default 0.1)")
    ap.add_argument("--log-every", type=int, default=0, help="frames between progress lines on stderr (0: none)")
    ap.add_argument("--update-only", action="store_true", help="time the update alone (no environment)")
    ap.add_argument("--seconds", type=float, default=5.0, help="--update-only: timed seconds (default 5)")
    ap.add_argument("--net", choices=sorted(NETS), default="baseline",
                    help="--update-only: the Q-network (a network of `specmoe bench tokenize`; default baseline)")
    ap.add_argument("--profile", action="store_true",
                    help="--update-only: also print torch's profile of 20 updates by operator (stderr)")
    ap.add_argument("--obs", choices=("random", "env"), default="random",
                    help="--update-only: random binary batches (10%% ones) or Breakout frames (as dqn_update --obs)")
    ap.add_argument("--random-episodes", type=int, default=0, help="episodes of a random policy (port check)")
    ap.add_argument("--check", metavar="FILE",
                    help="load specmoe's network and Q-values (build/dqn_update --dump FILE) into --net and compare")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    print(f"torch {torch.__version__}, intra-op threads {torch.get_num_threads()}, "
          f"interop threads {torch.get_num_interop_threads()}", file=sys.stderr)
    if args.check:
        sys.exit(check(args))
    if args.random_episodes > 0:
        random_episodes(args)
    elif args.update_only:
        update_only(args)
    else:
        if args.frames < 1:
            ap.error("--frames must be >= 1")
        train(args)


if __name__ == "__main__":
    main()
