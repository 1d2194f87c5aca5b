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
                   step, on fixed random binary batches; --seconds S of timed updates:
    peer-dqn-update batch=32 updates=K seconds=S updates_per_s=X us_per_update=U cpu_us_per_update=V
  --random-episodes N  N episodes of a uniform random policy (to check the port against
                   `specmoe rl eval --env minatar/breakout --policy random --episodes N`):
    peer-breakout-random episodes=N mean_return=R std_return=D mean_length=L

Usage: /usr/bin/python3 tools/peers/dqn_minatar.py [--frames N] [--seed S] [--update-only [--seconds S]]
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
    def __init__(self, in_c=CHANNELS, n_actions=NUM_ACTIONS):
        super().__init__()
        self.conv = nn.Conv2d(in_c, 16, kernel_size=3, stride=1, padding=0)
        self.fc = nn.Linear(16 * 8 * 8, 128)
        self.head = nn.Linear(128, n_actions)

    def forward(self, x):
        x = F.relu(self.conv(x))
        x = F.relu(self.fc(x.flatten(1)))
        return self.head(x)


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


def make_agent(c, seed):
    torch.manual_seed(seed)
    q = QNet()
    qt = QNet()
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


def update_only(args):
    c = Config()
    q, qt, opt = make_agent(c, args.seed)
    g = torch.Generator().manual_seed(args.seed)
    B = c.batch_size
    n_batches = 16  # a few distinct batches, reused round-robin

    def binary():
        return (torch.rand(B, CHANNELS, N, N, generator=g) < 0.1).float()

    batches = [(binary(), torch.randint(0, NUM_ACTIONS, (B,), generator=g),
                (torch.rand(B, generator=g) < 0.05).float(), (torch.rand(B, generator=g) < 0.01).float(),
                binary()) for _ in range(n_batches)]
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
    print(f"peer-dqn-update batch={B} updates={k} seconds={wall:.2f} updates_per_s={k / wall:.0f} "
          f"us_per_update={1e6 * wall / k:.1f} cpu_us_per_update={1e6 * cpu / k:.1f}")


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
    ap.add_argument("--random-episodes", type=int, default=0, help="episodes of a random policy (port check)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    print(f"torch {torch.__version__}, intra-op threads {torch.get_num_threads()}, "
          f"interop threads {torch.get_num_interop_threads()}", file=sys.stderr)
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
