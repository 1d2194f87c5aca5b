#!/usr/bin/python3
"""PyTorch peer of `specmoe rl train --env mujoco/cheetah-run --agent ppo` on the SAME C environment.

The agent is CleanRL's ppo_continuous_action.py recipe written here in PyTorch (as a PyTorch user
would), with the settings specmoe's PPO uses for a box-action environment (src/rl/ppo.c, preset
"cleanrl-continuous"); the environment is specmoe's own planar cheetah (envs/mujoco/cheetah.c),
stepped through ctypes on build/libspecmoe.so with the vector API of include/specmoe/rl/env.h over
numpy buffers. So both sides run the same physics and the speed comparison is of the agents and
their plumbing (issue 13, speed: "PPO on the cheetah run task: steps/s ... against a PyTorch PPO
peer on the same C environment").

Agent (as src/rl/ppo.c):
  actor       Linear(17, 64) tanh Linear(64, 64) tanh Linear(64, 6) -> mean; a state-independent
              log-std parameter (6), zeros at the start; Gaussian head
  critic      Linear(17, 64) tanh Linear(64, 64) tanh Linear(64, 1)
  init        orthogonal, gain sqrt(2) in hidden layers, 0.01 (actor head) / 1 (critic head), bias 0
  rollout     1 env x 2048 steps; actions sampled unclipped (the environment clips to [-1, 1])
  obs         running mean/var normalisation (gym's RunningMeanStd, count 1e-4), clip +-10;
              normalised with the statistics before the step, updated after it (as specmoe)
  reward      scaled by the std of the running discounted return (reset at episode end), clip +-10
  truncation  the time limit bootstraps from the value of the final observation (specmoe does;
              CleanRL's script does not - this costs one critic forward per 1000 steps)
  GAE         gamma 0.99, lambda 0.95
  update      10 epochs x 32 minibatches of 64; advantages normalised per minibatch (unbiased std);
              clipped surrogate 0.2; clipped value loss, vf_coef 0.5; ent_coef 0; global grad-norm
              clip 0.5; Adam lr 3e-4 eps 1e-5, annealed linearly to 0 over the frame budget

Threads: one (OMP/MKL/OPENBLAS_NUM_THREADS=1 before torch is imported, torch.set_num_threads(1)).

Output (stdout, one line):
  peer-ppo frames=N updates=U seconds=S SPS=X cpu_s=C cpu_us_per_step=V
           env_s=E env_cpu_s=EC act_s=A learn_s=L learn_cpu_s=LC other_s=O episodes=K mean_return=R
  env_s: wall seconds inside the ctypes sm_vecenv_step call alone; act_s: the rollout's numpy/torch
  work around it (normalisation, actor and critic forward, sampling, bookkeeping); learn_s: GAE
  and the 10 x 32 minibatch updates. Times exclude interpreter start-up and torch import.

Modes:
  (default)        --frames N (multiple of 2048) [--seed S]: train, print the line above
  --check          binding checks: the struct layout (fields written by the C library read back),
                   then --check-episodes random-action episodes: every one 1000 steps, every
                   reward in [0, 1]; prints peer-ppo-check ... ok

Usage: /usr/bin/python3 tools/peers/ppo_cheetah.py [--frames 102400] [--seed 1] [--lib PATH] [--check]
"""
import argparse
import ctypes as C
import os
import sys
import time

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_v] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

# ---- ctypes mirror of include/specmoe/rl/env.h and core.h ---------------------------------------


class SmError(C.Structure):
    _fields_ = [("msg", C.c_char * 512), ("code", C.c_int)]


class SmEnvOpts(C.Structure):
    _fields_ = [("sticky", C.c_double), ("ramping", C.c_int), ("max_steps", C.c_int)]


class SmEnvLog(C.Structure):
    _fields_ = [("episode_return", C.c_double), ("episode_length", C.c_double), ("score", C.c_double),
                ("success", C.c_double), ("return_sq", C.c_double), ("n", C.c_long)]


class SmEnvSpecHead(C.Structure):
    """The leading fields of sm_env_spec (read through the pointer only, never allocated here)."""
    _fields_ = [("name", C.c_char_p), ("about", C.c_char_p), ("obs_c", C.c_int), ("obs_h", C.c_int),
                ("obs_w", C.c_int), ("obs_binary", C.c_int), ("obs_low", C.POINTER(C.c_float)),
                ("obs_high", C.POINTER(C.c_float)), ("act_kind", C.c_int), ("act_n", C.c_int),
                ("act_low", C.POINTER(C.c_float)), ("act_high", C.POINTER(C.c_float)), ("max_steps", C.c_int),
                ("has_success", C.c_int), ("state_bytes", C.c_size_t)]


class SmVecenv(C.Structure):
    _fields_ = [("spec", C.POINTER(SmEnvSpecHead)), ("opts", SmEnvOpts), ("num_envs", C.c_int),
                ("threads", C.c_int), ("max_steps", C.c_int), ("states", C.c_void_p),
                ("ep_return", C.POINTER(C.c_double)), ("ep_length", C.POINTER(C.c_int)),
                ("logs", C.POINTER(SmEnvLog)), ("obs", C.POINTER(C.c_float)), ("act_disc", C.POINTER(C.c_int)),
                ("act_box", C.POINTER(C.c_float)), ("rewards", C.POINTER(C.c_float)),
                ("terminals", C.POINTER(C.c_ubyte)), ("truncations", C.POINTER(C.c_ubyte)),
                ("final_obs", C.POINTER(C.c_float))]


def load_lib(path):
    lib = C.CDLL(path)
    P = C.POINTER
    lib.sm_vecenv_init.argtypes = [P(SmVecenv), C.c_char_p, C.c_int, C.c_uint64, P(SmEnvOpts), P(SmError)]
    lib.sm_vecenv_init.restype = C.c_int
    lib.sm_vecenv_bind.argtypes = [P(SmVecenv), C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p,
                                   C.c_void_p, C.c_void_p]
    lib.sm_vecenv_bind.restype = None
    for f in (lib.sm_vecenv_reset, lib.sm_vecenv_step, lib.sm_vecenv_free):
        f.argtypes = [P(SmVecenv)]
        f.restype = None
    lib.sm_vecenv_set_threads.argtypes = [P(SmVecenv), C.c_int]
    lib.sm_vecenv_set_threads.restype = None
    lib.sm_vecenv_log_take.argtypes = [P(SmVecenv)]
    lib.sm_vecenv_log_take.restype = SmEnvLog
    return lib


class VecEnv:
    """N copies of a specmoe environment over numpy buffers the vector writes into."""

    def __init__(self, lib, name, n, seed):
        self.lib, self.v, err = lib, SmVecenv(), SmError()
        st = lib.sm_vecenv_init(C.byref(self.v), name.encode(), n, seed, None, C.byref(err))
        if st != 0:
            raise RuntimeError("sm_vecenv_init(%s): %s" % (name, err.msg.decode(errors="replace")))
        sp = self.v.spec.contents
        if sp.act_kind != 1:
            raise RuntimeError("%s: not a box-action environment" % name)
        self.n, self.D, self.A = n, sp.obs_c * sp.obs_h * sp.obs_w, sp.act_n
        self.spec = sp
        self.obs = np.zeros((n, self.D), np.float32)
        self.act = np.zeros((n, self.A), np.float32)
        self.rew = np.zeros(n, np.float32)
        self.term = np.zeros(n, np.uint8)
        self.trunc = np.zeros(n, np.uint8)
        self.final_obs = np.zeros((n, self.D), np.float32)
        ptr = lambda a: a.ctypes.data  # noqa: E731
        lib.sm_vecenv_bind(C.byref(self.v), ptr(self.obs), None, ptr(self.act), ptr(self.rew), ptr(self.term),
                           ptr(self.trunc), ptr(self.final_obs))
        lib.sm_vecenv_set_threads(C.byref(self.v), 1)
        self._ref = C.byref(self.v)

    def reset(self):
        self.lib.sm_vecenv_reset(self._ref)

    def step(self):
        self.lib.sm_vecenv_step(self._ref)

    def log_take(self):
        return self.lib.sm_vecenv_log_take(self._ref)

    def close(self):
        self.lib.sm_vecenv_free(self._ref)


def check(lib, name, episodes, seed):
    env = VecEnv(lib, name, 1, seed)
    v, sp = env.v, env.spec
    addr = lambda p: C.cast(p, C.c_void_p).value  # noqa: E731
    # the layout of an LP64 build (x86-64, aarch64), checked once against C's sizeof/offsetof
    if C.sizeof(C.c_void_p) == 8:
        got = (C.sizeof(SmVecenv), SmVecenv.obs.offset, SmVecenv.final_obs.offset, C.sizeof(SmEnvLog))
        assert got == (128, 72, 120, 48), got
    # fields written by the C library, read back through the mirror: a misplaced field fails here
    assert sp.name.decode() == name, sp.name
    assert v.num_envs == 1 and v.threads == 1 and v.max_steps == 1000, (v.num_envs, v.threads, v.max_steps)
    assert v.opts.sticky < 0 and v.opts.max_steps < 0, "opts NULL should give the defaults (-1)"
    assert (env.D, env.A) == (17, 6), (env.D, env.A)
    assert addr(v.obs) == env.obs.ctypes.data and addr(v.act_box) == env.act.ctypes.data
    assert addr(v.rewards) == env.rew.ctypes.data and addr(v.terminals) == env.term.ctypes.data
    assert addr(v.truncations) == env.trunc.ctypes.data and addr(v.final_obs) == env.final_obs.ctypes.data
    assert not v.act_disc
    env.reset()
    assert np.isfinite(env.obs).all() and np.abs(env.obs).sum() > 0
    rng = np.random.default_rng(seed)
    lens, rets, rmin, rmax, steps, length, ret = [], [], np.inf, -np.inf, 0, 0, 0.0
    while len(lens) < episodes:
        env.act[:] = rng.uniform(-1, 1, env.act.shape)
        env.step()
        r = float(env.rew[0])
        rmin, rmax, length, ret, steps = min(rmin, r), max(rmax, r), length + 1, ret + r, steps + 1
        if env.term[0] or env.trunc[0]:
            assert env.trunc[0] and not env.term[0], "the cheetah only ends by the time limit"
            lens.append(length), rets.append(ret)
            length, ret = 0, 0.0
    log = env.log_take()
    env.close()
    assert all(n == 1000 for n in lens), lens
    assert 0 <= rmin and rmax <= 1, (rmin, rmax)
    assert log.n == episodes and abs(log.episode_return - sum(rets)) < 1e-3 * max(1, sum(rets)), (log.n, log.episode_return)
    print("peer-ppo-check env=%s sizeof_vecenv=%d episodes=%d lengths=%s mean_return=%.3f reward_min=%.4f reward_max=%.4f "
          "log_n=%d log_mean_return=%.3f ok" % (name, C.sizeof(SmVecenv), episodes, sorted(set(lens)), np.mean(rets), rmin,
                                                 rmax, log.n, log.episode_return / log.n))


# ---- the agent (CleanRL ppo_continuous_action.py) ------------------------------------------------


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, D, A):
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(D, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                    layer_init(nn.Linear(64, 1), std=1.0))
        self.actor_mean = nn.Sequential(layer_init(nn.Linear(D, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                        layer_init(nn.Linear(64, A), std=0.01))
        self.actor_logstd = nn.Parameter(torch.zeros(1, A))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        mean = self.actor_mean(x)
        logstd = self.actor_logstd.expand_as(mean)
        probs = torch.distributions.Normal(mean, torch.exp(logstd))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


class RunningMeanStd:
    """gym's RunningMeanStd (float64, count 1e-4 at the start)."""

    def __init__(self, shape):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, x):
        bm, bv, bc = x.mean(0), x.var(0), x.shape[0]
        delta, tot = bm - self.mean, self.count + bc
        self.mean = self.mean + delta * bc / tot
        self.var = (self.var * self.count + bv * bc + delta ** 2 * self.count * bc / tot) / tot
        self.count = tot


def train(lib, args):
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    N, T, n_mb, epochs = 1, 2048, 32, 10
    gamma, lam, clip, ent_coef, vf_coef, max_gn, lr0 = 0.99, 0.95, 0.2, 0.0, 0.5, 0.5, 3e-4
    Bt = N * T
    B = Bt // n_mb
    if args.frames % Bt:
        sys.exit("ppo_cheetah: --frames must be a multiple of %d (got %d)" % (Bt, args.frames))
    n_updates = args.frames // Bt
    env = VecEnv(lib, args.env, N, args.seed)
    D, A = env.D, env.A
    agent = Agent(D, A)
    opt = torch.optim.Adam(agent.parameters(), lr=lr0, eps=1e-5)
    obs_rms, ret_rms, ret_acc = RunningMeanStd(D), RunningMeanStd(()), np.zeros(N)

    def norm(x):
        return np.clip((x - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10).astype(np.float32)

    b_obs = torch.zeros((T, N, D))
    b_act = torch.zeros((T, N, A))
    b_logp = torch.zeros((T, N))
    b_rew = torch.zeros((T, N))
    b_done = torch.zeros((T, N))
    b_val = torch.zeros((T, N))
    b_boot = torch.zeros((T, N))
    env.reset()
    obs_rms.update(env.obs.astype(np.float64))
    t_env = c_env = t_learn = c_learn = t_act = 0.0
    ep_sum, ep_n = 0.0, 0
    w0, c0 = time.perf_counter(), time.process_time()
    for update in range(1, n_updates + 1):
        frac = 1.0 - (update - 1.0) / n_updates
        opt.param_groups[0]["lr"] = frac * lr0
        ta = time.perf_counter()
        env_this = 0.0
        for t in range(T):
            x = torch.from_numpy(norm(env.obs))
            b_obs[t] = x
            with torch.no_grad():
                action, logp, _, value = agent.get_action_and_value(x)
            b_act[t], b_logp[t], b_val[t] = action, logp, value.flatten()
            env.act[:] = action.numpy()
            s0, p0 = time.perf_counter(), time.process_time()
            env.step()
            s1 = time.perf_counter()
            env_this += s1 - s0
            c_env += time.process_time() - p0
            obs_rms.update(env.obs.astype(np.float64))
            ret_acc[:] = ret_acc * gamma + env.rew
            ret_rms.update(ret_acc)
            b_rew[t] = torch.from_numpy(np.clip(env.rew / np.sqrt(ret_rms.var + 1e-8), -10, 10).astype(np.float32))
            done = np.logical_or(env.term, env.trunc)
            b_done[t] = torch.from_numpy(done.astype(np.float32))
            if done.any():
                ret_acc[done] = 0
                tr = np.logical_and(env.trunc, np.logical_not(env.term))
                if tr.any():
                    with torch.no_grad():
                        b_boot[t, torch.from_numpy(tr)] = agent.get_value(torch.from_numpy(norm(env.final_obs[tr]))).flatten()
                log = env.log_take()
                ep_sum, ep_n = ep_sum + log.episode_return, ep_n + log.n
        with torch.no_grad():
            next_value = agent.get_value(torch.from_numpy(norm(env.obs))).reshape(1, -1)
        t_env += env_this
        t_act += time.perf_counter() - ta - env_this
        tl, cl = time.perf_counter(), time.process_time()
        # GAE (CleanRL's loop; a done step bootstraps from b_boot: the final observation's value)
        with torch.no_grad():
            adv = torch.zeros_like(b_rew)
            last = torch.zeros(N)
            for t in reversed(range(T)):
                nxt = next_value[0] if t == T - 1 else b_val[t + 1]
                nxt = torch.where(b_done[t] > 0, b_boot[t], nxt)
                delta = b_rew[t] + gamma * nxt - b_val[t]
                last = delta + gamma * lam * (1.0 - b_done[t]) * last
                adv[t] = last
            ret = adv + b_val
        f_obs, f_act, f_logp = b_obs.reshape(-1, D), b_act.reshape(-1, A), b_logp.reshape(-1)
        f_adv, f_ret, f_val = adv.reshape(-1), ret.reshape(-1), b_val.reshape(-1)
        for epoch in range(epochs):
            perm = np.random.permutation(Bt)
            for start in range(0, Bt, B):
                mb = perm[start:start + B]
                _, newlogp, entropy, newvalue = agent.get_action_and_value(f_obs[mb], f_act[mb])
                ratio = (newlogp - f_logp[mb]).exp()
                mb_adv = f_adv[mb]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()
                newvalue = newvalue.view(-1)
                v_unc = (newvalue - f_ret[mb]) ** 2
                v_clip = f_val[mb] + torch.clamp(newvalue - f_val[mb], -clip, clip)
                v_loss = 0.5 * torch.max(v_unc, (v_clip - f_ret[mb]) ** 2).mean()
                loss = pg_loss - ent_coef * entropy.mean() + v_loss * vf_coef
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), max_gn)
                opt.step()
        t_learn += time.perf_counter() - tl
        c_learn += time.process_time() - cl
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    env.close()
    frames = n_updates * Bt
    print("peer-ppo frames=%d updates=%d seconds=%.3f SPS=%.0f cpu_s=%.3f cpu_us_per_step=%.1f env_s=%.3f env_cpu_s=%.3f "
          "act_s=%.3f learn_s=%.3f learn_cpu_s=%.3f other_s=%.3f episodes=%d mean_return=%.3f"
          % (frames, n_updates, wall, frames / wall, cpu, 1e6 * cpu / frames, t_env, c_env, t_act, t_learn, c_learn,
             wall - t_env - t_act - t_learn, ep_n, ep_sum / max(ep_n, 1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=102400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--env", default="mujoco/cheetah-run")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--lib", default=os.path.join(here, "..", "..", "build", "libspecmoe.so"))
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--check-episodes", type=int, default=3)
    args = ap.parse_args()
    if not os.path.exists(args.lib):
        sys.exit("ppo_cheetah: %s: not found (run make first)" % args.lib)
    lib = load_lib(args.lib)
    if args.check:
        check(lib, args.env, args.check_episodes, args.seed)
    else:
        train(lib, args)


if __name__ == "__main__":
    main()
