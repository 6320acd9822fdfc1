"""Learner throughput: updates/s, transitions/s and achieved GFLOP/s.

For the learners ``bc_union``, ``indd``, ``misodice_vdn`` and ``misodice`` (and
O-MAPL at the paper shapes) on synthetic on-device data (a
:class:`~jaxil.data.sampling.Transitions` of random arrays with expert labels,
so no environment is needed):

1. **Paper shapes** (MisoDICE on SMACv1 5m_vs_6m): N = 5 agents, obs 124,
   global state 780, 12 actions, 256-256 local networks, 64-unit hypernetwork
   mixers, batch B = 1120 joint transitions. Interpretation: O-MAPL's SMAC
   batch is 8 trajectory pairs = 16 trajectories × T = 70 = 1120 joint
   transitions; a MisoDICE update draws one such batch from D_E and one from
   D_U, so it consumes 2 × 1120 × 5 = 11,200 agent-steps. The dataset is the
   paper's: 200 expert + 1000 other trajectories of 70 steps (84,000
   transitions). XLA's cost analysis of the compiled call gives the flops;
   the achieved GFLOP/s of a single update (``update_n`` with K = 1: sample +
   update in one call) and of K = 16 fused updates is set against the fp32
   matmul rate measured in between the repeats (1024² ``jnp.dot``), and
   against the MLP-shaped products of ``benchmarks/matmul_peak.py``
   (:mod:`jaxil.runs.measure`) and its 1-thread/all-thread child processes.
   O-MAPL at the same shapes: B = 8 trajectory pairs × 2 × T = 70 = 1120
   joint transitions per update, as in the O-MAPL authors' SMAC
   configuration (their PyTorch update: ≈200 ms on one core of the
   reference machine).
2. **Sweeps** around a base point (B = 512, N = 5, seeds = 1, K = 16), one
   axis at a time: batch size, number of agents (state = 156·N), seeds
   (``vmap`` over learner states, shared data) and K (updates fused in one
   ``lax.scan``). Points run cheapest first within ``--budget-s``; the rest
   are listed as skipped with their estimated cost (``--full`` runs all).
3. **Profile** (paper shapes, single update): where the time goes, from a
   ``jax.profiler`` trace of the compiled call: dots vs element-wise,
   layout copies, concatenations and gathers, GFLOP/s per dot shape;
   ``--profile`` adds MisoDICE without the gradient penalty.

Definitions: ``updates/s`` counts learner updates summed over seeds
(seeds × K / call time); ``transitions/s`` counts the joint transitions a
loss consumes (DICE learners: 2B per update, a D_E and a D_U batch; BC: B —
``bc_union`` still gathers both batches when the data carries labels, as
here); ``agent-steps/s`` = transitions/s × N; ``GFLOP/s`` = XLA flops of the
call / median wall time; ``GFLOP/cpu-s`` uses the process CPU time instead.

    python benchmarks/learner_throughput.py            # default, ~10 min
    python benchmarks/learner_throughput.py --quick    # ~2-3 min
    python benchmarks/learner_throughput.py --full     # every sweep point, no budget
    python benchmarks/learner_throughput.py --learners misodice --axes batch,k --no-paper
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp

from jaxil.envs.core import DiscreteActions, EnvSpec
from jaxil.data.sampling import Transitions
from jaxil.data.sampling import Segments
from jaxil.algorithms.offline import LearnerData, PreferenceData, make_learner, update_n
from jaxil.nn.nets import MLP
from jaxil.runs import measure

RESULTS_DIR = Path(__file__).resolve().parent / "results"

LEARNERS = ("bc_union", "indd", "misodice_vdn", "misodice")
DICE = ("indd", "misodice_vdn", "misodice")
#: O-MAPL at the paper shapes: B = 8 trajectory pairs of T = 70 steps per update.
PAPER_PAIRS = 8


@dataclasses.dataclass(frozen=True)
class Point:
    """One configuration: batch B (joint transitions per batch), agents N,
    vmapped seeds, fused updates K."""

    batch: int
    agents: int
    seeds: int
    k: int

    def work(self) -> float:
        """Relative amount of compute of one call (for cost estimates)."""
        return float(self.batch * self.agents * self.seeds * self.k)


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Per-agent sizes; SMACv1 5m_vs_6m defaults (state 780 = 5 × 156)."""

    obs_dim: int = 124
    state_per_agent: int = 156
    num_actions: int = 12
    hidden: tuple[int, ...] = (256, 256)
    mixer_hidden: int = 64
    episode_len: int = 70


BASE = Point(batch=512, agents=5, seeds=1, k=16)
PAPER = Point(batch=1120, agents=5, seeds=1, k=16)
AXES_FULL = {
    "batch": (256, 512, 1024, 2048, 4096, 8192),
    "agents": (3, 5, 10, 20),
    "seeds": (1, 4, 16),
    "k": (1, 16, 128),
}
AXES_DEFAULT = {
    "batch": (256, 512, 2048, 8192),
    "agents": (3, 5, 10, 20),
    "seeds": (1, 4, 16),
    "k": (1, 16, 128),
}
QUICK_BASE = Point(batch=256, agents=5, seeds=1, k=4)
AXES_QUICK = {"batch": (256, 1024), "agents": (5, 10), "seeds": (1, 4), "k": (1, 4)}


# -- synthetic data --------------------------------------------------------------


def synthetic_spec(num_agents: int, shapes: Shapes = Shapes()) -> EnvSpec:
    return EnvSpec(
        env_id=f"synthetic:smac_like_{num_agents}",
        num_agents=num_agents,
        obs_dim=shapes.obs_dim,
        state_dim=shapes.state_per_agent * num_agents,
        action=DiscreteActions(shapes.num_actions),
        max_steps=shapes.episode_len,
    )


def synthetic_data(
    key: jax.Array, spec: EnvSpec, num_trajectories: int, episode_len: int, expert_every: int = 6
) -> LearnerData:
    """``num_trajectories × episode_len`` transitions of random arrays on device;
    every ``expert_every``-th trajectory is labelled expert (200 of 1200 in the
    MisoDICE datasets); the last step of each trajectory is terminal; about one
    action in six is unavailable (never the one taken)."""
    n, o, s, a = spec.num_agents, spec.obs_dim, spec.state_dim, spec.num_actions
    size = num_trajectories * episode_len
    ks = jax.random.split(key, 9)

    @jax.jit
    def make(ks):
        obs = lambda k: jax.random.normal(k, (size, n, o), jnp.float32)  # noqa: E731
        state = lambda k: jax.random.normal(k, (size, s), jnp.float32)  # noqa: E731
        actions = jax.random.randint(ks[2], (size, n), 0, a, jnp.int32)
        avail = jax.random.uniform(ks[8], (size, n, a)) > 1 / 6
        avail = avail | jax.nn.one_hot(actions, a, dtype=jnp.bool_)
        step = jnp.arange(size, dtype=jnp.int32) % episode_len
        traj = jnp.arange(size, dtype=jnp.int32) // episode_len
        union = Transitions(
            obs=obs(ks[0]),
            global_state=state(ks[1]),
            avail=avail,
            actions=actions,
            reward=jax.random.normal(ks[3], (size,), jnp.float32),
            next_obs=obs(ks[4]),
            next_global_state=state(ks[5]),
            next_avail=jnp.roll(avail, -1, axis=0),
            done=step == episode_len - 1,
            init_obs=obs(ks[6]),
            init_global_state=state(ks[7]),
            init_avail=avail,
            traj_index=traj,
            step=step,
        )
        return LearnerData(union=union, expert=(traj % expert_every) == 0)

    return jax.block_until_ready(make(ks))


def synthetic_preferences(key: jax.Array, spec: EnvSpec, num_pairs: int, episode_len: int) -> PreferenceData:
    """``num_pairs`` answered queries of two whole ``episode_len``-step
    trajectories each (random arrays, every step valid, terminal at the end)."""
    n, o, s, a, T = spec.num_agents, spec.obs_dim, spec.state_dim, spec.num_actions, episode_len

    @jax.jit
    def make(key):
        def side(k):
            ks = jax.random.split(k, 4)
            actions = jax.random.randint(ks[2], (num_pairs, T, n), 0, a, jnp.int32)
            avail = jax.random.uniform(ks[3], (num_pairs, T + 1, n, a)) > 1 / 6
            avail = avail.at[:, :T].set(avail[:, :T] | jax.nn.one_hot(actions, a, dtype=jnp.bool_))
            return Segments(
                obs=jax.random.normal(ks[0], (num_pairs, T + 1, n, o), jnp.float32),
                global_state=jax.random.normal(ks[1], (num_pairs, T + 1, s), jnp.float32),
                avail=avail, actions=actions, reward=jnp.zeros((num_pairs, T), jnp.float32),
                mask=jnp.ones((num_pairs, T), bool),
                done=jnp.broadcast_to(jnp.arange(T) == T - 1, (num_pairs, T)),
                traj_index=jnp.arange(num_pairs, dtype=jnp.int32), start=jnp.zeros(num_pairs, jnp.int32))

        kx, ky, kl = jax.random.split(key, 3)
        label = jax.random.bernoulli(kl, 0.5, (num_pairs,)).astype(jnp.float32)
        return PreferenceData(x=side(kx), y=side(ky), label=label)

    return jax.block_until_ready(make(key))


def transitions_per_update(name: str, batch: int, episode_len: int = Shapes.episode_len) -> int:
    """Joint transitions one update consumes (O-MAPL: ``batch`` pairs × 2 × T)."""
    if name == "omapl":
        return 2 * batch * episode_len
    return 2 * batch if name in DICE else batch


def _learner(name: str, spec: EnvSpec, batch: int, shapes: Shapes):
    cfg: dict[str, Any] = {"batch_size": batch, "hidden": shapes.hidden}
    if name in DICE or name == "omapl":
        cfg["mixer_hidden"] = shapes.mixer_hidden
    return make_learner(name, spec, **cfg)


def build_call(name: str, spec: EnvSpec, point: Point, data: LearnerData, shapes: Shapes, seed: int = 0):
    """The compiled ``update_n`` call of ``point`` and its arguments.

    Seeds > 1: learner states stacked on a leading axis and the call vmapped
    over them; the data is shared."""
    learner = _learner(name, spec, point.batch, shapes)
    k = point.k

    def call(state, data):
        return update_n(learner, state, data, k)

    key = jax.random.PRNGKey(seed)
    if point.seeds == 1:
        state = learner.init(key)
    else:
        state = jax.vmap(learner.init)(jax.random.split(key, point.seeds))
        call = jax.vmap(call, in_axes=(0, None))
    state = jax.block_until_ready(state)
    compiled, compile_s = measure.compile_ahead(call, state, data)
    return compiled, (state, data), compile_s


class FlopCounter:
    """Flops per call from XLA's cost analysis, corrected for how this XLA
    counts ``while`` loops (see
    :func:`jaxil.runs.measure.xla_loop_flops_multiplier`)."""

    def __init__(self):
        self.multiplier = measure.xla_loop_flops_multiplier()
        self.counts_trips = self.multiplier > 0.5

    def per_call(self, compiled, k: int) -> tuple[Optional[float], dict[str, float]]:
        cost = measure.xla_cost(compiled)
        flops = cost.get("flops")
        if flops is None:
            return None, cost
        return (flops if self.counts_trips else flops * k), cost


def row_metrics(name: str, point: Point, t: measure.Timing, flops_call: Optional[float]) -> dict[str, Any]:
    per_s = point.seeds * point.k / t.median_s
    trans = per_s * transitions_per_update(name, point.batch)
    row = {
        "call_ms": 1e3 * t.median_s,
        "update_ms": 1e3 * t.median_s / point.k,
        "updates_per_s": per_s,
        "updates_per_s_per_seed": per_s / point.seeds,
        "transitions_per_s": trans,
        "agent_steps_per_s": trans * point.agents,
        "timing": t.to_dict(),
    }
    if flops_call:
        row["flops_per_update"] = flops_call / (point.seeds * point.k)
        row["gflops"] = flops_call / t.median_s / 1e9
        row["gflops_cpu"] = flops_call / max(t.cpu_median_s, 1e-12) / 1e9
    return row


# -- sweeps ---------------------------------------------------------------------------


def sweep_points(axes: dict[str, tuple[int, ...]], base: Point, chosen: list[str]) -> list[tuple[str, Point]]:
    """``base`` and one-axis variations of it (each point once)."""
    out, seen = [("base", base)], {base}
    for axis in chosen:
        for v in axes[axis]:
            p = dataclasses.replace(base, **{axis: v})
            if p not in seen:
                seen.add(p)
                out.append((axis, p))
    return out


class DataCache:
    """One synthetic dataset per number of agents (shared by learners)."""

    def __init__(self, trajectories: int, shapes: Shapes):
        self.trajectories, self.shapes, self._d = trajectories, shapes, {}

    def get(self, agents: int):
        if agents not in self._d:
            self._d.clear()  # keep one dataset in memory at a time
            spec = synthetic_spec(agents, self.shapes)
            self._d[agents] = (spec, synthetic_data(jax.random.PRNGKey(agents), spec, self.trajectories, self.shapes.episode_len))
        return self._d[agents]


def run_sweeps(args, flops: FlopCounter, shapes: Shapes) -> tuple[list[dict], list[dict]]:
    axes = dict(AXES_QUICK if args.quick else (AXES_FULL if args.full else AXES_DEFAULT))
    for axis in ("batch", "seeds"):  # --batch-values / --seeds-values replace an axis
        if getattr(args, f"{axis}_values", None):
            axes[axis] = tuple(args.__dict__[f"{axis}_values"])
    base = QUICK_BASE if args.quick else BASE
    chosen = [a for a in args.axes.split(",") if a]
    for a in chosen:
        if a not in axes:
            raise SystemExit(f"--axes: unknown axis {a!r}; choose from {', '.join(axes)}")
    points = sweep_points(axes, base, chosen)
    # the largest batch must fit in the dataset; group by agents to reuse it
    cache = DataCache(args.trajectories, shapes)
    todo = [(name, axis, p) for name in args.learners for axis, p in points]
    base_cost: dict[str, tuple[float, float]] = {}  # learner -> (compile_s, call_s at base)
    start = time.perf_counter()
    rows, skipped = [], []

    def estimate(name, p):
        if name not in base_cost:
            return None
        c, t = base_cost[name]
        call = t * p.work() / base.work()
        return c + call * (1 + args.repeats_min), call

    # base points first (they calibrate the estimates), then the cheapest remaining
    pending = [x for x in todo if x[2] == base] + [x for x in todo if x[2] != base]
    while pending:
        if pending[0][2] != base:
            pending.sort(key=lambda x: ((estimate(x[0], x[2]) or (0.0, 0.0))[0], x[2].work()))
        name, axis, p = pending.pop(0)
        est = estimate(name, p)
        elapsed = time.perf_counter() - start
        if args.budget_s > 0 and est is not None and elapsed + est[0] > args.budget_s:
            skipped.append({"learner": name, "axis": axis, **dataclasses.asdict(p), "estimated_s": round(est[0], 1),
                            "reason": f"budget ({args.budget_s:.0f} s, {elapsed:.0f} s used)"})
            continue
        spec, data = cache.get(p.agents)
        compiled, call_args, compile_s = build_call(name, spec, p, data, shapes)
        flops_call, cost = flops.per_call(compiled, p.k)
        t = measure.time_call(compiled, *call_args, warmup=1, repeats=args.repeats,
                              min_repeats=args.repeats_min, target_s=args.target_s)
        del compiled
        row = {"learner": name, "axis": axis, **dataclasses.asdict(p), "obs_dim": shapes.obs_dim,
               "state_dim": spec.state_dim, "compile_s": compile_s, **row_metrics(name, p, t, flops_call),
               "bytes_accessed_per_call": cost.get("bytes accessed"), "loadavg": measure.loadavg()}
        rows.append(row)
        if p == base:
            base_cost[name] = (compile_s, t.median_s)
        print(_row_line(row), flush=True)
    return rows, skipped


def _row_line(r: dict) -> str:
    return (f"  {r['learner']:13s} {r['axis']:6s} B={r['batch']:<5d} N={r['agents']:<3d} seeds={r['seeds']:<3d} "
            f"K={r['k']:<4d} compile {r['compile_s']:5.1f}s  {r['update_ms']:9.2f} ms/update  "
            f"{measure.si(r['updates_per_s'])} upd/s  {measure.si(r['transitions_per_s'])} trans/s  "
            f"{r.get('gflops', float('nan')):6.1f} GFLOP/s  load {r['loadavg'][0] if r['loadavg'] else '-'}")


# -- paper shapes ---------------------------------------------------------------------------


def time_against_probe(
    compiled, call_args, probe: measure.PeakProbe, flops_call: float, repeats: int, warmup: bool = True
) -> dict:
    """Alternate 1024² matmul probes and calls; per repeat, achieved GFLOP/s over
    the mean of the probes just before and after it. (Calls are compiled ahead
    of time, so a slow call may skip the warm-up.)"""
    warm = measure.time_once(compiled, *call_args)[0] if warmup else None
    walls, cpus, ratios, peaks = [], [], [], []
    for _ in range(repeats):
        before = probe(3)
        w, c, _ = measure.time_once(compiled, *call_args)
        after = probe(3)
        peak = 0.5 * (before + after)
        walls.append(w)
        cpus.append(c)
        peaks.append(peak)
        ratios.append(flops_call / w / 1e9 / peak)
    t = measure.Timing(walls, cpus, warm)
    return {
        "timing": t.to_dict(),
        "gflops": flops_call / t.median_s / 1e9,
        "gflops_cpu": flops_call / max(t.cpu_median_s, 1e-12) / 1e9,
        "probe_gflops": peaks,
        "probe_gflops_median": measure.median(peaks),
        "ratio_to_probe": ratios,
        "ratio_to_probe_median": measure.median(ratios),
    }


def run_paper(args, flops: FlopCounter) -> dict[str, Any]:
    shapes = Shapes()
    spec = synthetic_spec(PAPER.agents, shapes)
    assert spec.state_dim == 780
    data = synthetic_data(jax.random.PRNGKey(0), spec, args.paper_trajectories, shapes.episode_len)
    out: dict[str, Any] = {
        "shapes": {**dataclasses.asdict(shapes), "agents": PAPER.agents, "state_dim": spec.state_dim,
                   "batch_transitions": PAPER.batch, "agent_steps_per_update": 2 * PAPER.batch * PAPER.agents,
                   "dataset_trajectories": args.paper_trajectories},
        "interpretation": ("B = 8 trajectory pairs x 2 x T=70 = 1120 joint transitions per batch; one D_E and one "
                           "D_U batch per update = 2 x 1120 x N=5 = 11,200 agent-steps"),
    }
    print("\n[paper shapes] measuring the MLP-shaped matmul rate in this process ...", flush=True)
    probe = measure.PeakProbe()
    mm = measure.matmul_rates(measure.mlp_matmul_shapes(PAPER.batch * PAPER.agents), repeats=5, target_s=0.5)
    out["matmul_in_process"] = {"rows": mm, "summary": measure.summarize_matmul(mm)}
    out["learners"] = {}
    pref_data = None
    for name in args.paper_learners:
        res: dict[str, Any] = {}
        if name == "omapl" and pref_data is None:
            pref_data = synthetic_preferences(jax.random.PRNGKey(1), spec, 16 * PAPER_PAIRS, shapes.episode_len)
        batch = PAPER_PAIRS if name == "omapl" else PAPER.batch
        for label, k, reps in (("single", 1, args.paper_repeats), ("fused", PAPER.k, args.paper_fused_repeats)):
            if label == "fused" and args.quick:
                continue
            p = dataclasses.replace(PAPER, k=k, batch=batch)
            compiled, call_args, compile_s = build_call(name, spec, p, pref_data if name == "omapl" else data, shapes)
            flops_call, cost = flops.per_call(compiled, k)
            # a fused call lasts K single updates: skip its warm-up when that is long
            warm = label == "single" or res["single"]["update_ms"] * k < 10e3
            r = time_against_probe(compiled, call_args, probe, flops_call, reps, warmup=warm)
            upd_s = k / r["timing"]["median_s"]
            res[label] = {"k": k, "compile_s": compile_s, "flops_per_update": flops_call / k,
                          "bytes_accessed_per_call": cost.get("bytes accessed"),
                          "update_ms": 1e3 * r["timing"]["median_s"] / k, "updates_per_s": upd_s,
                          "transitions_per_s": upd_s * transitions_per_update(name, batch),
                          "agent_steps_per_s": upd_s * transitions_per_update(name, batch) * PAPER.agents,
                          "loadavg": measure.loadavg(), **r}
            s = res[label]
            print(f"  {name:13s} {label:6s} K={k:<3d} compile {compile_s:5.1f}s  {s['update_ms']:8.1f} ms/update  "
                  f"{s['flops_per_update'] / 1e9:6.2f} GFLOP/update  {s['gflops']:6.1f} GFLOP/s  "
                  f"matmul probe {s['probe_gflops_median']:6.1f} GFLOP/s  ratio {s['ratio_to_probe_median']:.2f}  "
                  f"load {s['loadavg'][0]}", flush=True)
            if label == "single" and name == "misodice" and not args.no_op_profile:
                res["op_profile"] = op_profile(compiled, call_args)
            del compiled
        out["learners"][name] = res
    out["mlp_step"] = mlp_ceiling(probe, args.paper_fused_repeats if not args.quick else 2)
    if args.profile and "misodice" in args.paper_learners:
        out["ablations"] = paper_ablations(spec, data, shapes, flops, probe, args)
    return out


def mlp_step(rows: int, in_dim: int = 129, hidden: tuple[int, ...] = (256, 256), k: int = 16, seed: int = 0):
    """A compiled call of ``k`` plain gradient steps of one :class:`jaxil.nn.nets.MLP`
    (``in_dim -> hidden -> 1``, squared-output loss, SGD) on a ``[rows, in_dim]``
    batch, fused in a ``lax.scan`` like ``update_n``: the most a learner made
    of such networks can get from XLA's dots, element-wise ops and layout
    copies on this machine. Returns ``(compiled, args, flops_per_call)``."""
    net = MLP(1, tuple(hidden))
    kx, kp = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (rows, in_dim), jnp.float32)
    params = net.init(kp, x)

    def loss(p, x):
        return jnp.mean(net.apply(p, x) ** 2)

    def call(params, x):
        def body(p, _):
            g = jax.grad(loss)(p, x)
            return jax.tree.map(lambda w, d: w - 1e-3 * d, p, g), None

        return jax.lax.scan(body, params, None, length=k)[0]

    compiled, _ = measure.compile_ahead(call, params, x)
    flops = measure.xla_cost(compiled).get("flops")
    if flops is not None and measure.xla_loop_flops_multiplier() < 0.5:
        flops *= k  # this XLA counts a while body once
    return compiled, (params, x), flops


def mlp_ceiling(probe: measure.PeakProbe, repeats: int) -> dict[str, Any]:
    """Bare 129-256-256-1 MLP gradient steps (K = 16 fused) at the paper's
    row counts (one batch of agent-steps, and the doubled gradient-penalty
    batch), timed against the same 1024² probe: what XLA gets on this machine
    from a network of the learners' shape with nothing else in the update."""
    res = {}
    for rows in (PAPER.batch * PAPER.agents, 2 * PAPER.batch * PAPER.agents):
        compiled, call_args, flops_call = mlp_step(rows, k=PAPER.k)
        r = time_against_probe(compiled, call_args, probe, flops_call, repeats)
        res[str(rows)] = {"rows": rows, "k": PAPER.k, "flops_per_step": flops_call / PAPER.k, **r}
        print(f"  bare MLP step rows={rows:<6d} {1e3 * r['timing']['median_s'] / PAPER.k:7.1f} ms/step  "
              f"{r['gflops']:6.1f} GFLOP/s  ratio to probe {r['ratio_to_probe_median']:.2f}", flush=True)
        del compiled
    return res


def paper_ablations(spec, data, shapes, flops, probe, args) -> dict[str, Any]:
    """MisoDICE single update without the gradient penalty (its share of time)."""
    from jaxil.algorithms.offline.dice import DiceConfig, make_dice

    res = {}
    learner = make_dice(spec, DiceConfig(mixing="hyper", hidden=shapes.hidden, mixer_hidden=shapes.mixer_hidden,
                                         batch_size=PAPER.batch, grad_penalty=False))
    state = learner.init(jax.random.PRNGKey(0))
    compiled, compile_s = measure.compile_ahead(lambda s, d: update_n(learner, s, d, 1), state, data)
    flops_call, _ = flops.per_call(compiled, 1)
    r = time_against_probe(compiled, (state, data), probe, flops_call, args.paper_repeats)
    res["misodice_no_grad_penalty"] = {"compile_s": compile_s, "flops_per_update": flops_call,
                                       "update_ms": 1e3 * r["timing"]["median_s"], **r}
    print(f"  misodice without gradient penalty: compile {compile_s:.1f}s  {res['misodice_no_grad_penalty']['update_ms']:.1f} "
          f"ms/update  {flops_call / 1e9:.2f} GFLOP  ratio {r['ratio_to_probe_median']:.2f}", flush=True)
    return res


# -- op-level profile -----------------------------------------------------------------------------


_DOT_LINE = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = \w+\[([\d,]*)\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)(.*)")
_DEF_LINE = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = \w+\[([\d,]*)\]")


def _dims(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def hlo_dots(hlo_text: str) -> dict[str, tuple[float, str]]:
    """Top-level op name -> (flops, ``[lhs]x[rhs]->[out]``) for every op of the
    optimised HLO that is a dot or a fusion containing dots (e.g. ``ynn_fusion``)."""
    comps: dict[str, list[str]] = {}
    cur = None
    for line in hlo_text.splitlines():
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            cur = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
            comps[cur] = []
        elif cur is not None:
            comps[cur].append(line)

    def dots_in(lines):
        shapes = {m.group(1): _dims(m.group(2)) for m in map(_DEF_LINE.match, lines) if m}
        found = []
        for line in lines:
            m = _DOT_LINE.match(line)
            if not m:
                continue
            out, lhs, rhs = _dims(m.group(2)), shapes.get(m.group(3), []), shapes.get(m.group(4), [])
            cd = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", m.group(5))
            k = 1
            for d in _dims(cd.group(1)) if cd else []:
                k *= lhs[d] if d < len(lhs) else 1
            n = 1
            for d in out:
                n *= d
            found.append((m.group(1), 2.0 * n * k, f"{lhs}x{rhs}->{out}"))
        return found

    result = {}
    for lines in comps.values():
        for name, f, desc in dots_in(lines):
            result[name] = (f, desc)
        for line in lines:
            if " fusion(" not in line:
                continue
            m, cm = _DEF_LINE.match(line), re.search(r"calls=%([\w.\-]+)", line)
            if m and cm:
                inner = dots_in(comps.get(cm.group(1), []))
                if inner:
                    result[m.group(1)] = (sum(f for _, f, _ in inner), "; ".join(d for _, _, d in inner))
    return result


def _category(name: str, dots: dict) -> str:
    if name in dots:
        return "dot"
    base = re.sub(r"\.\d+$", "", name)
    for key, cat in (("gather", "gather (sampling, indexing)"), ("scatter", "scatter"),
                     ("concatenate", "concatenate"), ("copy", "copy/transpose (layout)"),
                     ("transpose", "copy/transpose (layout)"), ("reduce", "reduce")):
        if key in base:
            return cat
    return "element-wise/other fusions"


def op_profile(compiled, call_args, reps: int = 1) -> dict[str, Any]:
    """Per-op time of one call from a ``jax.profiler`` trace, grouped into
    dots / element-wise / copies / concatenations / gathers, and GFLOP/s per
    dot shape. Op times are summed over XLA's threads (independent ops run
    concurrently), so shares are of busy thread time, not of wall time."""
    try:
        from jax._src.lib import _profile_data  # private: may move between versions
    except ImportError as e:  # pragma: no cover
        return {"error": f"no profile reader in this jax: {e}"}
    dots = hlo_dots(compiled.as_text())
    measure.time_once(compiled, *call_args)
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(reps):
                measure.time_once(compiled, *call_args)
        files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        if not files:
            return {"error": "the profiler wrote no trace"}
        pd = _profile_data.ProfileData.from_file(files[0])
        per_op: dict[str, float] = collections.defaultdict(float)
        for plane in pd.planes:
            for line in plane.lines:
                if "XLA" not in line.name:
                    continue
                for ev in line.events:
                    n = ev.name
                    if n.startswith(("ThunkExecutor", "SlinkyThreadPool", "end:", "$")) or "::" in n:
                        continue
                    per_op[n] += ev.duration_ns / reps / 1e6
    total = sum(per_op.values())
    cats: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for n, ms in per_op.items():
        c = cats[_category(n, dots)]
        c[0] += ms
        c[1] += 1
    by_shape: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for n, (f, desc) in dots.items():
        if n in per_op:
            s = by_shape[desc]
            s[0] += per_op[n]
            s[1] += f
            s[2] += 1
    dot_ms = cats["dot"][0] if "dot" in cats else 0.0
    dot_flops = sum(f for n, (f, _) in dots.items() if n in per_op)
    prof = {
        "busy_thread_ms": total,
        "categories": {c: {"ms": v[0], "share": v[0] / total if total else None, "ops": int(v[1])}
                       for c, v in sorted(cats.items(), key=lambda kv: -kv[1][0])},
        "dot_gflops_per_busy_thread_s": dot_flops / dot_ms / 1e6 if dot_ms else None,
        "dots_by_shape": [{"shape": d, "ms": v[0], "gflop": v[1] / 1e9, "count": int(v[2]),
                           "gflops": v[1] / v[0] / 1e6 if v[0] else None}
                          for d, v in sorted(by_shape.items(), key=lambda kv: -kv[1][0])[:16]],
        "top_ops": [{"op": n, "ms": ms, "category": _category(n, dots)}
                    for n, ms in sorted(per_op.items(), key=lambda kv: -kv[1])[:15]],
    }
    print("  op profile (misodice single update, busy thread time):")
    for c, v in prof["categories"].items():
        print(f"    {c:28s} {v['ms']:8.1f} ms  {100 * v['share']:5.1f}%  ({v['ops']} ops)")
    return prof


# -- main --------------------------------------------------------------------------------------------


SWEEP_COLUMNS = [
    ("learner", "learner", "{}"),
    ("axis", "axis", "{}"),
    ("batch", "B", "{}"),
    ("agents", "N", "{}"),
    ("seeds", "seeds", "{}"),
    ("k", "K", "{}"),
    ("compile_s", "compile s", "{:.1f}"),
    ("update_ms", "ms/update", "{:.2f}"),
    ("updates_per_s", "updates/s", "{:.1f}"),
    ("transitions_per_s", "transitions/s", "{:.0f}"),
    ("gflops", "GFLOP/s", "{:.1f}"),
    ("gflops_cpu", "GFLOP/cpu-s", "{:.1f}"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small run: base B=256 K=4, two values per axis")
    p.add_argument("--full", action="store_true", help="every sweep value, no time budget")
    p.add_argument("--learners", default=",".join(LEARNERS), help="comma-separated subset of " + ",".join(LEARNERS))
    p.add_argument("--axes", default="batch,agents,seeds,k", help="sweep axes (comma-separated; '' for none)")
    p.add_argument("--no-sweep", action="store_true", help="paper shapes only")
    p.add_argument("--no-paper", action="store_true", help="sweeps only")
    p.add_argument("--paper-learners", default="misodice,omapl",
                   help="learners to run at the paper shapes (" + ",".join(LEARNERS + ("omapl",)) + ")")
    p.add_argument("--paper-trajectories", type=int, default=1200, help="dataset size at the paper shapes (x70 steps)")
    p.add_argument("--paper-repeats", type=int, default=5, help="timed single updates at the paper shapes")
    p.add_argument("--paper-fused-repeats", type=int, default=2, help="timed K=16 calls at the paper shapes")
    p.add_argument("--profile", action="store_true", help="also MisoDICE without the gradient penalty")
    p.add_argument("--no-op-profile", action="store_true", help="skip the jax.profiler op breakdown")
    p.add_argument("--no-peak-subprocess", action="store_true", help="skip the 1-thread/all-thread matmul children")
    p.add_argument("--batch-values", default=None, help="comma-separated batch sizes for the batch axis")
    p.add_argument("--seeds-values", default=None, help="comma-separated seed counts for the seeds axis")
    p.add_argument("--trajectories", type=int, default=120, help="sweep dataset size in 70-step trajectories")
    p.add_argument("--budget-s", type=float, default=None, help="seconds for the sweeps (0: no limit)")
    p.add_argument("--repeats", type=int, default=7, help="most timed calls per sweep point")
    p.add_argument("--repeats-min", type=int, default=2, help="fewest timed calls per sweep point")
    p.add_argument("--target-s", type=float, default=3.0, help="about this many seconds of timed calls per point")
    p.add_argument("--cache-dir", default=None,
                   help="JAX persistent compilation cache (reruns then load instead of compiling; "
                   "compile_s measures the load)")
    p.add_argument("--out-dir", default=None, help="where the JSON goes (default benchmarks/results)")
    p.add_argument("--name", default="learner_throughput", help="JSON file name prefix")
    args = p.parse_args(argv)
    args.learners = [x for x in args.learners.split(",") if x]
    args.paper_learners = [x for x in args.paper_learners.split(",") if x]
    for axis in ("batch", "seeds"):
        raw = getattr(args, f"{axis}_values")
        if raw:
            try:
                vals = [int(v) for v in raw.split(",") if v]
            except ValueError:
                p.error(f"--{axis}-values {raw!r}: give comma-separated integers")
            if not vals or min(vals) < 1:
                p.error(f"--{axis}-values {raw!r}: every value must be >= 1")
            setattr(args, f"{axis}_values", vals)
    for x in args.learners:
        if x not in LEARNERS:
            p.error(f"unknown learner {x!r}; choose from {', '.join(LEARNERS)}")
    for x in args.paper_learners:
        if x not in LEARNERS + ("omapl",):
            p.error(f"unknown paper learner {x!r}; choose from {', '.join(LEARNERS + ('omapl',))}")
    if args.budget_s is None:
        args.budget_s = 0.0 if args.full else (120.0 if args.quick else 300.0)
    if args.quick:
        args.learners = [x for x in args.learners if x in ("bc_union", "misodice")] or args.learners
        args.paper_repeats = min(args.paper_repeats, 3)
        args.no_peak_subprocess = True
    if args.no_sweep:
        args.axes = ""
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    t0 = time.perf_counter()
    load = {"start": measure.loadavg()}
    flops = FlopCounter()
    payload: dict[str, Any] = {
        "machine": measure.machine_info(),
        "versions": measure.library_versions(),
        "config": {k: v for k, v in vars(args).items()},
        "definitions": {
            "updates_per_s": "learner updates per second, summed over vmapped seeds (seeds*K/median call time)",
            "transitions_per_s": "joint transitions consumed per second (DICE: 2B per update, D_E + D_U batch; BC: B)",
            "agent_steps_per_s": "transitions_per_s * N",
            "gflops": "XLA cost-analysis flops of the call / median wall time",
            "gflops_cpu": "XLA flops / median process CPU time of the call",
            "ratio_to_probe": "achieved GFLOP/s over a 1024^2 jnp.dot's GFLOP/s timed just before and after each repeat",
            "xla_loop_flops_multiplier": flops.multiplier,
        },
    }
    print(f"jaxil learner throughput on {payload['machine']['cpu_model']} ({payload['machine']['cpu_count']} CPUs), "
          f"jax {payload['versions']['jax']}, load {load['start']}")
    print(f"XLA cost analysis counts a scan body {'per trip' if flops.counts_trips else 'once'} "
          f"(multiplier {flops.multiplier:.3f}); flops per call corrected accordingly")

    if not args.no_peak_subprocess:
        print("\n[matmul peak] child processes, all threads and 1 thread ...", flush=True)
        payload["matmul_peak"] = measure.matmul_peak_children(PAPER.batch * PAPER.agents, ("all", "1"))
        for th, res in payload["matmul_peak"].items():
            if "summary" in res:
                s = res["summary"]
                print(f"  {th:>3s} threads: 1024^2 {s['square_1024_gflops']:.1f} GFLOP/s, best MLP shape "
                      f"{s['mlp_best_gflops']:.1f}, best {s['peak_gflops']:.1f}")
            else:
                print(f"  {th} threads: {res.get('error')}")
        load["after_peak"] = measure.loadavg()

    if not args.no_paper:
        payload["paper"] = run_paper(args, flops)
        load["after_paper"] = measure.loadavg()

    rows, skipped = [], []
    if args.axes:
        print(f"\n[sweeps] budget {args.budget_s:.0f} s (0 = none)", flush=True)
        rows, skipped = run_sweeps(args, flops, Shapes())
    load["end"] = measure.loadavg()
    payload.update(rows=rows, skipped=skipped, load=load, wall_s=time.perf_counter() - t0)
    payload["summary"] = summary(payload)
    path = measure.write_json(args.name, payload, args.out_dir or RESULTS_DIR)
    report(payload)
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s)")
    return payload


def summary(payload: dict[str, Any]) -> dict[str, Any]:
    """Headline numbers: MisoDICE at the paper shapes against the matmul rates."""
    out: dict[str, Any] = {}
    paper = payload.get("paper") or {}
    peaks = payload.get("matmul_peak", {})
    mm = (paper.get("matmul_in_process") or {}).get("summary", {})
    steps = paper.get("mlp_step") or {}
    ceiling = max((r["gflops"] for r in steps.values()), default=None)
    if steps:
        out["bare_mlp_step"] = {rows: {"gflops": r["gflops"], "ratio_to_probe_1024": r["ratio_to_probe_median"]}
                                for rows, r in steps.items()}
    for name, res in paper.get("learners", {}).items():
        for label in ("single", "fused"):
            if label not in res:
                continue
            s = res[label]
            h = {"update_ms": s["update_ms"], "gflop_per_update": s["flops_per_update"] / 1e9,
                 "gflops": s["gflops"], "gflops_cpu": s["gflops_cpu"],
                 "ratio_to_probe_1024": s["ratio_to_probe_median"]}
            if mm.get("mlp_best_gflops"):
                h["ratio_to_mlp_best_in_process"] = s["gflops"] / mm["mlp_best_gflops"]
            if ceiling:
                h["ratio_to_bare_mlp_step"] = s["gflops"] / ceiling
            for th in ("all", "1"):
                pk = peaks.get(th, {}).get("summary", {}).get("peak_gflops")
                if pk:
                    h[f"ratio_to_peak_{th}_threads"] = s["gflops"] / pk
            out[f"{name}_{label}"] = h
    return out


def report(payload: dict[str, Any]) -> None:
    rows = payload.get("rows", [])
    if rows:
        print("\nSweeps (one axis varied around the base point):")
        print(measure.format_table(rows, SWEEP_COLUMNS))
    if payload.get("skipped"):
        print("skipped for the time budget: " + ", ".join(
            f"{s['learner']} {s['axis']}(B={s['batch']},N={s['agents']},seeds={s['seeds']},K={s['k']}; ~{s['estimated_s']:.0f}s)"
            for s in payload["skipped"]))
    paper = payload.get("paper")
    if paper:
        mm = paper["matmul_in_process"]["summary"]
        peaks = payload.get("matmul_peak", {})
        print("\nPaper shapes (SMACv1 5m_vs_6m: N=5, obs 124, state 780, 12 actions, 256-256, mixer 64, "
              "B=1120 joint transitions x 2 batches):")
        for name, res in paper["learners"].items():
            for label in ("single", "fused"):
                if label not in res:
                    continue
                s = res[label]
                line = (f"  {name} {label} (K={s['k']}): {s['update_ms']:.0f} ms/update, "
                        f"{s['flops_per_update'] / 1e9:.2f} GFLOP/update, {s['gflops']:.1f} GFLOP/s "
                        f"({s['gflops_cpu']:.1f} per CPU-s); {s['ratio_to_probe_median']:.0%} of the 1024^2 matmul "
                        f"rate measured alongside ({s['probe_gflops_median']:.1f} GFLOP/s)")
                if mm.get("mlp_best_gflops"):
                    line += f", {s['gflops'] / mm['mlp_best_gflops']:.0%} of the best MLP-shaped matmul ({mm['mlp_best_gflops']:.1f})"
                for th in ("all", "1"):
                    if peaks.get(th, {}).get("summary"):
                        pk = peaks[th]["summary"]["peak_gflops"]
                        line += f", {s['gflops'] / pk:.0%} of the {th}-thread peak ({pk:.1f})"
                print(line)
        for rows, r in (paper.get("mlp_step") or {}).items():
            print(f"  bare MLP gradient step, {rows} rows: {r['gflops']:.1f} GFLOP/s, "
                  f"{r['ratio_to_probe_median']:.0%} of the 1024^2 matmul rate alongside "
                  f"({r['probe_gflops_median']:.1f})")


if __name__ == "__main__":
    main()
