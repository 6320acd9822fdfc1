"""Named dataset recipes: `<env-short>/<recipe>` → a reproducible dataset.

A recipe says how many trajectories of each quality tier of the policy zoo
([`jaxil.collect.zoo`][jaxil.collect.zoo]) to collect on one environment:

```text
smax-3m/misodice-200e-1000p   200 expert + 1000 poor (the MisoDICE setup)
smax-3m/expert                1000 expert        (also medium, poor, random)
smax-3m/replay                300 of each tier: expert, medium, poor, random
smax-3m/mix-50e-100m-400p     any mix: <count><e|m|p|r> groups
mpe-simple_spread_continuous/misodice-200e-1000p-dart0.8
                              any kind + `-dart<σ>`: collected DART-style
                              (box actions only, see below)
mamujoco-hopper_3x1/misodice-200e-1000p-greedy
                              any kind + `-greedy`: the expert tier acts on
                              the teacher's greedy / mean action
```

`<env-short>` is the environment id with `:` replaced by `-` (`smax-3m`,
`smax-smacv2_5_units`, `mpe-simple_spread_continuous`,
`jumanji-LevelBasedForaging-v0`); the full id (`smax:3m/expert`) works too, and
so does any registered environment that has an expert (a trained teacher or a
scripted one), e.g. `smax-6h_vs_8z/replay`.
[`list_recipes`][jaxil.collect.recipes.list_recipes] lists the recipes
published for the benchmark environments.

[`build`][jaxil.collect.recipes.build] collects every tier on device (one
compiled, vmapped [`envs.run_episodes`][jaxil.envs.rollout.run_episodes]
program per policy and chunk size, reused across chunks), shuffles the
trajectories, keeps the ground-truth `expert` flag (`tier == "expert"`;
learners choose whether to look at it), records per trajectory its tier, source
policy and episode seed, records the recipe name and every creation argument
(including the zoo's provenance and the measured tier returns), and writes the
file atomically with [`jaxil.data.save`][jaxil.data.format.save]. Same
arguments → byte-identical file; another seed → other episodes.

A `-greedy` suffix (before any `-dart<σ>`) makes the expert tier act on its
teacher's greedy (discrete) or mean (box) action instead of sampling it, as
[`make_zoo`][jaxil.collect.zoo.make_zoo]'s `greedy_expert` does; the other
tiers are unchanged, and since episode seeds go to the tiers in recipe order,
a greedy build's poor trajectories are those of the sampled build. It needs a
trained teacher (a scripted expert has no sampled policy to take the mode of).
The tiers are measured with the greedy expert, so normalised scores on a
greedy build are relative to the greedy expert's return.

A `-dart<σ>` suffix collects every tier through
[`envs.ActionNoise`][jaxil.envs.wrappers.ActionNoise]: the executed action is
the policy's plus Gaussian noise of std `σ × (high − low)`, clipped to the box,
and the recorded action is the policy's own (DART, Laskey et al. 2017). For a
deterministic expert the recorded action is its clean action at a state it
reached after being pushed off its path, which is what behaviour cloning needs
on MPE spread (`experiments/misodice_table/README.md`). The transitions are
exact samples of the noisy-actuator MDP, so a DICE learner reads `(s, a, s')`
consistently. The tiers are still *measured* (`tier_measurements`, the
normalisation of scores) in the noise-free environment, which is the one
learners are evaluated in.

Episode seeds: `numpy.random.default_rng([seed, 0x62756C64]).choice(2**31,
total, replace=False)`, handed out to the tiers in recipe order; episode `i`
is `envs.run_episodes(env, policy, params, jax.random.PRNGKey(seed_i), 1)`
with the tier's policy and params (`zoo[tier]`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import numpy as np

from jaxil import envs
from jaxil.data.format import Dataset, canonical_json, concatenate, save, size_bound
from jaxil.collect.zoo import (
    DEFAULT_CHUNK,
    MAX_SEED,
    TIERS,
    make_zoo,
    measure_tiers,
)
from jaxil.runs.io_atomic import atomic_write_text, check_file_writable, check_free_space
from jaxil.data.format import load

DEFAULT_DATA_DIR = Path("runs") / "data"
EXTENSION = ".npz"

# The environments recipes are published for (short name -> id).
RECIPE_ENVS: dict[str, str] = {
    "smax-3m": "smax:3m",
    "smax-2s3z": "smax:2s3z",
    "smax-5m_vs_6m": "smax:5m_vs_6m",
    "smax-smacv2_5_units": "smax:smacv2_5_units",
    "mpe-simple_spread_continuous": "mpe:simple_spread_continuous",
    "mpe-simple_spread": "mpe:simple_spread",
    "jumanji-LevelBasedForaging-v0": "jumanji:LevelBasedForaging-v0",
    "mamujoco-hopper_3x1": "mamujoco:hopper_3x1",
    "mamujoco-halfcheetah_6x1": "mamujoco:halfcheetah_6x1",
}

# Recipe kinds: name -> (counts per tier, description).
KINDS: dict[str, tuple[tuple[tuple[str, int], ...], str]] = {
    "misodice-200e-1000p": (
        (("expert", 200), ("poor", 1000)),
        "200 expert + 1000 poor trajectories, shuffled (the MisoDICE setup)",
    ),
    "expert": ((("expert", 1000),), "1000 expert trajectories"),
    "medium": ((("medium", 1000),), "1000 medium trajectories"),
    "poor": ((("poor", 1000),), "1000 poor trajectories"),
    "random": ((("random", 1000),), "1000 random-policy trajectories"),
    "replay": (
        tuple((t, 300) for t in TIERS),
        "300 trajectories of each tier (expert, medium, poor, random), shuffled",
    ),
}
_LETTER = {"e": "expert", "m": "medium", "p": "poor", "r": "random"}
_MIX = re.compile(r"^(?:mix|misodice)((?:-\d+[empr])+)$")
_SUFFIXES = re.compile(r"^(?P<base>.+?)(?P<greedy>-greedy)?(?:-dart(?P<sigma>\d+(?:\.\d+)?))?$")
_BUILD_SALT = 0x62756C64  # "buld"
_SHUFFLE_SALT = 0x73687566  # "shuf"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A named recipe: `counts` trajectories per tier on `env_id`.

    Attributes:
      env_id: registry id, e.g. `"smax:3m"`.
      kind: the part after the slash, e.g. `"misodice-200e-1000p"`.
      counts: `((tier, count), ...)` in collection order.
      description: one line for `jaxil data list`.
      action_noise: σ of the DART collection (`-dart<σ>`; 0 = none).
      greedy_expert: the expert tier acts on the teacher's greedy / mean
        action (`-greedy`).
    """

    env_id: str
    kind: str
    counts: tuple[tuple[str, int], ...]
    description: str = ""
    action_noise: float = 0.0
    greedy_expert: bool = False

    @property
    def env_short(self) -> str:
        return env_short(self.env_id)

    @property
    def name(self) -> str:
        return f"{self.env_short}/{self.kind}"

    @property
    def total(self) -> int:
        return sum(n for _, n in self.counts)

    def resolve_counts(
        self, scale: float = 1.0, overrides: Optional[Mapping[str, int]] = None
    ) -> dict[str, int]:
        """Counts after `scale` (each count rounded, at least 1) and
        per-tier `overrides` (which may add a tier or drop one with 0)."""
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        out = {t: max(1, int(round(n * scale))) for t, n in self.counts}
        for t, n in (overrides or {}).items():
            if t not in TIERS:
                raise ValueError(f"unknown tier {t!r} in counts; tiers: {', '.join(TIERS)}")
            if int(n) < 0:
                raise ValueError(f"count of tier {t!r} must be >= 0, got {n}")
            out[t] = int(n)
        out = {t: n for t, n in out.items() if n > 0}
        if not out:
            raise ValueError(f"recipe {self.name} with these counts collects nothing")
        return out

    def default_path(
        self,
        seed: int = 0,
        counts: Optional[Mapping[str, int]] = None,
        root: Union[str, os.PathLike] = DEFAULT_DATA_DIR,
    ) -> Path:
        """`runs/data/<env-short>-<kind>[-<counts>][-seed<S>].npz`: the counts
        suffix appears when they differ from the recipe's, the seed when not 0."""
        stem = f"{self.env_short}-{self.kind}"
        if counts is not None and dict(counts) != dict(self.counts):
            stem += "-" + "-".join(f"{n}{t[0]}" for t, n in counts.items())
        if seed:
            stem += f"-seed{seed}"
        return Path(root) / f"{stem}{EXTENSION}"


def env_short(env_id: str) -> str:
    """`"smax:3m"` → `"smax-3m"`."""
    return env_id.replace(":", "-", 1)


def _env_from_short(name: str) -> Optional[str]:
    if name in RECIPE_ENVS:
        return RECIPE_ENVS[name]
    known = envs.list()
    if name in known:
        return name
    if "-" in name:
        candidate = name.replace("-", ":", 1)
        if candidate in known:
            return candidate
    return None


def _suffixes(kind: str) -> tuple[str, bool, Optional[float]]:
    """`"misodice-200e-1000p-greedy-dart0.8"` → `("misodice-200e-1000p", True,
    0.8)`; σ is None without a `-dart<σ>` suffix."""
    m = _SUFFIXES.match(kind)
    if m is None:
        return kind, False, None
    sigma = None if m["sigma"] is None else float(m["sigma"])
    return m["base"], m["greedy"] is not None, sigma


def _kind(kind: str) -> Optional[tuple[tuple[tuple[str, int], ...], str]]:
    if kind in KINDS:
        return KINDS[kind]
    m = _MIX.match(kind)
    if not m:
        return None
    counts: dict[str, int] = {}
    for group in m.group(1).strip("-").split("-"):
        tier = _LETTER[group[-1]]
        if tier in counts:
            return None
        counts[tier] = int(group[:-1])
    if not any(counts.values()):
        return None
    desc = " + ".join(f"{n} {t}" for t, n in counts.items()) + " trajectories, shuffled"
    return tuple(counts.items()), desc


def list_recipes() -> list[Recipe]:
    """The published recipes: every kind on every environment of
    `RECIPE_ENVS` (`mix-...` names are built on demand)."""
    return [
        Recipe(env_id, kind, counts, desc)
        for env_id in RECIPE_ENVS.values()
        for kind, (counts, desc) in KINDS.items()
    ]


def get_recipe(name: Union[str, Recipe]) -> Recipe:
    """Parse `"<env-short>/<kind>"` (or `"<env-id>/<kind>"`).

    Raises:
      KeyError: unknown environment or kind; the message lists close matches.
    """
    if isinstance(name, Recipe):
        return name
    names = [r.name for r in list_recipes()]
    env_part, sep, kind = str(name).partition("/")
    env_id = _env_from_short(env_part) if sep else None
    base, greedy, sigma = _suffixes(kind)
    if env_id and sigma is not None and sigma <= 0:
        plain = kind[:kind.rindex("-dart")]
        raise KeyError(f"recipe {str(name)!r}: -dart needs a noise level > 0 (e.g. "
                       f"{env_part}/{plain}-dart0.8); without noise use {env_part}/{plain}")
    found = _kind(base) if env_id else None
    if env_id is None or found is None:
        close = difflib.get_close_matches(str(name), names, n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        if not sep:
            why = "recipe names look like '<env-short>/<recipe>', e.g. 'smax-3m/misodice-200e-1000p'"
        elif env_id is None:
            why = f"unknown environment {env_part!r}"
        else:
            why = (f"unknown recipe {base!r} (kinds: {', '.join(KINDS)}, or "
                   f"mix-<n><e|m|p|r>-..., e.g. mix-200e-1000p; any of them + "
                   f"[-greedy][-dart<σ>])")
        raise KeyError(f"unknown recipe {str(name)!r}: {why}.{hint} "
                       f"`jaxil data list` shows all recipes.")
    counts, desc = found
    if greedy:
        desc += "; the expert acts on its teacher's greedy / mean action"
    if sigma:
        desc += f"; DART: executed actions noised with σ = {sigma:g} of the box width"
    return Recipe(env_id, kind, counts, desc, sigma or 0.0, greedy)


def episode_seeds(seed: int, total: int) -> np.ndarray:
    """The distinct per-episode seeds (in `[0, 2**31)`) a build collects with."""
    if int(seed) < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return np.random.default_rng([int(seed), _BUILD_SALT]).choice(
        MAX_SEED, size=total, replace=False
    ).astype(np.int64)


def _portable(d: Any) -> Any:
    """Paths under the working directory become relative (stable metadata)."""
    if isinstance(d, dict):
        return {k: _portable(v) for k, v in d.items()}
    if isinstance(d, str) and os.path.isabs(d):
        try:
            rel = os.path.relpath(d)
        except ValueError:
            return d
        return d if rel.startswith("..") else rel
    return d


def build(
    recipe: Union[str, Recipe],
    seed: int = 0,
    out_path: Optional[Union[str, os.PathLike]] = None,
    teacher_dir: Optional[Union[str, os.PathLike]] = None,
    progress: bool = True,
    *,
    scale: float = 1.0,
    counts: Optional[Mapping[str, int]] = None,
    env_kwargs: Optional[Mapping[str, Any]] = None,
    epsilons: Optional[Mapping[str, float]] = None,
    discover_teachers: bool = True,
    chunk_size: int = DEFAULT_CHUNK,
    measure_episodes: int = 128,
    shuffle: bool = True,
) -> Dataset:
    """Collect a recipe's dataset; write it to `out_path` if given.

    Args:
      recipe: a recipe name (`"smax-3m/misodice-200e-1000p"`) or
        [`Recipe`][jaxil.collect.recipes.Recipe].
      seed: the build seed (>= 0); same arguments and seed → identical data.
      out_path: where to [`jaxil.data.save`][jaxil.data.format.save] it (atomic; checked
        writable before the collection); a sidecar `<stem>.tiers.json` gets
        the tier measurements and wall times.
      teacher_dir: take the tiers from this teacher run (see
        [`jaxil.collect.zoo.make_zoo`][jaxil.collect.zoo.make_zoo]); None looks one up.
      progress: show a tqdm bar over the episodes collected.
      scale: multiply every count (rounded, at least 1), for small versions.
      counts: per-tier count overrides, e.g. `{"expert": 4, "poor": 8}`.
      env_kwargs: [`envs.make`][jaxil.envs.registry.make] overrides (e.g.
        `{"max_steps": 10}`); `None` takes the teacher's own (see
        [`make_zoo`][jaxil.collect.zoo.make_zoo]), `{}` the defaults.
      epsilons: ε of the noised-expert tiers, e.g. `{"medium": 0.2}` (defaults:
        [`jaxil.collect.zoo.tier_epsilons`][jaxil.collect.zoo.tier_epsilons]).
      discover_teachers: with `teacher_dir=None`, look for a trained
        teacher; False forces the scripted expert.
      chunk_size: episodes per compiled call (one compile per policy program).
      measure_episodes: episodes per tier for
        [`measure_tiers`][jaxil.collect.zoo.measure_tiers] (all four tiers,
        stored in the creation args); 0 skips it.
      shuffle: shuffle the trajectories (seeded by `seed`).

    Returns:
      The validated [`Dataset`][jaxil.data.format.Dataset].
    """
    t_start = time.perf_counter()
    r = get_recipe(recipe)
    n = r.resolve_counts(scale, counts)
    if isinstance(measure_episodes, bool) or int(measure_episodes) != measure_episodes \
            or measure_episodes < 0:
        raise ValueError(f"measure_episodes must be an integer >= 0, got {measure_episodes}")
    if isinstance(chunk_size, bool) or int(chunk_size) != chunk_size or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size}")
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed}")
    if out_path is not None:  # before the collection, not after it
        check_file_writable(out_path, "out_path")
        check_file_writable(sidecar_path(out_path), "out_path's sidecar")
    zoo = make_zoo(r.env_id, env_kwargs=env_kwargs, teacher_dir=teacher_dir,
                   discover=discover_teachers, epsilons=epsilons,
                   greedy_expert=r.greedy_expert)
    env_kwargs = zoo.env_kwargs
    if r.action_noise and zoo.spec.discrete:
        raise ValueError(f"recipe {r.name}: -dart (executed-action noise) needs a box action "
                         f"space, and {r.env_id} has discrete actions; drop the -dart suffix")
    total = sum(n.values())
    if out_path is not None:
        check_free_space(out_path, size_bound(zoo.spec, total))
    seeds = episode_seeds(seed, total)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total + (measure_episodes * len(TIERS)), unit="ep",
                   desc=r.name, dynamic_ncols=True)
    parts, off, timings = [], 0, {}
    try:
        for tier, count in n.items():
            t0 = time.perf_counter()
            if bar is not None:
                bar.set_postfix_str(f"{tier}: {zoo[tier].source}")
            block = seeds[off:off + count]
            off += count
            eps = zoo.collect(tier, block, chunk_size, bar, action_noise=r.action_noise)
            parts.append(Dataset.from_episodes(
                eps, zoo.spec, tier=tier, source=zoo[tier].source, seed=block,
                expert=(tier == "expert"), check=False))
            timings[f"collect_{tier}_s"] = time.perf_counter() - t0
        measured = None
        if measure_episodes:
            t0 = time.perf_counter()
            if bar is not None:
                bar.set_postfix_str("measuring tiers")
            measured = measure_tiers(r.env_id, zoo=zoo, num_episodes=measure_episodes,
                                     seed=seed, chunk_size=chunk_size, progress=bar)
            timings["measure_s"] = time.perf_counter() - t0
    finally:
        if bar is not None:
            bar.close()
    ds = concatenate(parts)
    if shuffle:
        perm = np.random.default_rng([int(seed), _SHUFFLE_SALT]).permutation(len(ds))
        ds = ds.select(perm)
    args = dict(
        # The builder's recorded name is part of every file's bytes. It stays
        # the name recipe files have always recorded, so a recipe builds the
        # same bytes whatever the package layout (this function is
        # jaxil.collect.recipes.build).
        builder="jaxil.data.recipes.build",
        recipe=r.name,
        env_id=r.env_id,
        env_kwargs=env_kwargs,
        seed=int(seed),
        scale=float(scale),
        recipe_counts=dict(r.counts),
        counts=n,
        chunk_size=int(chunk_size),
        shuffle=bool(shuffle),
        episode_seeds=(f"numpy default_rng([seed, {_BUILD_SALT:#x}]).choice(2**31, {total}, "
                       f"replace=False), in tier order; episode = envs.run_episodes(env, "
                       f"zoo[tier].policy, zoo[tier].params, PRNGKey(seed_i), 1)"),
        zoo=_portable(zoo.describe()),
        tier_measurements=measured,
    )
    if r.greedy_expert:  # absent otherwise, like action_noise below
        args["greedy_expert"] = ("the expert tier acts on its teacher's greedy (discrete) or mean "
                                 "(box) action; the other tiers as in the plain recipe")
    if r.action_noise:  # absent otherwise, so a noise-free build's bytes do not depend on it
        args["action_noise"] = dict(
            sigma=r.action_noise, wrapper="envs.ActionNoise",
            semantics="executed action = clip(recorded action + sigma * (high - low) * N(0, 1)); "
                      "tier_measurements are noise-free")
    info = dataclasses.replace(ds.info, recipe=r.name, creation_args_json=canonical_json(args))
    ds = ds.replace(info=info).validate()
    if out_path is not None:
        t0 = time.perf_counter()
        path = save(ds, out_path)
        timings["save_s"] = time.perf_counter() - t0
        timings["total_s"] = time.perf_counter() - t_start
        side = dict(recipe=r.name, dataset=path.name, seed=int(seed), counts=n,
                    zoo=args["zoo"], tier_measurements=measured, wall_times=timings,
                    summary=ds.summary())
        atomic_write_text(sidecar_path(path), json.dumps(side, indent=2, sort_keys=True) + "\n")
    return ds


def sidecar_path(path: Union[str, os.PathLike]) -> Path:
    """`x.npz` → `x.tiers.json` (tier measurements and wall times)."""
    p = Path(path)
    return p.with_name(p.name[: -len(p.suffix)] + ".tiers.json" if p.suffix else p.name + ".tiers.json")


def load_dataset(arg: str, seed: int = 0):
    """A dataset path, or a recipe name that is built (once) under runs/data/."""


    path = dataset_path(arg, seed)
    if not path.exists():
        build(get_recipe(arg), seed=seed, out_path=path)
    return load(path)


def dataset_path(arg: str, seed: int = 0) -> Path:
    """Where `load_dataset(arg, seed)` reads: `arg` itself when it is a
    file, else the recipe's file under runs/data/ (which may not exist yet)."""

    p = Path(arg)
    if p.exists():
        return p
    try:
        recipe = get_recipe(arg)
    except KeyError as e:
        raise FileNotFoundError(f"--dataset {arg!r} is not a file, and {e.args[0]}") from None
    return recipe.default_path(seed)
