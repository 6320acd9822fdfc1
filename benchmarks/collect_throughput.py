"""Dataset-collection throughput: trajectories/s and env-steps/s of collection
with a neural policy, 1 to 4096 parallel environments.

What is timed is the program :func:`jaxil.collect.recipes.build` collects a
dataset with: :meth:`jaxil.collect.zoo.Zoo.collector`, a jitted ``vmap`` over
per-episode keys (:func:`jaxil.collect.zoo.episode_keys`) of
``envs.run_episodes(env, policy, params, key, 1)``. One call plays E episodes
in parallel to their ends; E is the collector's chunk size (``build``'s
``chunk_size``, 128 by default). ``run_episodes`` scans a fixed
``spec.max_steps`` steps: an environment whose episode has ended keeps being
stepped and its result discarded by a select (its steps are masked out), so
the call does ``E × max_steps`` steps of work whatever the episode lengths.

Policies, both collected through the same zoo collector:

- ``neural``: a :class:`jaxil.nn.policy.PolicyNet` with hidden widths
  64-64 (as the MAPPO teachers of :mod:`jaxil.teachers.presets`), parameter
  sharing (one-hot agent id appended), RANDOMLY INITIALISED parameters (the
  cost does not depend on their values), acting by sampling (masked
  categorical or tanh-Gaussian); wrapped in :func:`jaxil.collect.zoo.noisy_policy`
  with ε = 0, exactly as the zoo wraps a teacher's expert tier (ε is a traced
  parameter, so the wrapper still draws the random action and the coin);
- ``random``: :func:`envs.policies.random_policy`, the zoo's random tier.

``neural/random`` is the ratio of their median call times (wall and process
CPU): the cost of the network relative to the environment.

Per env id (``--envs``) and number of parallel envs E (``--num-envs``): the
call is compiled ahead of time (``compile s``: tracing, lowering and XLA),
run once as a warm-up, then the two policies' calls alternate for
``--repeats`` timed calls each, ended by ``jax.block_until_ready``; medians
are reported. Definitions:

- ``trajectories/s`` = E / median call seconds;
- ``valid env-steps/s`` = the transitions actually collected (sum of the E
  episode lengths) / median seconds;
- ``padded env-steps/s`` = E × max_steps / median seconds (the steps the scan
  runs, the masked ones included);
- ``cpu s`` = median process CPU seconds of a call (all XLA threads);
- ``MB out`` = bytes of the collected arrays (the ``Episodes`` the call
  returns, on device; the copy to the host that ``Zoo.collect`` then makes
  is not timed).

Before running a size, the compiled call's output + temporary buffers
(XLA's memory analysis) are checked against the free memory (the
accelerator's, or the host's ``MemAvailable`` on CPU); a size that would not
fit, or that fails with an out-of-memory error, is recorded as a skipped row
with the reason.

    python benchmarks/collect_throughput.py                    # 3 envs, E = 1, 64, 1024, 4096
    python benchmarks/collect_throughput.py --envs smax:3m --num-envs 1 64 --repeats 2
    python benchmarks/collect_throughput.py --policies neural    # no random-policy baseline

Writes ``benchmarks/results/collect_throughput-<host>-<date>.json`` (machine,
library versions, config, load average, rows) and prints a table.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxil import envs
from jaxil.envs.policies import random_policy
from jaxil.collect.zoo import TierPolicy, Zoo, episode_keys, noisy_params, noisy_policy
from jaxil.nn.policy import PolicyNet
from jaxil.runs import measure

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_ENVS = ("smax:3m", "mpe:simple_spread_continuous", "jumanji:LevelBasedForaging-v0")
DEFAULT_NUM_ENVS = (1, 64, 1024, 4096)
POLICIES = ("neural", "random")


# -- policies and the collector ---------------------------------------------------------


def make_zoo(env: envs.MultiAgentEnv, hidden: tuple[int, ...], seed: int) -> Zoo:
    """A :class:`Zoo` with a ``neural`` tier (random-init PolicyNet, sampling,
    ε = 0 noise wrapper as for a teacher's expert) and the ``random`` tier."""
    spec = env.spec
    net = PolicyNet(spec, tuple(hidden), shared=True)
    params = jax.jit(net.init)(jax.random.PRNGKey(seed))
    width = "x".join(str(h) for h in hidden)
    tiers = {
        "neural": TierPolicy(
            "neural", f"policynet-{width}-random-init",
            noisy_policy(net.policy_fn(deterministic=False), spec), noisy_params(params, 0.0),
            dict(kind="PolicyNet", hidden=list(hidden), shared=True, init="random",
                 acting="sample", wrapper="noisy_policy, epsilon 0"),
            "neural"),
        "random": TierPolicy("random", "random", random_policy(spec), None,
                             dict(kind="random"), "random"),
    }
    return Zoo(spec.env_id, {}, env, tiers)


# -- one environment, one size ------------------------------------------------------------


def measure_size(zoo: Zoo, num_envs: int, repeats: int, seed: int = 0,
                 policies: tuple[str, ...] = POLICIES) -> list[dict[str, Any]]:
    """Rows (one per policy) of collecting ``num_envs`` episodes in one call."""
    spec = zoo.spec
    keys = episode_keys(np.arange(seed, seed + num_envs))
    base = {"env": spec.env_id, "num_envs": num_envs, "max_steps": spec.max_steps,
            "num_agents": spec.num_agents}
    rows = {p: {**base, "policy": p, "source": zoo[p].source} for p in policies}

    def skip(reason):
        for r in rows.values():
            r["skipped"] = reason
        print(f"  {spec.env_id} E={num_envs}: skipped ({reason})", flush=True)
        return list(rows.values())

    calls, outs = {}, {}
    try:
        for p in policies:
            fn = zoo.collector(p, num_envs)
            compiled, compile_s = measure.compile_ahead(fn, zoo[p].params, keys)
            mem = measure.xla_memory(compiled)
            rows[p].update(compile_s=compile_s, **mem)
            reason = measure.memory_shortfall(mem)
            if reason:
                return skip(reason)
            calls[p] = compiled
        warm: dict[str, float] = {}
        for p in policies:  # warm-up; its output gives the episode lengths and sizes
            w, _, out = measure.time_once(calls[p], zoo[p].params, keys)
            warm[p] = w
            outs[p] = {
                "valid_steps": int(np.asarray(out.length).sum()),
                "mean_length": float(np.asarray(out.length).mean()),
                "mean_return": float(np.asarray(out.episode_return).mean()),
                "output_bytes": int(sum(x.nbytes for x in jax.tree.leaves(out))),
            }
            del out
        walls = {p: [] for p in policies}
        cpus = {p: [] for p in policies}
        for _ in range(max(repeats, 1)):  # alternate, so both see the same machine load
            for p in policies:
                w, c, out = measure.time_once(calls[p], zoo[p].params, keys)
                del out
                walls[p].append(w)
                cpus[p].append(c)
    except Exception as e:  # noqa: BLE001
        if measure.is_oom(e):
            return skip(f"out of memory: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        raise
    finally:
        calls.clear()

    padded = num_envs * spec.max_steps
    for p in policies:
        t = measure.Timing(walls[p], cpus[p], warm[p])
        o = outs[p]
        s, cs = t.median_s, max(t.cpu_median_s, 1e-12)
        rows[p].update(
            skipped=None,
            call_s=s,
            cpu_s=t.cpu_median_s,
            trajectories_per_s=num_envs / s,
            valid_steps=o["valid_steps"],
            padded_steps=padded,
            valid_fraction=o["valid_steps"] / padded,
            valid_env_steps_per_s=o["valid_steps"] / s,
            padded_env_steps_per_s=padded / s,
            valid_env_steps_per_cpu_s=o["valid_steps"] / cs,
            padded_env_steps_per_cpu_s=padded / cs,
            mean_length=o["mean_length"],
            mean_return=o["mean_return"],
            output_bytes=o["output_bytes"],
            output_mb=o["output_bytes"] / 1e6,
            timing=t.to_dict(),
        )
    r_wall = r_cpu = None
    if "neural" in rows and "random" in rows:
        r_wall = rows["neural"]["call_s"] / rows["random"]["call_s"]
        r_cpu = rows["neural"]["cpu_s"] / max(rows["random"]["cpu_s"], 1e-12)
    for r in rows.values():
        r["time_ratio_neural_random"] = r_wall
        r["cpu_ratio_neural_random"] = r_cpu
    return list(rows.values())


# -- main ------------------------------------------------------------------------------------


COLUMNS = [
    ("env", "env", "{}"),
    ("num_envs", "E", "{}"),
    ("policy", "policy", "{}"),
    ("compile_s", "compile s", "{:.1f}"),
    ("call_s", "call s", "{:.4f}"),
    ("cpu_s", "cpu s", "{:.4f}"),
    ("trajectories_per_s", "traj/s", "{:.1f}"),
    ("valid_env_steps_per_s", "valid env-steps/s", "{:.0f}"),
    ("padded_env_steps_per_s", "padded env-steps/s", "{:.0f}"),
    ("valid_fraction", "valid", "{:.2f}"),
    ("output_mb", "MB out", "{:.2f}"),
    ("time_ratio_neural_random", "neural/random", "{:.2f}"),
    ("cpu_ratio_neural_random", "(cpu)", "{:.2f}"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS), help="env ids (default: %(default)s)")
    p.add_argument("--num-envs", nargs="+", type=int, default=list(DEFAULT_NUM_ENVS),
                   help="parallel envs (episodes) per call (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per policy (median)")
    p.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES),
                   help="policies to time (default: both; the ratio needs both)")
    p.add_argument("--hidden", nargs="+", type=int, default=[64, 64], help="PolicyNet hidden widths")
    p.add_argument("--seed", type=int, default=0, help="network init and first episode seed")
    p.add_argument("--out-dir", default=None, help="where the JSON goes (default benchmarks/results)")
    p.add_argument("--name", default="collect_throughput", help="JSON file name prefix")
    args = p.parse_args(argv)
    unknown = [e for e in args.envs if e not in envs.list()]
    if unknown:
        p.error(f"unknown env ids {unknown}; see envs.list()")
    if any(n < 1 for n in args.num_envs):
        p.error("--num-envs must be positive")
    args.num_envs = sorted(set(args.num_envs))
    args.policies = [x for x in POLICIES if x in args.policies]
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    t0 = time.perf_counter()
    load = {"start": measure.loadavg()}
    payload: dict[str, Any] = {
        "machine": measure.machine_info(),
        "versions": measure.library_versions(),
        "config": dict(vars(args)),
        "definitions": {
            "collector": "jaxil.collect.zoo.Zoo.collector: jit(vmap over episode keys of "
                         "envs.run_episodes(env, policy, params, key, 1)), chunk size = num_envs",
            "neural": f"PolicyNet hidden {tuple(args.hidden)}, shared, random init, sampling, "
                      "in noisy_policy with epsilon 0 (as a zoo teacher's expert tier)",
            "random": "envs.policies.random_policy (the zoo's random tier)",
            "trajectories_per_s": "num_envs / median call seconds",
            "valid_env_steps_per_s": "sum of the episode lengths (transitions collected) / median call seconds",
            "padded_env_steps_per_s": "num_envs * max_steps (steps the fixed-length scan runs) / median call seconds",
            "cpu_s": "median process CPU seconds of a call",
            "output_bytes": "bytes of the Episodes arrays one call returns",
            "time_ratio_neural_random": "median call time neural / random (cpu_ratio: process CPU time)",
        },
    }
    m = payload["machine"]
    print(f"jaxil collection throughput on {m['cpu_model']} ({m['cpu_count']} CPUs, backend {m['backend']}), "
          f"jax {payload['versions']['jax']}, load {load['start']}", flush=True)
    rows: list[dict[str, Any]] = []
    for eid in args.envs:
        try:
            env = envs.make(eid)
        except ImportError as e:  # optional extras
            rows.append({"env": eid, "skipped": f"environment unavailable: {e}"})
            print(f"  {eid}: skipped ({e})", flush=True)
            continue
        zoo = make_zoo(env, tuple(args.hidden), args.seed)
        for n in args.num_envs:
            new = measure_size(zoo, n, args.repeats, args.seed, tuple(args.policies))
            rows.extend(new)
            for r in new:
                if not r.get("skipped"):
                    print(f"  {eid} E={n} {r['policy']}: compile {r['compile_s']:.1f} s, "
                          f"{r['trajectories_per_s']:.1f} traj/s, "
                          f"{r['valid_env_steps_per_s']:.0f} valid env-steps/s", flush=True)
            jax.clear_caches()  # keep one size's executables in memory at a time
    load["end"] = measure.loadavg()
    payload.update(rows=rows, load=load, wall_s=time.perf_counter() - t0)
    path = measure.write_json(args.name, payload, args.out_dir or RESULTS_DIR)
    print()
    print(measure.format_table([r for r in rows if not r.get("skipped")], COLUMNS))
    for r in rows:
        if r.get("skipped"):
            print(f"skipped: {r['env']} E={r.get('num_envs', '-')} {r.get('policy', '')}: {r['skipped']}")
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
