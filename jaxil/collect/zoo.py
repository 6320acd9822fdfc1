"""The policy zoo: per environment, demonstrators of named quality tiers.

Every environment that has an expert gets four tiers:

```text
expert   the best checkpoint of a trained teacher (`jaxil.teachers`), or,
         without one, a scripted expert where jaxil has a correct one
         (SMAX: JaxMARL's heuristic; MPE spread: landmark assignment +
         PD control; LevelBasedForaging: BFS to the team's target food;
         they live beside their adapters, see `envs.experts`)
medium   a mid-training teacher checkpoint whose evaluated return lies in
         the medium band, else the expert with ε = 0.4 per-agent noise
         (LevelBasedForaging 0.7, MPE spread 0.6: `EPSILON_OVERRIDES`)
poor     an early teacher checkpoint in the poor band, else the expert
         with ε = 0.85 per-agent noise (MPE spread 0.9)
random   uniform over the available actions (or the action box)
```

With a teacher, `make_zoo(..., greedy_expert=True)` (the recipes' `-greedy`
suffix) makes the expert act on the teacher's greedy / mean action instead of
sampling it; medium and poor stay as above.

Bands are on the teacher's own evaluation (`teacher.json`) normalised as
`(R - R_random) / (R_best - R_random)`: medium in `[0.3,
0.8]` (nearest 0.55 wins), poor in `[0.0, 0.35]` (nearest 0.15). ε-noise
([`noisy_policy`][jaxil.collect.zoo.noisy_policy]) has the semantics of
[`envs.policies.epsilon_mixture`][jaxil.envs.policies.epsilon_mixture] (each
agent independently acts uniformly at random with probability ε at every step)
with ε a traced parameter, so expert, medium and poor share one compiled
program.

Teachers are looked up under `runs/teachers/<env>/` (`<env>` is the id with
`:` replaced by `_`, e.g. `runs/teachers/smax_3m`; the short recipe name
such as `smax-3m` and the bare name `3m` also match) in `$JAXIL_TEACHERS`,
the working directory and the repository; only complete runs are picked up
automatically, an explicit `teacher_dir` may be a run still in progress.
Without a local run, the teacher shipped with jaxil is used
(`jaxil/teachers/shipped/`: SMAX 3m and 2s3z and the MaMuJoCo hopper 3x1
and half-cheetah 6x1, the MAPPO teachers of the committed datasets and
tables); a local run overrides it, with a warning.

Collection is one jitted program per policy and chunk size: a `vmap` of
[`envs.run_episodes`][jaxil.envs.rollout.run_episodes] for ONE episode over a
chunk of per-episode keys, so episode `i` is reproducible on its own from its
integer seed:

```python
envs.run_episodes(env, tier.policy, tier.params, jax.random.PRNGKey(seed_i), 1)
```

[`measure_tiers`][jaxil.collect.zoo.measure_tiers] rolls every tier out
(default 128 episodes, one compiled, vectorized program per tier, shared where
the policy is) and reports mean return ± std, win rate and length.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxil import envs
from jaxil.envs.core import EnvSpec, MultiAgentEnv
from jaxil.envs.experts import scripted_expert
from jaxil.envs.policies import Policy, ScriptedExpertUnavailable, as_policy, random_policy
from jaxil.runs.io_atomic import atomic_write_text
from jaxil.teachers import shipped_teachers
from jaxil.teachers.io import SHIPPED_DIR
from jaxil.teachers.io import load_checkpoint

TIERS = ("expert", "medium", "poor", "random")
#: How datasets name a shipped teacher's directory, the same on every machine.
SHIPPED_LABEL = "jaxil/teachers/shipped/"
EPSILON = {"medium": 0.4, "poor": 0.85}
# Per-environment ε where the defaults put a tier far outside its band (the
# CHECKPOINT_BANDS below, on the normalised return; calibration in
# data_report.md). LevelBasedForaging pays 1 for clearing the board however
# long it takes, so ε = 0.4 still clears every board (return 1.0, like the
# expert); ε = 0.7 clears about half. The spread expert recovers quickly from
# random pushes: ε = 0.4 / 0.85 keep 87 % / 39 % of its margin over random,
# ε = 0.6 / 0.9 keep 73 % / 29 %.
EPSILON_OVERRIDES: dict[str, dict[str, float]] = {
    "jumanji:LevelBasedForaging-v0": {"medium": 0.7},
    "mpe:simple_spread_continuous": {"medium": 0.6, "poor": 0.9},
    "mpe:simple_spread": {"medium": 0.6, "poor": 0.9},
}
# Normalised-score bands (lo, hi, target) for picking teacher checkpoints.
CHECKPOINT_BANDS = {"medium": (0.3, 0.8, 0.55), "poor": (0.0, 0.35, 0.15)}
TEACHERS_ENV_VAR = "JAXIL_TEACHERS"
DEFAULT_CHUNK = 128
MAX_SEED = 2**31  # per-episode seeds are < 2**31, so PRNGKey(seed) is exact


class ExpertUnavailable(ValueError):
    """An environment has no trained teacher and no scripted expert (or none
    for its configuration:
    [`envs.policies.ScriptedExpertUnavailable`][jaxil.envs.policies.ScriptedExpertUnavailable])."""


@dataclasses.dataclass(frozen=True, eq=False)
class TierPolicy:
    """One demonstrator: `policy` (a plain function or
    [`envs.policies.Policy`][jaxil.envs.policies.Policy]) with its `params`.

    Attributes:
      tier: `"expert"`, `"medium"`, `"poor"` or `"random"`.
      source: short stable name recorded in datasets, e.g.
        `"smax-heuristic"`, `"smax-heuristic+eps0.85"`,
        `"teacher:smax_3m@2990080"`, `"random"`.
      details: JSON-friendly provenance (kind, epsilon, teacher dir and step,
        the teacher's own evaluation, ...).
      program: tiers with the same `program` share one policy function and
        differ only in `params`, so they share compiled collectors.
    """

    tier: str
    source: str
    policy: Any
    params: Any
    details: Mapping[str, Any]
    program: str


# ---------------------------------------------------------------------------
# Teachers
# ---------------------------------------------------------------------------
def teacher_roots() -> list[Path]:
    """Where teachers are looked up: `$JAXIL_TEACHERS` (`os.pathsep`
    separated), `./runs/teachers`, and `<repository>/runs/teachers`."""
    roots = []
    env = os.environ.get(TEACHERS_ENV_VAR)
    if env:
        roots += [Path(p) for p in env.split(os.pathsep) if p]
    roots.append(Path.cwd() / "runs" / "teachers")
    roots.append(Path(__file__).resolve().parents[2] / "runs" / "teachers")
    out: list[Path] = []
    for r in roots:
        if r.resolve() not in [o.resolve() for o in out]:
            out.append(r)
    return out


def teacher_dir_names(env_id: str) -> list[str]:
    """Directory names a teacher of `env_id` may have under a root."""
    family, _, name = env_id.partition(":")
    return list(dict.fromkeys([env_id.replace(":", "_"), f"{family}-{name}", name]))


def _read_teacher(path: Path) -> Optional[dict]:
    f = path / "teacher.json"
    if not f.is_file():
        return None
    try:
        with open(f) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def find_local_teacher(env_id: str) -> Optional[Path]:
    """A COMPLETE teacher run of `env_id` under
    [`teacher_roots`][jaxil.collect.zoo.teacher_roots], or None."""
    for root in teacher_roots():
        for name in teacher_dir_names(env_id):
            d = root / name
            doc = _read_teacher(d)
            if doc and doc.get("env_id") == env_id and doc.get("complete") and doc.get(
                "checkpoints"
            ):
                return d
    return None


def find_teacher(env_id: str) -> Optional[Path]:
    """The teacher the zoo uses for `env_id`: a complete local run
    ([`find_local_teacher`][jaxil.collect.zoo.find_local_teacher]), else the
    one shipped with jaxil
    ([`jaxil.teachers.shipped_teachers`][jaxil.teachers.io.shipped_teachers]),
    else None."""

    return find_local_teacher(env_id) or shipped_teachers().get(env_id)


def teacher_label(teacher_dir: os.PathLike | str) -> str:
    """How datasets record a teacher directory: a shipped teacher as
    `jaxil/teachers/shipped/<name>` (the same on every machine), a local
    run as its path."""

    d = Path(teacher_dir).resolve()
    if d.parent == SHIPPED_DIR:
        return SHIPPED_LABEL + d.name
    return str(teacher_dir)


def teacher_path(label: str) -> Path:
    """The directory a [`teacher_label`][jaxil.collect.zoo.teacher_label]
    names: a shipped teacher's label resolved under the installed package, a
    local run's path as it is."""
    if label.startswith(SHIPPED_LABEL):
        return SHIPPED_DIR / label[len(SHIPPED_LABEL):]
    return Path(label)


def teacher_override_note(env_id: str, teacher_dir: os.PathLike | str) -> Optional[str]:
    """A line saying that `teacher_dir` replaces the shipped teacher of
    `env_id`, or None when it is the shipped one or none is shipped."""

    shipped = shipped_teachers().get(env_id)
    if shipped is None or Path(teacher_dir).resolve() == shipped.resolve():
        return None
    return (f"{env_id}: using the teacher in {teacher_dir}, not the one shipped with jaxil "
            f"({teacher_label(shipped)})")


def _compatible(a: EnvSpec, b: EnvSpec) -> bool:
    """Same agents, observations and actions (time limits may differ)."""
    return (a.num_agents, a.obs_dim, a.action) == (b.num_agents, b.obs_dim, b.action)


def noisy_policy(policy: Any, spec: EnvSpec) -> Policy:
    """`policy` with per-agent ε-noise, ε a traced parameter.

    `params = {"base": base_params, "epsilon": ε}`: at every step each agent
    independently acts uniformly at random (over its available actions, or the
    action box) with probability ε and follows `policy` otherwise — the
    semantics of
    [`envs.policies.epsilon_mixture`][jaxil.envs.policies.epsilon_mixture], but
    one compiled program serves every ε and every checkpoint of the same
    network, so the expert, medium and poor tiers of an environment compile
    once.
    """
    base = as_policy(policy)
    rand = random_policy(spec)
    n = spec.num_agents

    def act(params, obs, avail, key, carry):
        k_base, k_rand, k_coin = jax.random.split(key, 3)
        a, carry = base.act(params["base"], obs, avail, k_base, carry)
        r = rand(None, obs, avail, k_rand)
        explore = jax.random.uniform(k_coin, (n,)) < params["epsilon"]
        explore = explore.reshape((n,) + (1,) * (a.ndim - 1))
        return jnp.where(explore, r, a).astype(a.dtype), carry

    return Policy(init=base.init, act=act)


def noisy_params(base_params: Any, epsilon: float) -> dict[str, Any]:
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    return {"base": base_params, "epsilon": np.float32(epsilon)}


def tier_epsilons(env_id: str, overrides: Optional[Mapping[str, float]] = None
                  ) -> dict[str, float]:
    """ε of the noised-expert medium and poor tiers of `env_id`
    (`EPSILON`, then `EPSILON_OVERRIDES`, then `overrides`)."""
    out = {**EPSILON, **EPSILON_OVERRIDES.get(env_id, {})}
    for tier, e in (overrides or {}).items():
        if tier not in EPSILON:
            raise ValueError(f"epsilon overrides apply to {', '.join(EPSILON)}, not {tier!r}")
        if not 0.0 <= float(e) <= 1.0:
            raise ValueError(f"epsilon of tier {tier!r} must be in [0, 1], got {e}")
        out[tier] = float(e)
    return out


def _teacher_tiers(env: MultiAgentEnv, teacher_dir: Path, epsilons: Mapping[str, float],
                   greedy_expert: bool = False) -> dict[str, TierPolicy]:

    doc = _read_teacher(teacher_dir)
    if doc is None:
        raise FileNotFoundError(
            f"{teacher_dir} has no readable teacher.json; give the output directory of "
            f"`jaxil teach` / jaxil.teachers.train_teacher"
        )
    spec = env.spec
    if doc.get("env_id") != spec.env_id:
        raise ValueError(
            f"teacher {teacher_dir} was trained on {doc.get('env_id')!r}, not {spec.env_id!r}"
        )
    ckpts = [c for c in doc.get("checkpoints", []) if "eval_stochastic" in c]
    if not ckpts:
        raise FileNotFoundError(
            f"teacher {teacher_dir} has no evaluated checkpoints yet; wait for training "
            f"to write one"
        )
    if not doc.get("complete"):
        warnings.warn(f"teacher {teacher_dir} is still training; using its checkpoints so far")
    note = teacher_override_note(spec.env_id, teacher_dir)
    if note is not None:
        warnings.warn(note)
    ret = lambda c: float(c["eval_stochastic"]["return_mean"])  # noqa: E731
    best = max(ckpts, key=lambda c: (ret(c), c["step"]))
    r_best = ret(best)
    r_rand = (doc.get("random_baseline") or {}).get("return_mean")
    name = teacher_dir.name

    def load(step):
        policy, params, tspec, digest = load_checkpoint(str(teacher_dir), step=step)
        if not _compatible(tspec, spec):
            raise ValueError(
                f"teacher {teacher_dir} acts on {tspec} but the environment is {spec}; "
                f"train the teacher with the same environment keywords"
            )
        digests[int(step)] = digest
        return policy, params

    digests: dict[int, str] = {}

    def ckpt_details(c):
        ev = c["eval_stochastic"]
        out = dict(teacher_dir=teacher_label(teacher_dir), step=int(c["step"]),
                   params_sha256=digests[int(c["step"])],
                   teacher_eval_return=ev["return_mean"])
        if "win_rate" in ev:
            out["teacher_eval_win_rate"] = ev["win_rate"]
        return out

    # Every checkpoint has the same network: one policy function (and one
    # compiled program) serves them all, noised or not.
    base, best_params = load(best["step"])
    policy = noisy_policy(base, spec)
    program = f"teacher:{name}"
    expert_src = f"teacher:{name}@{best['step']}"
    tiers = {
        "expert": TierPolicy("expert", expert_src, policy, noisy_params(best_params, 0.0),
                             dict(kind="teacher", **ckpt_details(best)), program)
    }
    if greedy_expert:  # the same checkpoint acting on its mode; the ε tiers keep sampling
        mode, mode_params, _, _ = load_checkpoint(str(teacher_dir), step=best["step"],
                                                  deterministic=True)
        tiers["expert"] = TierPolicy(
            "expert", f"{expert_src} (greedy)", noisy_policy(mode, spec),
            noisy_params(mode_params, 0.0),
            dict(kind="teacher", greedy=True, **ckpt_details(best)), f"{program}:greedy")
    eps = dict(epsilons)
    for tier in ("medium", "poor"):
        chosen = None
        if r_rand is not None and r_best > r_rand:
            lo, hi, target = CHECKPOINT_BANDS[tier]
            scored = [((ret(c) - r_rand) / (r_best - r_rand), c) for c in ckpts
                      if c["step"] != best["step"]]
            inside = [(abs(sc - target), sc, c) for sc, c in scored if lo <= sc <= hi]
            if inside:
                _, score, chosen = min(inside, key=lambda x: (x[0], x[2]["step"]))
        if chosen is not None:
            _, params = load(chosen["step"])
            tiers[tier] = TierPolicy(
                tier, f"teacher:{name}@{chosen['step']}", policy, noisy_params(params, 0.0),
                dict(kind="teacher-checkpoint", normalized_score=round(score, 4),
                     band=list(CHECKPOINT_BANDS[tier][:2]), **ckpt_details(chosen)), program)
        else:
            e = eps[tier]
            tiers[tier] = TierPolicy(
                tier, f"{expert_src}+eps{e}", policy, noisy_params(best_params, e),
                dict(kind="epsilon-expert", epsilon=e,
                     note="no teacher checkpoint in the band "
                          f"{list(CHECKPOINT_BANDS[tier][:2])}", **ckpt_details(best)),
                program)
    return tiers


# ---------------------------------------------------------------------------
# The zoo
# ---------------------------------------------------------------------------
class Zoo:
    """The tiers of one environment, plus cached compiled collectors.

    Build with [`make_zoo`][jaxil.collect.zoo.make_zoo]. `zoo["expert"]` is a
    [`TierPolicy`][jaxil.collect.zoo.TierPolicy];
    [`collect`][jaxil.collect.zoo.Zoo.collect] rolls a tier out for a list of
    per-episode seeds.
    """

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any], env: MultiAgentEnv,
                 tiers: Mapping[str, TierPolicy]):
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs)
        self.env = env
        self.tiers = dict(tiers)
        self._compiled: dict[tuple[str, int], Callable] = {}

    @property
    def spec(self) -> EnvSpec:
        return self.env.spec

    def __getitem__(self, tier: str) -> TierPolicy:
        if tier not in self.tiers:
            raise KeyError(f"unknown tier {tier!r}; tiers: {', '.join(self.tiers)}")
        return self.tiers[tier]

    def __repr__(self) -> str:
        srcs = ", ".join(f"{t}={p.source}" for t, p in self.tiers.items())
        return f"Zoo({self.env_id!r}: {srcs})"

    def describe(self) -> dict[str, dict[str, Any]]:
        """`{tier: {"source", **details}}` (JSON-friendly)."""
        return {t: dict(source=p.source, **p.details) for t, p in self.tiers.items()}

    def collector(self, tier: str, chunk_size: int, action_noise: float = 0.0) -> Callable:
        """Jitted `(params, keys [C, 2] uint32) -> Episodes [C,
        ...]`: one episode per key, compiled once per program (see
        `TierPolicy.program`), chunk size and `action_noise` (σ of
        [`envs.ActionNoise`][jaxil.envs.wrappers.ActionNoise] on the executed
        actions; 0: none)."""
        k = (self[tier].program, int(chunk_size), float(action_noise))
        if k not in self._compiled:
            pol = as_policy(self[tier].policy)
            env = envs.ActionNoise(self.env, action_noise) if action_noise else self.env

            def one(params, key):
                ep = envs.run_episodes(env, pol, params, key, 1)
                return jax.tree.map(lambda x: x[0], ep)

            self._compiled[k] = jax.jit(jax.vmap(one, in_axes=(None, 0)))
        return self._compiled[k]

    def collect(self, tier: str, seeds: Sequence[int], chunk_size: int = DEFAULT_CHUNK,
                bar: Any = None, action_noise: float = 0.0) -> Any:
        """Roll `tier` out once per seed; numpy `Episodes` batch-major `[E, ...]`.

        Seeds go through in chunks of `chunk_size` (the last chunk is padded,
        so one compiled program serves every chunk); `bar` (a tqdm bar) is
        advanced by the episodes of each chunk. `action_noise` > 0 executes the
        actions through [`envs.ActionNoise`][jaxil.envs.wrappers.ActionNoise]
        and records the policy's own (DART collection; box actions only).
        """
        seeds = np.asarray(seeds, np.int64).reshape(-1)
        if seeds.size and (seeds.min() < 0 or seeds.max() >= MAX_SEED):
            raise ValueError(f"episode seeds must lie in [0, 2**31), got {seeds.min()}..{seeds.max()}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        fn = self.collector(tier, chunk_size, action_noise)
        params = self[tier].params
        parts = []
        for start in range(0, len(seeds), chunk_size):
            chunk = seeds[start:start + chunk_size]
            padded = np.concatenate([chunk, np.zeros(chunk_size - len(chunk), np.int64)])
            out = jax.device_get(fn(params, episode_keys(padded)))
            parts.append(jax.tree.map(lambda x, n=len(chunk): np.asarray(x)[:n], out))
            if bar is not None:
                bar.update(len(chunk))
        if not parts:
            raise ValueError("collect needs at least one seed")
        return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *parts)


def episode_keys(seeds: Any) -> jax.Array:
    """`[E, 2]` uint32 keys equal to `jax.random.PRNGKey(seed)` for each
    seed in `[0, 2**31)`."""
    s = np.asarray(seeds, np.int64)
    return jnp.asarray(np.stack([np.zeros_like(s), s], -1).astype(np.uint32))


def no_expert_message(env_id: str) -> str:
    return (
        f"{env_id} has no expert: no trained teacher was found (looked for "
        f"{', '.join(str(r / n) for r in teacher_roots() for n in teacher_dir_names(env_id)[:1])}) "
        f"and jaxil has no scripted expert for it. Train one with `jaxil teach {env_id}` "
        f"(or `jaxil teach --env {env_id} --out "
        f"runs/teachers/{env_id.replace(':', '_')}`) and pass its directory as teacher_dir / "
        f"--teacher."
    )


def make_zoo(
    env_id: str,
    *,
    env_kwargs: Optional[Mapping[str, Any]] = None,
    teacher_dir: Optional[os.PathLike | str] = None,
    discover: bool = True,
    epsilons: Optional[Mapping[str, float]] = None,
    cache: bool = True,
    greedy_expert: bool = False,
) -> Zoo:
    """The four tiers of `env_id`.

    Args:
      env_id: registry id, e.g. `"smax:3m"`.
      env_kwargs: keyword overrides for [`envs.make`][jaxil.envs.registry.make]
        (e.g. `max_steps`). `None` takes those the teacher was trained with
        (its `teacher.json`; a MaMuJoCo teacher records its solver
        settings), or none without a teacher; `{}` forces the defaults.
      teacher_dir: a teacher run directory to take the tiers from (may still
        be training); `None` looks one up (see the module docstring).
      discover: look for a complete teacher when `teacher_dir` is None;
        `False` forces the scripted expert.
      epsilons: ε overrides of the noised-expert tiers, e.g. `{"medium": 0.2}`
        (a tier taken from a teacher checkpoint stays so).
      cache: reuse the zoo (and its compiled collectors) of an earlier call
        with the same arguments in this process; a teacher whose
        `teacher.json` changed since is reloaded.
      greedy_expert: the expert tier acts on the teacher's greedy / mean
        action instead of sampling (its source ends in `" (greedy)"`); the
        ε-noised tiers still noise the sampling expert. Needs a teacher.

    Raises:
      ExpertUnavailable: neither a teacher nor a scripted expert exists.
      ValueError: `greedy_expert` without a teacher (scripted experts have
        no sampled policy to take the mode of).
    """
    eps = tier_epsilons(env_id, epsilons)
    if teacher_dir is None and discover:
        teacher_dir = find_teacher(env_id)
    if env_kwargs is None and teacher_dir is not None:
        env_kwargs = (_read_teacher(Path(teacher_dir)) or {}).get("env_kwargs")
    env_kwargs = dict(env_kwargs or {})
    key = None
    if cache:
        stamp = None
        if teacher_dir is not None:
            f = Path(teacher_dir) / "teacher.json"
            stamp = f.stat().st_mtime_ns if f.exists() else None
        key = (env_id, json.dumps(env_kwargs, sort_keys=True, default=str),
               None if teacher_dir is None else str(Path(teacher_dir).resolve()), stamp,
               tuple(sorted(eps.items())), bool(greedy_expert))
        if key in _ZOO_CACHE:
            return _ZOO_CACHE[key]
    zoo = _make_zoo(env_id, env_kwargs, teacher_dir, eps, greedy_expert)
    if key is not None:
        while len(_ZOO_CACHE) >= 8:
            _ZOO_CACHE.pop(next(iter(_ZOO_CACHE)))
        _ZOO_CACHE[key] = zoo
    return zoo


_ZOO_CACHE: dict[tuple, Zoo] = {}


def _make_zoo(env_id: str, env_kwargs: dict, teacher_dir: Optional[os.PathLike | str],
              epsilons: Mapping[str, float], greedy_expert: bool = False) -> Zoo:
    if greedy_expert and teacher_dir is None:
        raise ValueError(f"a greedy expert needs a teacher, but {env_id} has none here (its "
                         f"expert would be scripted); give a teacher run directory, or drop "
                         f"the greedy expert (a recipe's -greedy suffix)")
    env = envs.make(env_id, **env_kwargs)
    spec = env.spec
    if teacher_dir is not None:
        tiers = _teacher_tiers(env, Path(teacher_dir), epsilons, greedy_expert)
    else:
        try:
            scripted = scripted_expert(env)
        except ScriptedExpertUnavailable as e:
            raise ExpertUnavailable(str(e)) from e
        if scripted is None:
            raise ExpertUnavailable(no_expert_message(env_id))
        base, name, desc = scripted
        policy = noisy_policy(base, spec)
        tiers = {"expert": TierPolicy("expert", name, policy, noisy_params(None, 0.0),
                                      dict(kind="scripted", description=desc), name)}
        for tier, e in epsilons.items():
            tiers[tier] = TierPolicy(tier, f"{name}+eps{e}", policy, noisy_params(None, e),
                                     dict(kind="epsilon-expert", epsilon=e), name)
    tiers["random"] = TierPolicy("random", "random", random_policy(spec), None,
                                 dict(kind="random"), "random")
    return Zoo(env_id, env_kwargs, env, {t: tiers[t] for t in TIERS})


def measurement_seeds(seed: int, num_episodes: int) -> np.ndarray:
    """Distinct per-episode seeds of
    [`measure_tiers`][jaxil.collect.zoo.measure_tiers] (independent of the
    seeds a recipe collects with)."""
    return np.random.default_rng([int(seed), 0x6D656173]).choice(
        MAX_SEED, size=num_episodes, replace=False
    )


def tier_summary(eps: Any, has_win: bool) -> dict[str, Any]:
    """[`jaxil.envs.episode_summary`][jaxil.envs.rollout.episode_summary] under
    the names of the tier measurements (`mean_return`, `std_return`,
    `mean_length`; `win_rate` None when the task has no win)."""
    s = envs.episode_summary(eps, has_win)
    return dict(episodes=s["episodes"], mean_return=s["return_mean"],
                std_return=s["return_std"], mean_length=s["length_mean"],
                win_rate=s.get("win_rate"))


def measure_tiers(
    env_id: str,
    *,
    tiers: Sequence[str] = TIERS,
    num_episodes: int = 128,
    seed: int = 0,
    teacher_dir: Optional[os.PathLike | str] = None,
    discover: bool = True,
    env_kwargs: Optional[Mapping[str, Any]] = None,
    chunk_size: Optional[int] = None,
    out_path: Optional[os.PathLike | str] = None,
    zoo: Optional[Zoo] = None,
    progress: Any = False,
) -> dict[str, Any]:
    """Mean return ± std, win rate and length of each tier over `num_episodes`.

    Each tier is one compiled, vectorized program (the collector of
    [`Zoo.collect`][jaxil.collect.zoo.Zoo.collect]; `chunk_size` defaults to
    `num_episodes`, so one call). Pass `zoo` to reuse its compiled programs.
    Writes the result as JSON to `out_path` if given. `progress`: True for a
    tqdm bar, or an existing bar to advance.

    Returns:
      `{"env_id", "env_kwargs", "num_episodes", "seed", "tiers": {tier:
      {"source", "episodes", "mean_return", "std_return", "win_rate",
      "mean_length"}}}` (`win_rate` None when the task has no win).
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    if zoo is None:
        zoo = make_zoo(env_id, env_kwargs=env_kwargs, teacher_dir=teacher_dir, discover=discover)
    elif zoo.env_id != env_id:
        raise ValueError(f"zoo is for {zoo.env_id!r}, not {env_id!r}")
    seeds = measurement_seeds(seed, num_episodes)
    chunk = int(chunk_size or num_episodes)
    bar, own_bar = None, False
    if progress is True:
        from tqdm.auto import tqdm

        bar, own_bar = tqdm(total=num_episodes * len(tiers), unit="ep",
                            desc=f"measure {env_id}", dynamic_ncols=True), True
    elif progress:
        bar = progress
    result = {}
    try:
        for t in tiers:
            eps = zoo.collect(t, seeds, chunk, bar)
            result[t] = dict(source=zoo[t].source, **tier_summary(eps, zoo.spec.has_win))
    finally:
        if own_bar:
            bar.close()
    doc = dict(env_id=env_id, env_kwargs=zoo.env_kwargs, num_episodes=int(num_episodes),
               seed=int(seed), tiers=result)
    if out_path is not None:
        atomic_write_text(out_path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc
