"""Environment throughput: jaxil adapters against the raw upstream environments.

For every environment id (``envs.list()`` by default, ``--envs`` to choose) and
every batch size (1, 64, 1024; 4096 with ``--big``) this measures env-steps/s
of

- the adapter: ``envs.AutoReset(envs.make(id))``, ``vmap``-ed, stepped in a
  ``lax.scan`` with uniformly random legal actions (:func:`random_actions`);
- the raw upstream environment the adapter wraps, driven with its own API in
  the same way: JaxMARL's ``env.step`` (which auto-resets: step, reset and a
  select, as ``envs.AutoReset`` does), Jumanji's ``AutoResetWrapper`` (a
  ``lax.cond`` that becomes the same select under ``vmap``), random legal
  actions drawn from the upstream mask (or box) with the same sampler; for
  the MaMuJoCo ids (MJX) the bare physics: ``frame_skip`` calls of
  ``mjx.step`` on random controls, reset at the time limit, with no
  observation, reward or health check.

With ``--reset none`` neither side resets: the adapter's plain ``step`` against
JaxMARL's ``step_env`` / Jumanji's ``step`` (episodes that end keep being
stepped, which every upstream env allows). This isolates the per-step cost,
which a costly reset (Cleaner's maze generation, SMAX's unit placement)
otherwise dilutes.

Both sides carry their observations through the scan and return the final
carry, so no observation work is dead code. Timed calls alternate between
the two sides (after one warm-up call each) and the median over repeats is
reported, with ``block_until_ready``. ``overhead = adapter time / raw time - 1``,
from wall-clock time and from this process's CPU time: on a machine shared
with other jobs the wall clock mostly measures the neighbours, and the CPU
time (all XLA threads) is the steadier of the two.

    python benchmarks/env_throughput.py                      # everything
    python benchmarks/env_throughput.py --envs jumanji:Cleaner-v0 --num-envs 1024

Writes ``benchmarks/results/env_throughput-<host>-<date>.json`` and prints a
table. MABrax ids are skipped when brax is missing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from jaxil import envs
from jaxil.envs.policies import uniform_available

RESULTS = Path(__file__).resolve().parent / "results"


class Runner(NamedTuple):
    """``init(key) -> carry`` for E envs; ``run(carry, key) -> carry`` takes T steps."""

    name: str
    init: Callable[[jax.Array], Any]
    run: Callable[[Any, jax.Array], Any]


def random_actions(key: jax.Array, num_agents: int, mask=None, box=None) -> jax.Array:
    """Uniformly random legal actions ``[N]`` (from a ``[N, A]`` mask) or
    ``[N, *shape]`` (from ``box = (shape, low, high)``), one key per agent.

    Both sides of every comparison draw their actions with this function, so
    the action sampling costs the same on both and the overhead is the
    adapter's alone. (How actions are drawn matters on cheap envs: on MPE at
    1024 envs, one categorical over the whole ``[N, A]`` block from one key
    costs about 20 % of an env step more than this per-agent draw.)
    """
    keys = jax.random.split(key, num_agents)
    if mask is not None:
        return jax.vmap(uniform_available)(keys, mask)
    shape, low, high = box
    return jax.vmap(lambda k: jax.random.uniform(k, shape, minval=low, maxval=high))(keys)


def _scan_runner(name, reset_one, step_one, num_envs: int, num_steps: int) -> Runner:
    """Vmap ``reset_one(key) -> carry`` / ``step_one(carry, key) -> carry`` over
    ``num_envs`` and scan ``num_steps`` steps, jitted (the carry is donated)."""

    def init(key):
        return jax.vmap(reset_one)(jax.random.split(key, num_envs))

    def run(carry, key):
        def body(c, k):
            return jax.vmap(step_one)(c, jax.random.split(k, num_envs)), None

        carry, _ = jax.lax.scan(body, carry, jax.random.split(key, num_steps))
        return carry

    return Runner(name, jax.jit(init), jax.jit(run, donate_argnums=0))


def adapter_runner(
    env: envs.MultiAgentEnv, num_envs: int, num_steps: int, auto_reset: bool = True
) -> Runner:
    auto = envs.AutoReset(env) if auto_reset else env
    spec = env.spec
    box = None if spec.discrete else ((spec.action.dim,), spec.action.low, spec.action.high)

    def reset_one(key):
        return auto.reset(key)

    def step_one(carry, key):
        state, ts = carry
        mask = ts.avail_actions if spec.discrete else None
        return auto.step(state, random_actions(key, spec.num_agents, mask, box))

    return _scan_runner("adapter", reset_one, step_one, num_envs, num_steps)


def raw_runner(
    env: envs.MultiAgentEnv, num_envs: int, num_steps: int, auto_reset: bool = True
) -> Optional[Runner]:
    """The upstream environment behind ``env``, driven through its own API."""
    from jaxil.envs.jumanji import JumanjiEnv
    from jaxil.envs.mpe import SpreadEnv
    from jaxil.envs.smax import SMAXEnv

    if isinstance(env, JumanjiEnv):
        from jumanji.wrappers import AutoResetWrapper

        raw = AutoResetWrapper(env.raw) if auto_reset else env.raw
        name = "jumanji AutoResetWrapper" if auto_reset else "jumanji step"

        def step_one(carry, key):
            state, ts = carry
            mask = ts.observation.action_mask
            return raw.step(state, random_actions(key, mask.shape[0], mask))

        return _scan_runner(name, raw.reset, step_one, num_envs, num_steps)

    name = "jaxmarl step (auto-reset)" if auto_reset else "jaxmarl step_env"

    def raw_step(raw, key, state, actions):
        if auto_reset:
            return raw.step(key, state, actions)
        return raw.step_env(key, state, actions)

    if isinstance(env, (SMAXEnv, SpreadEnv)):
        raw, agents = env.raw, env.raw.agents
        continuous = not env.spec.discrete

        def reset_one(key):
            obs, state = raw.reset(key)
            return state, obs

        def step_one(carry, key):
            state, _ = carry
            k_act, k_step = jax.random.split(key)  # the upstream step takes a key
            space = raw.action_spaces[agents[0]]
            if continuous:
                acts = random_actions(k_act, len(agents), box=(space.shape, space.low, space.high))
            else:
                if isinstance(env, SMAXEnv):
                    avail = raw.get_avail_actions(state)
                    mask = jnp.stack([avail[a] for a in agents])
                else:
                    mask = jnp.ones((len(agents), space.n), jnp.bool_)
                acts = random_actions(k_act, len(agents), mask)
            actions = {a: acts[i] for i, a in enumerate(agents)}
            obs, state, _, _, _ = raw_step(raw, k_step, state, actions)
            return state, obs

        return _scan_runner(name, reset_one, step_one, num_envs, num_steps)

    if type(env).__name__ == "MABraxEnvAdapter":
        raw, agents = env.raw, env.raw.agents

        def reset_one(key):
            obs, state = raw.reset(key)
            return state, obs

        def step_one(carry, key):
            state, _ = carry
            k_act, k_step = jax.random.split(key)
            acts = random_actions(k_act, len(agents), box=(raw.action_spaces[agents[0]].shape, -1.0, 1.0))
            actions = {a: acts[i] for i, a in enumerate(agents)}
            obs, state, _, _, _ = raw_step(raw, k_step, state, actions)
            return state, obs

        return _scan_runner(name, reset_one, step_one, num_envs, num_steps)

    if type(env).__name__ == "MaMuJoCoEnv":
        from mujoco import mjx

        m, mx, skip = env.model, env.mjx_model, env.robot.frame_skip
        name = "mjx.step x frame_skip" + (" (reset at the limit)" if auto_reset else "")

        def reset_one(key):
            return mjx.make_data(mx), jnp.int32(0)

        def step_one(carry, key):
            data, t = carry
            ctrl = jax.random.uniform(key, (m.nu,), minval=-1.0, maxval=1.0)
            data = jax.lax.fori_loop(0, skip, lambda _, d: mjx.step(mx, d),
                                     data.replace(ctrl=ctrl))
            if auto_reset:  # the bare physics has no falls: reset at the time limit only
                over = t + 1 >= env.spec.max_steps
                data = jax.tree.map(lambda a, b: jnp.where(over, a, b), mjx.make_data(mx), data)
                return data, jnp.where(over, 0, t + 1)
            return data, t + 1

        return _scan_runner(name, reset_one, step_one, num_envs, num_steps)

    return None


def _timed(runner: Runner, carry, key):
    """Run once; returns the carry, wall seconds and process CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    carry = jax.block_until_ready(runner.run(carry, key))
    return carry, time.perf_counter() - wall, time.process_time() - cpu


def measure(
    env, num_envs: int, num_steps: int, repeats: int, auto_reset: bool = True, seed: int = 0
) -> dict:
    """Median env-steps/s of the adapter and the raw env, timed alternately."""
    runners = [
        adapter_runner(env, num_envs, num_steps, auto_reset),
        raw_runner(env, num_envs, num_steps, auto_reset),
    ]
    runners = [r for r in runners if r is not None]
    key = jax.random.PRNGKey(seed)
    carries, compile_s = [], []
    walls, cpus = [[] for _ in runners], [[] for _ in runners]
    for r in runners:
        start = time.perf_counter()
        carry = jax.block_until_ready(r.init(key))
        carry, _, _ = _timed(r, carry, key)  # compile + warm-up
        compile_s.append(time.perf_counter() - start)
        carries.append(carry)
    for rep in range(repeats):
        k = jax.random.fold_in(key, rep + 1)
        for i, r in enumerate(runners):
            carries[i], wall, cpu = _timed(r, carries[i], k)
            walls[i].append(wall)
            cpus[i].append(cpu)
    work = num_envs * num_steps
    sps = [work / statistics.median(t) for t in walls]
    cpu_sps = [work / statistics.median(t) for t in cpus]
    row = dict(
        env=env.spec.env_id,
        num_envs=num_envs,
        num_steps=num_steps,
        repeats=repeats,
        reset="auto" if auto_reset else "none",
        adapter_steps_per_s=sps[0],
        adapter_steps_per_cpu_s=cpu_sps[0],
        adapter_wall_s=walls[0],
        adapter_cpu_s=cpus[0],
        adapter_compile_s=compile_s[0],
        raw=None,
        raw_steps_per_s=None,
        raw_steps_per_cpu_s=None,
        overhead=None,
        overhead_cpu=None,
    )
    if len(runners) == 2:
        row.update(
            raw=runners[1].name,
            raw_steps_per_s=sps[1],
            raw_steps_per_cpu_s=cpu_sps[1],
            raw_wall_s=walls[1],
            raw_cpu_s=cpus[1],
            raw_compile_s=compile_s[1],
            overhead=sps[1] / sps[0] - 1.0,
            overhead_cpu=cpu_sps[1] / cpu_sps[0] - 1.0,
        )
    return row


def _version(pkg: str) -> Optional[str]:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


HEADER = (
    f"{'env':<34} {'E':>5} {'adapter/s':>11} {'raw/s':>11} {'overhead':>9} "
    f"{'adapter/cpu-s':>13} {'raw/cpu-s':>11} {'ovh(cpu)':>9}"
)


def _print_row(r: dict) -> None:
    def num(x, w):
        return f"{x:>{w},.0f}" if x is not None else f"{'-':>{w}}"

    def pct(x):
        return f"{100 * x:>+8.1f}%" if x is not None else f"{'-':>9}"

    over = [x for x in (r["overhead"], r["overhead_cpu"]) if x is not None]
    flag = "  > 10%" if over and min(over) > 0.10 else ""
    print(
        f"{r['env']:<34} {r['num_envs']:>5} {num(r['adapter_steps_per_s'], 11)} "
        f"{num(r['raw_steps_per_s'], 11)} {pct(r['overhead'])} "
        f"{num(r['adapter_steps_per_cpu_s'], 13)} {num(r['raw_steps_per_cpu_s'], 11)} "
        f"{pct(r['overhead_cpu'])}{flag}",
        flush=True,
    )


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", nargs="+", default=None, help="ids (default: all of envs.list())")
    p.add_argument("--num-envs", nargs="+", type=int, default=[1, 64, 1024])
    p.add_argument("--big", action="store_true", help="also measure 4096 parallel envs")
    p.add_argument("--steps", type=int, default=100, help="steps per timed scan")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per side (median)")
    p.add_argument(
        "--reset", choices=["auto", "none"], default="auto",
        help="auto-reset on both sides (default) or on neither",
    )
    p.add_argument("--out", type=Path, default=None, help="output JSON path")
    args = p.parse_args(argv)

    sizes = sorted(set(args.num_envs + ([4096] if args.big else [])))
    ids = args.envs or envs.list()
    unknown = [e for e in ids if e not in envs.list()]
    if unknown:
        p.error(f"unknown env ids {unknown}; see envs.list()")

    dev = jax.devices()[0]
    meta = dict(
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        host=socket.gethostname(),
        python=platform.python_version(),
        versions={k: _version(k) for k in ("jax", "jaxlib", "jaxmarl", "jumanji", "brax", "flax")},
        device=dict(platform=dev.platform, kind=dev.device_kind, count=jax.device_count()),
        cpu_count=os.cpu_count(),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        num_steps=args.steps,
        repeats=args.repeats,
        num_envs=sizes,
        reset=args.reset,
        target="adapter overhead <= 10% vs raw at 1024 envs",
    )
    print(HEADER, flush=True)
    rows, skipped = [], {}
    for eid in ids:
        try:
            env = envs.make(eid)
        except ImportError as e:  # optional extras (MABrax without brax)
            skipped[eid] = str(e)
            print(f"{eid:<34} skipped: {e}", flush=True)
            continue
        for n in sizes:
            row = measure(env, n, args.steps, args.repeats, args.reset == "auto")
            rows.append(row)
            _print_row(row)

    result = dict(meta=meta, rows=rows, skipped=skipped)
    out = args.out
    if out is None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        tag = "" if args.reset == "auto" else "-noreset"
        out = RESULTS / (
            f"env_throughput-{meta['host']}-{datetime.date.today().isoformat()}{tag}.json"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
