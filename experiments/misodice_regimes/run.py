"""Where MisoDICE beats BC, and why: a study of data regimes.

MisoDICE, MisoDICE-VDN, INDD, BC(D_E) and BC(D_U), with the library's
defaults (slow ν, s0 uniform over trajectories, censored box head), over

- the number of expert trajectories: 10, 25, 50, 100, 200, with 1000 others;
- what the others are (``source``):
  ``noisy``   the ε-noised expert of today's ``misodice-200e-1000p`` (the
              zoo's ``poor`` tier: ε = 0.85 per agent and step);
  ``teacher`` early and mid checkpoints of a MAPPO run, 500 of each: the
              checkpoints whose stochastic evaluation lies nearest 0.15 in
              the zoo's poor band and nearest 0.55 in its medium band
              (``jaxil.collect.zoo.CHECKPOINT_BANDS``), normalised by the
              expert and random tiers of the pool;
  ``random``  the uniform policy;
- ground-truth expert labels, and Phase-1 labels (O-MAPL on ``--p1-queries``
  preferences of a ground-truth oracle that flips ``--p1-flip`` of them, top-K
  with K = the true expert count) on the cells of ``--p1-cells``;
- training length: a learning curve, evaluated at ``--points``.

Per environment ONE pool is collected (200 expert + 1000 of each source) and
every cell selects from it: the first n of a seeded permutation of the 200
experts (so the cells are nested) plus all 1000 of the source, shuffled. The
selection is recorded in ``results.json``. The shipped MAPPO teachers of SMAX
3m and 2s3z have no checkpoint in the poor or medium band (their first
checkpoint already scores 0.91 / 0.98 normalised), so the ``teacher`` source
comes from a short MAPPO run of the same preset, trained here until a
checkpoint passes the medium band (``runs/experiments/misodice_regimes/
teachers/<env>``; not under ``runs/teachers``, so the zoo never picks it up).
LevelBasedForaging has no shipped teacher: its expert is the scripted BFS
expert, and its ``teacher`` source is likewise a short MAPPO run (jaxil's LBF
preset, 5 updates per chunk).

For the DICE learners every evaluation also records, on fixed batches of the
cell's data, the normalised policy weights (largest, effective sample size,
the share of weight on true expert transitions) and the discriminator's AUC
for true expert vs other transitions
(:func:`jaxil.algorithms.offline.diagnostics.dice_diagnostics`).

BC(D_E) reads only the expert transitions, so it is trained once per
(environment, expert count, labels) and shared by the sources with the same
expert set.

    python experiments/misodice_regimes/run.py --quick          # smoke test, minutes
    python experiments/misodice_regimes/run.py                  # CPU size (see README for the time)
    python experiments/misodice_regimes/run.py --scale gpu      # 256-256, batch 512, 20k updates
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Optional

import jax
import numpy as np

HERE = Path(__file__).resolve().parent

from jaxil import envs  # noqa: E402
from jaxil.runs import engine  # noqa: E402
from jaxil.data import load, save  # noqa: E402
from jaxil.data.format import Dataset, concatenate  # noqa: E402
from jaxil.collect.recipes import build as build_recipe, sidecar_path  # noqa: E402
from jaxil.collect.zoo import (CHECKPOINT_BANDS, TierPolicy, Zoo, noisy_params,  # noqa: E402
                            noisy_policy)
from jaxil.algorithms.offline import LearnerData, make_learner  # noqa: E402
from jaxil.algorithms.offline.diagnostics import dice_diagnostics, diagnostic_batches  # noqa: E402
from jaxil.data.preferences import dataset_id  # noqa: E402
from jaxil.runs.result_cache import ResultCache  # noqa: E402
from jaxil.algorithms.offline.train import chunk_fn, expand_grid, init_runs  # noqa: E402
from jaxil.collect.comparison import ALGOS, LABELS, VARIANTS as TABLE_VARIANTS  # noqa: E402

ENVS = ("smax-3m", "smax-2s3z", "jumanji-LevelBasedForaging-v0")
SOURCES = ("noisy", "teacher", "random")
EXPERT_COUNTS = (10, 25, 50, 100, 200)
DICE = ("indd", "misodice_vdn", "misodice", "misodice_strat")
#: ``--intervention`` rows: a learner of the study with one setting changed,
#: to test the sample-starvation reading of the diagnostics (README).
VARIANTS = {
    **TABLE_VARIANTS,
    "bc_expert_b4": ("bc_expert", dict(batch_size=4), "BC(D_E), batch 4"),
}
INTERVENTION = ("bc_expert", "bc_expert_b4", "misodice", "misodice_strat")


def label(algo: str) -> str:
    return VARIANTS[algo][2] if algo in VARIANTS else LABELS[algo]
RUNS = Path("runs/experiments/misodice_regimes")
_SUBSAMPLE_SALT = 0x72656769  # "regi"
_TEACHER_SEED_SALT = 0x74636872  # "tchr"


# ----------------------------------------------------------------------------- the pool


def shipped_teacher(env_id: str) -> Optional[Path]:
    from jaxil.teachers import shipped_teachers

    return shipped_teachers().get(env_id)


def base_pool(env: str, args) -> tuple[Dataset, dict]:
    """200 expert + 1000 ``noisy`` (the zoo's poor tier) + 1000 random, built
    with :func:`jaxil.collect.recipes.build` (the shipped teacher pinned on SMAX,
    the scripted expert on LBF), and the measured tier returns."""
    from jaxil.collect.recipes import get_recipe

    recipe = get_recipe(f"{env}/mix-{args.experts}e-{args.others}p-{args.others}r")
    out = RUNS / args.tag / "data" / f"{env}-base.npz"
    if not out.exists():
        t = shipped_teacher(recipe.env_id)
        build_recipe(recipe, seed=args.data_seed, out_path=out, teacher_dir=t,
                     discover_teachers=False, measure_episodes=args.measure_episodes,
                     progress=True)
    side = json.loads(sidecar_path(out).read_text())
    tiers = {k: v["mean_return"] for k, v in side["tier_measurements"]["tiers"].items()}
    return load(out), dict(tiers=tiers, zoo=side["zoo"], path=str(out))


def teacher_run(env_id: str, ref: dict, args) -> dict:
    """A short MAPPO run of jaxil's preset for ``env_id``, trained chunk by
    chunk (resumed bit-for-bit) until a checkpoint's stochastic evaluation
    passes the medium band (normalised by ``ref``'s expert and random tiers)
    or ``--teacher-max-chunks``; every chunk is a checkpoint. Returns
    ``{dir, checkpoints: [{step, return, normalised}], ...}``."""
    from jaxil.teachers.train import train_teacher
    from jaxil.teachers.presets import preset

    over = dict(updates_per_chunk=5) if env_id.startswith("jumanji") else {}
    if args.quick:
        over = dict(num_envs=8, num_steps=32, updates_per_chunk=1,
                    total_timesteps=8 * 32 * args.teacher_max_chunks)
    cfg = preset(env_id, **over)
    out = RUNS / args.tag / "teachers" / env_id.replace(":", "_")
    hi = CHECKPOINT_BANDS["medium"][1]
    norm = lambda r: (r - ref["random"]) / (ref["expert"] - ref["random"])  # noqa: E731
    done_chunks, doc = 0, None
    while done_chunks < min(args.teacher_max_chunks, cfg.num_chunks):
        done_chunks = min(done_chunks + args.teacher_step_chunks, args.teacher_max_chunks,
                          cfg.num_chunks)
        doc = train_teacher(env_id, cfg, seed=0, out_dir=str(out),
                            num_checkpoints=cfg.num_chunks, eval_episodes=args.teacher_eval_episodes,
                            resume=True, stop_after_chunks=done_chunks, progress=False)
        last = doc["checkpoints"][-1]
        score = norm(last["eval_stochastic"]["return_mean"])
        print(f"  teacher {env_id}: {last['step']} steps, normalised {score:.2f}", flush=True)
        if score > hi:
            break
    ckpts = [dict(step=int(c["step"]), ret=float(c["eval_stochastic"]["return_mean"]),
                  normalised=float(norm(c["eval_stochastic"]["return_mean"])))
             for c in doc["checkpoints"]]
    return dict(dir=str(out), config=cfg.to_dict(), checkpoints=ckpts,
                wall_time_s=doc.get("wall_time_s"))


def pick_checkpoint(ckpts: list[dict], tier: str) -> tuple[dict, bool]:
    """The checkpoint of ``tier``'s band nearest its target (lowest step on
    a tie), as the zoo picks; outside every band, the nearest to the target
    (and False)."""
    lo, hi, target = CHECKPOINT_BANDS[tier]
    inside = [c for c in ckpts if lo <= c["normalised"] <= hi]
    pool = inside or ckpts
    best = min(pool, key=lambda c: (abs(c["normalised"] - target), c["step"]))
    return best, bool(inside)


def teacher_part(env_id: str, run: dict, seeds: np.ndarray, count: int) -> tuple[Dataset, dict]:
    """``count`` trajectories of the mid checkpoint and ``count`` of the
    early one (tiers ``medium`` and ``poor``, source ``regimes-mappo:<env>@step``)."""
    from jaxil.teachers.io import load_checkpoint

    env = envs.make(env_id)
    chosen, tiers = {}, {}
    for tier in ("medium", "poor"):
        c, in_band = pick_checkpoint(run["checkpoints"], tier)
        base, params, _, digest = load_checkpoint(run["dir"], step=c["step"])
        src = f"regimes-mappo:{env_id}@{c['step']}"
        tiers[tier] = TierPolicy(tier, src, noisy_policy(base, env.spec), noisy_params(params, 0.0),
                                 dict(kind="teacher-checkpoint", step=c["step"]), "regimes-mappo")
        chosen[tier] = dict(c, in_band=in_band, source=src, params_sha256=digest)
    zoo = Zoo(env_id, {}, env, tiers)
    parts = []
    for i, tier in enumerate(("medium", "poor")):
        block = seeds[i * count:(i + 1) * count]
        eps = zoo.collect(tier, block)
        parts.append(Dataset.from_episodes(eps, env.spec, tier=tier, source=tiers[tier].source,
                                           seed=block, expert=False, check=False))
        chosen[tier]["measured_return"] = float(np.mean(parts[-1].episode_return))
    return concatenate(parts), chosen


def make_pool(env: str, args) -> tuple[Dataset, dict]:
    """The environment's pool and its description: ``groups`` (pool indices
    of the expert trajectories and of each source's), tier returns, the
    teacher run and the checkpoints chosen. Cached under ``runs/``."""
    path = RUNS / args.tag / "data" / f"{env}-pool.npz"
    meta_path = path.with_suffix(".json")
    if path.exists() and meta_path.exists():
        return load(path), json.loads(meta_path.read_text())
    base, info = base_pool(env, args)
    env_id = base.spec.env_id
    ref = info["tiers"]
    run = teacher_run(env_id, ref, args)
    # Episode seeds of the teacher part: disjoint from the base build's.
    rng = np.random.default_rng([args.data_seed, _TEACHER_SEED_SALT])
    taken = set(np.asarray(base.seed).tolist())
    cand = rng.choice(2**31, size=2 * args.others + len(taken), replace=False)
    seeds = np.array([s for s in cand if s not in taken][:2 * args.others], np.int64)
    part, chosen = teacher_part(env_id, run, seeds, args.others // 2 + args.others % 2)
    part = part.select(np.arange(args.others))  # exactly --others teacher trajectories
    pool = concatenate([base, part]).validate()
    tier = np.asarray(pool.info.tier_names)[pool.tier]
    src = np.asarray(pool.info.source_names)[pool.source]
    is_teacher = np.array([s.startswith("regimes-mappo:") for s in src])
    groups = dict(expert=np.flatnonzero(pool.expert),
                  noisy=np.flatnonzero((tier == "poor") & ~is_teacher),
                  teacher=np.flatnonzero(is_teacher),
                  random=np.flatnonzero(tier == "random"))
    for g, idx in groups.items():
        want = args.experts if g == "expert" else args.others
        if len(idx) != want:
            raise RuntimeError(f"{env}: the pool has {len(idx)} {g} trajectories, expected {want}")
    ret = np.asarray(pool.episode_return)
    meta = dict(env=env, env_id=env_id, tiers=ref, zoo=info["zoo"], teacher_run=run,
                teacher_checkpoints=chosen, groups={g: v.tolist() for g, v in groups.items()},
                group_returns={g: [float(ret[v].mean()), float(ret[v].std())]
                               for g, v in groups.items()},
                group_normalised={g: float((ret[v].mean() - ref["random"])
                                           / (ref["expert"] - ref["random"]))
                                  for g, v in groups.items()},
                pool_id=dataset_id(pool))
    save(pool, path)
    meta_path.write_text(json.dumps(meta, indent=1))
    return pool, meta


def expert_order(num_experts: int, data_seed: int) -> np.ndarray:
    """The seeded permutation of the pool's experts; a cell with n experts
    takes its first n (cells are nested: 10 ⊂ 25 ⊂ ... ⊂ 200)."""
    return np.random.default_rng([int(data_seed), _SUBSAMPLE_SALT]).permutation(num_experts)


def cell_indices(groups: dict, n_expert: int, source: str, data_seed: int) -> np.ndarray:
    """Pool indices of a cell: ``n_expert`` experts (the first of
    :func:`expert_order`) and every trajectory of ``source``, shuffled
    (seeded by the data seed, the count and the source)."""
    experts = np.asarray(groups["expert"])
    if not 1 <= n_expert <= len(experts):
        raise ValueError(f"a cell needs 1..{len(experts)} experts, got {n_expert}")
    chosen = experts[expert_order(len(experts), data_seed)[:n_expert]]
    idx = np.concatenate([chosen, np.asarray(groups[source])])
    perm = np.random.default_rng([int(data_seed), n_expert, SOURCES.index(source)]).permutation(len(idx))
    return idx[perm]


# ----------------------------------------------------------------------------- training


def make_cell_learner(algo: str, spec, args):
    """The learner of a row: the library's defaults (``init_sampling``,
    ``reward``, ``lr_critic``, box head) with only size settings given, and
    for a :data:`VARIANTS` row its one changed setting."""
    base, changed, _ = VARIANTS.get(algo, (algo, {}, None))
    kw = dict(dict(hidden=tuple(args.hidden), batch_size=args.batch_size), **changed)
    return make_learner(base, spec, **kw)


def evaluator(learner, env, episodes: int):
    """Jitted ``(params [R], key) -> Episodes`` of the learner's stochastic
    policy. Compiled once per policy network structure (every learner's
    policy is a :class:`jaxil.nn.policy.PolicyNet` under ``params["policy"]``),
    not once per learner."""
    return _evaluator(env, learner.config.hidden, learner.config.shared, episodes)


@functools.lru_cache(maxsize=16)
def _evaluator(env, hidden: tuple, shared: bool, episodes: int):
    from jaxil.nn.policy import PolicyNet

    policy = PolicyNet(env.spec, hidden, shared).policy(False, key="policy")
    return jax.jit(jax.vmap(lambda p, k: envs.run_episodes(env, policy, p, k, episodes),
                            in_axes=(0, None)))


def train_row(learner, env, data: LearnerData, args, points: list, diag=None) -> dict:
    """``--seeds`` runs of ``learner`` in one program (seeds vmapped) run by
    the engine: chunks of ``--chunk`` fused updates, evaluated (and
    diagnosed, for DICE: ``diag(states) -> {name: [R]}``) at each of
    ``points``. The evaluation keys depend only on the update, so every
    learner meets the same episodes at the same point."""
    if any(u % args.chunk for u in points):
        raise ValueError(f"every evaluation point must be a multiple of --chunk {args.chunk}, "
                         f"got {points}")
    runs = expand_grid({}, args.seeds)
    step = chunk_fn(learner, args.chunk)
    episodes = evaluator(learner, env, args.eval_episodes)

    def evaluate(states, c):
        key = jax.random.fold_in(jax.random.PRNGKey(args.seed + 10_000), (c + 1) * args.chunk)
        ep = episodes(states.params, key)
        ret, won = (np.asarray(x, np.float64) for x in jax.device_get((ep.episode_return, ep.won)))
        out = {"eval_return": ret, "eval_win_rate": won}
        if diag is not None:
            out.update({f"diag/{k}": v for k, v in diag(states).items()})
        return out

    result = engine.run(engine.Program(
        name=learner.name, step_key="update", num_chunks=points[-1] // args.chunk,
        steps_per_chunk=args.chunk, step_unit=args.chunk,
        run_ids=[dict(run=r.index, seed=r.seed) for r in runs],
        run_labels=[f"seed {r.seed}" for r in runs],
        init=lambda: init_runs(learner, runs, args.seed),
        chunk=lambda states, c: step(states, data), evaluate=evaluate,
        eval_chunks=[u // args.chunk for u in points]), progress=False)
    curve = []
    for u in points:
        at = sorted((r for r in result.rows if r["update"] == u), key=lambda r: r["run"])
        names = [k for k in at[0] if k not in ("update", "run", "seed", "eval_return",
                                               "eval_win_rate") and not k.startswith("diag/")]
        point = dict(update=u, returns=[r["eval_return"] for r in at],
                     wins=[r["eval_win_rate"] for r in at],
                     metrics={k: [r[k] for r in at] for k in names})
        if diag is not None:
            point["diag"] = [{k.removeprefix("diag/"): v for k, v in r.items()
                              if k.startswith("diag/")} for r in at]
        curve.append(point)
    return dict(curve=curve, seconds=result.summary["wall_seconds"])


# ----------------------------------------------------------------------------- Phase 1


def phase1_labels(cell: Dataset, n_expert: int, args) -> tuple[np.ndarray, dict]:
    """O-MAPL labels of ``cell``: the top ``n_expert`` trajectories by learned
    return, from ``--p1-queries`` whole-trajectory queries answered by the
    ground-truth oracle with ``--p1-flip`` of the answers flipped."""
    from jaxil.algorithms.labelling.oracles import GroundTruthOracle
    from jaxil.algorithms.labelling.pipeline import phase1

    out = phase1(cell, GroundTruthOracle(flip_rate=args.p1_flip, seed=args.seed),
                 queries=args.p1_queries, top_k=n_expert, seeds=args.p1_seeds,
                 updates=args.p1_updates, seed=args.seed, progress=False,
                 hidden=tuple(args.hidden), batch_size=8)
    return out.labels, dict(metrics=out.metrics, per_seed=out.per_seed, seconds=out.fit_seconds)


# ----------------------------------------------------------------------------- the plan


def plan(args) -> list[tuple]:
    """Every row of the study as ``(tier, env, source, experts, labels, algo)``,
    in the order they run (so a ``--budget-min`` cut leaves the most useful
    part done), environments interleaved within each tier:

    A. the scarce-expert teacher cells (≤ 25 experts): BC(D_E) and MisoDICE
       (the pair the issue's criterion compares), and on the scarcest
       (``--long-cell``) BC(D_U), VDN and INDD; the ``--long-cell`` rows of
       BC(D_E) and MisoDICE train to ``--long-points`` (``labels`` then
       ends in ``+long``), the others to ``--points``;
    B. Phase-1 labels on ``--p1-cells``: BC(D_E) and MisoDICE;
    C. the rest of the heatmap (MisoDICE, BC(D_E)): scarce counts first;
    D. BC(D_U), VDN and INDD on every cell that lacks them, most experts
       first; then VDN and INDD on the Phase-1 cells.
    """
    scarce = [n for n in args.expert_counts if n <= 25]
    if args.intervention:  # E. only the intervention rows, on the scarce teacher cells
        return [("E", env, "teacher", n, "ground_truth", a) for env in args.envs
                for n in scarce for a in INTERVENTION]
    cells = [(s, n) for n in args.expert_counts for s in args.sources]
    a_cells = [("teacher", n) for n in scarce if "teacher" in args.sources]
    rest = [c for c in cells if c not in a_cells]
    rest.sort(key=lambda c: (c[1] > 25, c[1], args.sources.index(c[0])))
    long_cell = args.long_cell
    tasks = []
    for env in args.envs:
        for s, n in a_cells:
            if (s, n) == long_cell:
                tasks += [("A", env, s, n, "ground_truth+long", a) for a in ("bc_expert", "misodice")]
                tasks += [("A", env, s, n, "ground_truth", a) for a in
                          ("bc_union", "misodice_vdn", "indd")]
            else:
                tasks += [("A", env, s, n, "ground_truth", a) for a in ("bc_expert", "misodice")]
    for env in args.envs:
        for s, n in args.p1_cells:
            tasks += [("B", env, s, n, "phase1", a) for a in ("bc_expert", "misodice")]
    for s, n in rest:
        for env in args.envs:
            tasks += [("C", env, s, n, "ground_truth", a) for a in ("bc_expert", "misodice")]
    # D: the most experts first (200 with 1000 others is the paper's own
    # setting, where its ordering of all five learners is claimed), then
    # the Phase-1 cells (whose labels, not the learner, decide those rows).
    d_cells = sorted(a_cells + rest, key=lambda c: (-c[1], SOURCES.index(c[0])))
    for s, n in d_cells:
        for env in args.envs:
            tasks += [("D", env, s, n, "ground_truth", a) for a in
                      ("bc_union", "misodice_vdn", "indd") if not (
                          (s, n) == long_cell and a != "bc_expert")]
    for env in args.envs:
        for s, n in args.p1_cells:
            tasks += [("D", env, s, n, "phase1", a) for a in ("misodice_vdn", "indd")]
    return tasks


def bc_expert_owner(args) -> str:
    """The source whose cell trains the ground-truth BC(D_E) of an expert
    count (BC(D_E) reads only the expert transitions; the others share it)."""
    return "teacher" if "teacher" in args.sources else args.sources[0]


class Env:
    """One environment's pool, result cache and the cell in memory."""

    def __init__(self, env: str, args):
        self.name = env
        self.pool, self.meta = make_pool(env, args)
        self.env = envs.make(self.meta["env_id"])
        self.spec = self.pool.spec
        settings = dict({k: getattr(args, k) for k in (
            "seeds", "points", "long_points", "chunk", "eval_episodes", "batch_size", "hidden",
            "seed", "data_seed", "diag_groups")}, pool=self.meta["pool_id"])
        p1 = dict(settings, **{k: getattr(args, k) for k in ("p1_queries", "p1_flip", "p1_seeds",
                                                               "p1_updates")})
        self.cache = ResultCache(RUNS / args.tag / f"cache-{env}.json", p1,
                                 {"row:": tuple(settings), "p1:": tuple(p1)})
        self._cell = (None, None)
        self.args = args
        if args.reuse is not None:
            n = reuse_rows(self.cache, args.reuse, env, self.meta["pool_id"], {**settings, **p1},
                           args)
            print(f"{env}: {n} rows taken from --reuse", flush=True)

    def cell(self, source: str, n: int, labels: str):
        """``(data, diagnostic batches, their true expert flags, Phase-1 info)``."""
        key = (source, n, labels)
        if self._cell[0] == key:
            return self._cell[1]
        self._cell = (None, None)
        args = self.args
        cell = self.pool.select(cell_indices(self.meta["groups"], n, source, args.data_seed))
        truth = np.asarray(cell.expert, bool)
        p1 = None
        flags = truth
        if labels == "phase1":
            k = f"p1:{source}:{n}"
            if "labels" not in (self.cache.get(k) or {}):  # absent, or --reuse'd metrics only
                lab, info = phase1_labels(cell, n, args)
                self.cache.put(k, dict(info, labels=lab.tolist()))
            p1 = self.cache.get(k)
            flags = np.asarray(p1["labels"], bool)
            print(f"{self.name} {source} {n}e Phase-1 labels: precision "
                  f"{p1['metrics']['precision']:.2f} ({p1['seconds']:.0f}s)", flush=True)
        data = LearnerData.from_dataset(cell, flags)
        trans_truth = truth[np.asarray(data.union.traj_index)]
        batches, btruth = diagnostic_batches(data, trans_truth, args.diag_groups, args.batch_size)
        self._cell = (key, (data, batches, btruth, p1))
        return self._cell[1]

    def row(self, source: str, n: int, labels: str, algo: str) -> dict:
        args = self.args
        key = row_key(args, source, n, labels, algo)
        owner = key.split(":")[1]
        long = key.split(":")[3].endswith("+long")
        labels = labels.removesuffix("+long")
        if self.cache.get(key) is None:
            data, batches, btruth, _ = self.cell(owner, n, labels)
            learner = make_cell_learner(algo, self.spec, args)
            diag = None
            if algo in DICE:
                def diag(states, learner=learner, batches=batches, truth=btruth):
                    return dice_diagnostics(learner, states.params, states.hparams, batches,
                                            truth)
            if algo == "bc_union":
                data = LearnerData(union=data.union, expert=None)
            self.cache.put(key, train_row(learner, self.env, data, args,
                                          args.long_points if long else args.points, diag))
            # Every row compiles its own programs; kept, they filled 24 GiB
            # after about 90 rows (LLVM "Cannot allocate memory").
            jax.clear_caches()
        row = dict(self.cache.get(key), env=self.meta["env_id"], source=source, experts=n,
                   labels=labels, algo=algo, shared_from=None if owner == source else owner,
                   long=long)
        if labels == "phase1":
            p1 = self.cache.get(f"p1:{source}:{n}")
            row["phase1"] = {k: p1[k] for k in ("metrics", "per_seed", "seconds")}
        return row


#: The keys ``Env.row`` adds to a cached row (the rest is ``train_row``'s).
ROW_FIELDS = ("env", "source", "experts", "labels", "algo", "shared_from", "long", "phase1")


def reuse_rows(cache: ResultCache, prev: dict, env: str, pool_id: str, settings: dict,
               args) -> int:
    """Put the rows of an earlier run's ``results.json`` (``--reuse``) for
    ``env`` into ``cache``, so that a fresh clone extends a committed grid
    instead of recomputing it (the caches under ``runs/`` are not
    committed). Rows already in the cache are kept. Exits with a one-line
    error when the earlier run used another pool or other settings, since
    its rows would then not be comparable with the new ones. Phase-1 rows
    bring their label metrics but not the labels; a new row on a Phase-1
    cell fits Phase 1 again. Returns the number of rows added."""
    res = prev.get("envs", {}).get(env)
    if res is None:
        return 0
    if res.get("pool_id") != pool_id:
        raise SystemExit(f"error: --reuse: the earlier run's {env} pool ({res.get('pool_id')}) is "
                         f"not this one ({pool_id}); build the pool with the earlier run's "
                         "settings or drop --reuse")
    for name, value in json.loads(json.dumps(settings)).items():
        old = res["pool_id"] if name == "pool" else prev.get(name, DEFAULTS.get(name))
        if old != value:
            raise SystemExit(f"error: --reuse: the earlier run used {name.replace('_', '-')} "
                             f"{old}, this one {value}; rerun with the earlier settings or drop "
                             "--reuse")
    added = 0
    for r in res["rows"]:
        labels = r["labels"] + ("+long" if r.get("long") else "")
        key = row_key(args, r["source"], r["experts"], labels, r["algo"])
        if cache.get(key) is None:
            cache.put(key, {k: v for k, v in r.items() if k not in ROW_FIELDS})
            added += 1
        pk = f"p1:{r['source']}:{r['experts']}"
        if r.get("phase1") and cache.get(pk) is None:
            cache.put(pk, dict(r["phase1"]))
    return added


def row_key(args, source: str, n: int, labels: str, algo: str) -> str:
    """The cache key of a row; ground-truth BC(D_E) is keyed by its owner
    source (:func:`bc_expert_owner`)."""
    owner = source
    if algo == "bc_expert" and labels.startswith("ground_truth"):
        owner = bc_expert_owner(args)
        if (owner, n) == args.long_cell:
            labels = "ground_truth+long"  # the long row serves every source of this count
    return f"row:{owner}:{n}:{labels}:{algo}"


def run_all(args) -> tuple[dict, list]:
    """Run the plan until it is done or ``--budget-min`` has passed (a row
    is not started after it); returns the results per environment and the
    tasks left out."""
    t0 = time.perf_counter()
    ctx = {env: Env(env, args) for env in args.envs}
    rows = {env: [] for env in args.envs}
    skipped = []
    for task in plan(args):
        tier, env, source, n, labels, algo = task
        cached = ctx[env].cache.get(row_key(args, source, n, labels, algo))
        if cached is None and args.budget_min and time.perf_counter() - t0 > 60 * args.budget_min:
            skipped.append(list(task))
            continue
        row = ctx[env].row(source, n, labels, algo)
        rows[env].append(row)
        fin = np.asarray(row["curve"][-1]["returns"])
        print(f"[{tier} {time.perf_counter() - t0:6.0f}s] {env:<30}{source:<8}{n:>4}e {labels:<13}"
              f"{label(algo):<13}{fin.mean():7.3f} ± {fin.std():.3f}  ({row['seconds']:.0f}s)",
              flush=True)
    results = {}
    for env, c in ctx.items():
        results[env] = dict(c.meta, rows=rows[env],
                            cells={f"{s}:{n}": cell_indices(c.meta["groups"], n, s,
                                                            args.data_seed).tolist()
                                   for s in args.sources for n in args.expert_counts},
                            expert_order=expert_order(len(c.meta["groups"]["expert"]),
                                                      args.data_seed).tolist())
    return results, skipped


# ----------------------------------------------------------------------------- outputs


def norm(x, ref) -> np.ndarray:
    return (np.asarray(x, np.float64) - ref["random"]) / (ref["expert"] - ref["random"])


COMPARE_AT: list = [None]  # the update every comparison reads (set by main)


def row_final(row: dict, ref: dict) -> np.ndarray:
    """Normalised return per seed at the comparison point (``--points``'s
    last: long rows are read there too, so every learner is compared after
    the same number of updates)."""
    at = [p for p in row["curve"] if p["update"] == COMPARE_AT[0]]
    return norm((at or row["curve"][-1:])[0]["returns"], ref)


def at_update(row: dict, update: int) -> Optional[dict]:
    return next((p for p in row["curve"] if p["update"] == update), None)


def lookup(rows: list[dict], source, n, labels, algo) -> Optional[dict]:
    for r in rows:
        if (r["source"], r["experts"], r["labels"], r["algo"]) == (source, n, labels, algo):
            return r
    return None


def verdict(m: np.ndarray, b: np.ndarray) -> dict:
    """MisoDICE (``m``) against BC(D_E) (``b``), per-seed normalised returns:
    the difference of means, both stds, and the two readings of "beats it
    outside one standard deviation": the difference exceeds the larger of
    the two stds (``beats_1std``), and the ±1-std intervals do not overlap
    (``beats_disjoint``)."""
    d = float(m.mean() - b.mean())
    sm, sb = float(m.std()), float(b.std())
    return dict(diff=d, std_misodice=sm, std_bc=sb, beats_1std=bool(d > max(sm, sb)),
                beats_disjoint=bool(m.mean() - sm > b.mean() + sb),
                worse_1std=bool(-d > max(sm, sb)))


def summarise(res: dict) -> dict:
    """Per environment: the MisoDICE − BC(D_E) grid, the ordering per cell,
    and the scarce-expert × teacher verdict."""
    ref, rows = res["tiers"], res["rows"]
    out = dict(grid={}, ordering={}, scarce_teacher={}, decline={})
    for r in rows:
        key = f"{r['source']}:{r['experts']}:{r['labels']}"
        fin = row_final(r, ref)
        curve = np.array([norm(p["returns"], ref).mean() for p in r["curve"]])
        out["decline"][f"{key}:{r['algo']}"] = dict(best=float(curve.max()), final=float(curve[-1]),
                                                    final_update=int(r["curve"][-1]["update"]),
                                                    best_at=int(r["curve"][int(curve.argmax())]["update"]),
                                                    final_std=float(fin.std()))
    keys = sorted({(r["source"], r["experts"], r["labels"]) for r in rows},
                  key=lambda k: (k[2], SOURCES.index(k[0]), k[1]))
    for s, n, lab in keys:
        m, b = lookup(rows, s, n, lab, "misodice"), lookup(rows, s, n, lab, "bc_expert")
        if m is None or b is None:
            continue
        v = verdict(row_final(m, ref), row_final(b, ref))
        out["grid"][f"{s}:{n}:{lab}"] = v
        means = {}
        for a in ALGOS:
            r = lookup(rows, s, n, "ground_truth" if a == "bc_union" else lab, a)
            if r is not None:
                means[a] = float(row_final(r, ref).mean())
        order = sorted(means, key=lambda a: -means[a])
        out["ordering"][f"{s}:{n}:{lab}"] = dict(means=means, order=order,
                                                 misodice_first=order[0] == "misodice")
        if s == "teacher" and n <= 25:
            out["scarce_teacher"][f"{n}:{lab}"] = v
    return out


def write_outputs(results: dict, out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(meta, envs=results), indent=1))
    lines = [f"# MisoDICE regimes ({meta['seeds']} seeds, updates {meta['points']}, hidden "
             f"{meta['hidden']}, batch {meta['batch_size']}, {meta['eval_episodes']} evaluation "
             "episodes per seed and point)\n",
             "Normalised return (0 = random, 1 = the expert tier of the pool), final evaluation, "
             "mean ± std over seeds. `Δ` = MisoDICE − BC(D_E); `*` where Δ exceeds both stds, "
             "`−` where −Δ does.\n"]
    for env, res in results.items():
        ref, rows, summ = res["tiers"], res["rows"], res["summary"]
        lines.append(f"\n## {res['env_id']}\n")
        lines.append("Sources (normalised mean return of their 1000 trajectories): "
                     + ", ".join(f"{g} {v:.2f}" for g, v in res["group_normalised"].items())
                     + "; teacher checkpoints: "
                     + ", ".join(f"{t} @{c['step']} ({c['normalised']:.2f} at its evaluation, "
                                 f"{'in' if c['in_band'] else 'OUTSIDE'} band)"
                                 for t, c in res["teacher_checkpoints"].items()) + ".\n")
        head = ["source", "experts", "labels"] + [LABELS[a] for a in ALGOS] + ["Δ"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for key, v in summ["grid"].items():
            s, n, lab = key.split(":")
            cells = [s, n, lab]
            for a in ALGOS:
                r = lookup(rows, s, int(n), "ground_truth" if a == "bc_union" else lab, a)
                if r is None:
                    cells.append("-")
                    continue
                f = row_final(r, ref)
                cells.append(f"{f.mean():.2f} ± {f.std():.2f}")
            mark = "*" if v["beats_1std"] else ("−" if v["worse_1std"] else "")
            cells.append(f"{v['diff']:+.2f}{mark}")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append(f"\nDICE diagnostics (mean over seeds) at update {COMPARE_AT[0]} and, for the "
                     "long rows, at their first and last evaluation: largest normalised weight of "
                     "a batch (median over batches), effective sample size (fraction of the "
                     "batch), share of the weight on true expert transitions (their share of the "
                     "data), discriminator AUC true expert vs other.\n")
        head = ["source", "experts", "labels", "learner", "update", "return", "max ω", "ESS",
                "expert share (data)", "AUC"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            if r["algo"] not in DICE:
                continue
            pts = [at_update(r, COMPARE_AT[0]) or r["curve"][-1]]
            if r.get("long"):
                pts = [r["curve"][0]] + pts + [r["curve"][-1]]
            for pt in pts:
                d = pt["diag"]
                mean = lambda k: float(np.mean([x[k] for x in d]))  # noqa: E731
                ret = norm(pt["returns"], ref)
                lines.append(f"| {r['source']} | {r['experts']} | {r['labels']} | "
                             f"{label(r['algo'])} | {pt['update']} | {ret.mean():.2f} ± "
                             f"{ret.std():.2f} | {mean('weight_max'):.1f} | {mean('ess'):.3f} | "
                             f"{mean('expert_share'):.2f} ({mean('expert_fraction'):.3f}) | "
                             f"{mean('disc_auc'):.3f} |")
        p1 = [r for r in rows if r.get("phase1") and r["algo"] == "misodice"]
        if p1:
            lines.append("\nPhase-1 labels (ensemble of O-MAPL seeds vs ground truth):\n")
            for r in p1:
                mm = r["phase1"]["metrics"]
                lines.append(f"- {r['source']} {r['experts']}e: precision {mm['precision']:.2f}, "
                             f"recall {mm['recall']:.2f}, AUC {mm['auc']:.3f}, "
                             f"fit {r['phase1']['seconds']:.0f}s")
        lines += intervention_lines(res)
    lines.append(f"\nCommand: `{meta['command']}`; wall time {meta['wall_seconds']:.0f}s.\n")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    plot_heatmaps(results, out)
    for env, res in results.items():
        plot_curves(res, out / f"curves-{env}.png")


def intervention_lines(res: dict) -> list[str]:
    """The ``--intervention`` rows of one environment: normalised return at
    each point, and the learner's own policy-weight statistics (largest ω,
    ESS, and for the stratified batch the weight on its D_E half) after the
    last update before the comparison point."""
    ref, rows = res["tiers"], res["rows"]
    rows = [r for r in rows if r["algo"] in VARIANTS]
    if not rows:
        return []
    out = ["\nIntervention rows (normalised return, mean ± std over seeds, at each update; the "
           "policy weights' largest ω, ESS and weight on the D_E half are the learner's own "
           "metrics of its last update before the comparison point):\n"]
    pts = sorted({p["update"] for r in res["rows"] for p in r["curve"]})
    head = ["experts", "learner"] + [str(u) for u in pts] + ["max ω", "ESS", "ω on D_E half"]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in sorted({r["experts"] for r in rows}):
        for a in INTERVENTION:
            r = lookup(res["rows"], "teacher", n, "ground_truth", a)
            if r is None:
                continue
            cells = [str(n), label(a)]
            for u in pts:
                pt = at_update(r, u)
                f = norm(pt["returns"], ref) if pt else None
                cells.append(f"{f.mean():.2f} ± {f.std():.2f}" if pt else "-")
            m = (at_update(r, COMPARE_AT[0]) or r["curve"][-1])["metrics"]
            for k, fmt in (("weight_max", "{:.1f}"), ("weight_ess", "{:.3f}"),
                           ("weight_expert_half", "{:.2f}")):
                cells.append(fmt.format(float(np.mean(m[k]))) if k in m else "-")
            out.append("| " + " | ".join(cells) + " |")
    return out


def plot_heatmaps(results: dict, out: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.6 * len(results), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(1, len(results)))
    for ax, (env, res) in zip(axes, results.items()):
        grid = res["summary"]["grid"]
        srcs = [s for s in SOURCES if any(k.startswith(s + ":") for k in grid)]
        ns = sorted({int(k.split(":")[1]) for k in grid})
        z = np.full((len(srcs), len(ns)), np.nan)
        for i, s in enumerate(srcs):
            for j, n in enumerate(ns):
                v = grid.get(f"{s}:{n}:ground_truth")
                if v is not None:
                    z[i, j] = v["diff"]
        lim = max(float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 0.0, 0.05)
        im = ax.imshow(z, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
        for i, s in enumerate(srcs):
            for j, n in enumerate(ns):
                v = grid.get(f"{s}:{n}:ground_truth")
                if v is not None:
                    mark = "*" if v["beats_1std"] else ("−" if v["worse_1std"] else "")
                    p1 = grid.get(f"{s}:{n}:phase1")
                    txt = f"{v['diff']:+.2f}{mark}" + (f"\nP1 {p1['diff']:+.2f}" if p1 else "")
                    ax.text(j, i, txt, ha="center", va="center", fontsize=7)
                else:
                    ax.text(j, i, "not run", ha="center", va="center", fontsize=6, color="#888")
        ax.set_xticks(range(len(ns)), [str(n) for n in ns])
        ax.set_yticks(range(len(srcs)), srcs)
        ax.set_xlabel("expert trajectories (with 1000 others)")
        ax.set_title(f"{res['env_id']}: MisoDICE − BC(D_E)", fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8, label="normalised return")
    fig.savefig(out / "heatmap.png", dpi=120)


def plot_curves(res: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ref, rows = res["tiers"], res["rows"]
    srcs = [s for s in SOURCES if any(r["source"] == s for r in rows)]
    ns = sorted({r["experts"] for r in rows if r["labels"] == "ground_truth"})
    fig = Figure(figsize=(2.8 * len(ns), 2.3 * len(srcs) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.asarray(fig.subplots(len(srcs), len(ns), squeeze=False, sharey=True))
    colors = dict(bc_union="#999", bc_expert="#222", indd="#6a9", misodice_vdn="#58c",
                  misodice="#c55", bc_expert_b4="#222", misodice_strat="#c55")
    for i, s in enumerate(srcs):
        for j, n in enumerate(ns):
            ax = axes[i, j]
            for lab, ls in (("ground_truth", "-"), ("phase1", ":")):
                for a in ALGOS + tuple(VARIANTS):
                    r = lookup(rows, s, n, lab, a)
                    if r is None or (lab == "phase1" and a == "bc_union"):
                        continue
                    x = [p["update"] for p in r["curve"]]
                    y = np.array([norm(p["returns"], ref) for p in r["curve"]])
                    (h,) = ax.plot(x, y.mean(1), "--" if a in VARIANTS else ls, marker="o",
                                   ms=2.5, color=colors[a],
                                   label=label(a) + (" (P1)" if lab == "phase1" else ""))
                    if lab == "ground_truth":
                        ax.fill_between(x, y.mean(1) - y.std(1), y.mean(1) + y.std(1),
                                        color=h.get_color(), alpha=0.12, lw=0)
            ax.set_xscale("log")
            pts = sorted({p["update"] for r in rows for p in r["curve"]})
            ax.set_xticks(pts, [f"{u // 1000}k" if u >= 1000 and u % 1000 == 0 else str(u)
                                for u in pts], fontsize=7)
            ax.minorticks_off()
            ax.axhline(1.0, color="k", lw=0.5, ls="--")
            ax.set_title(f"{s}, {n} expert", fontsize=8)
            ax.grid(alpha=0.3)
            if i == len(srcs) - 1:
                ax.set_xlabel("update")
            if j == 0:
                ax.set_ylabel("normalised return")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    for ax in axes.ravel():
        h, lab = ax.get_legend_handles_labels()
        if len(h) > len(handles):
            handles, labels = h, lab
    fig.legend(handles, labels, loc="outside lower center", ncol=5, fontsize=7)
    fig.suptitle(f"{res['env_id']}: learning curves (mean ± std over seeds; dotted: Phase-1 labels)",
                 fontsize=9)
    fig.savefig(path, dpi=110)


# ----------------------------------------------------------------------------- CLI

#: Sizes per ``--scale``; ``--quick`` shrinks everything for a smoke test.
SCALES = {
    "cpu": dict(seeds=4, points=[250, 500, 1000], long_points=[250, 500, 1000, 2000, 4000],
                chunk=250, eval_episodes=32, batch_size=256, hidden=[64, 64], tag="cpu"),
    "gpu": dict(seeds=4, points=[500, 1000, 2500, 5000, 10000, 20000],
                long_points=[500, 1000, 2500, 5000, 10000, 20000, 40000], chunk=500,
                eval_episodes=32, batch_size=512, hidden=[256, 256], tag="gpu"),
}
DEFAULTS = dict(experts=200, others=1000, expert_counts=list(EXPERT_COUNTS), envs=",".join(ENVS),
                diag_groups=16, p1_queries=1000, p1_seeds=2, p1_updates=1000, measure_episodes=128,
                teacher_max_chunks=40, teacher_step_chunks=3, teacher_eval_episodes=32)
QUICK = dict(seeds=2, points=[10, 20], long_points=[10, 20, 40], chunk=10, eval_episodes=4, batch_size=32, hidden=[16],
             tag="quick", experts=6, others=8, expert_counts=[2, 6], measure_episodes=8,
             teacher_max_chunks=2, teacher_step_chunks=1, teacher_eval_episodes=4, diag_groups=2,
             p1_queries=20, p1_updates=10, p1_seeds=1, envs="smax-3m")


def parse_cells(text: str) -> list[tuple[str, int]]:
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        s, _, n = item.partition(":")
        if s not in SOURCES or not n.isdigit():
            raise SystemExit(f"error: --p1-cells takes SOURCE:COUNT items, e.g. teacher:10, got {item!r}")
        out.append((s, int(n)))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny data, nets and runs")
    p.add_argument("--envs", default=None, help=f"comma-separated (default: {','.join(ENVS)})")
    p.add_argument("--sources", default=",".join(SOURCES))
    p.add_argument("--expert-counts", type=int, nargs="+", default=None)
    p.add_argument("--experts", type=int, help="expert trajectories in the pool (200)")
    p.add_argument("--others", type=int, help="trajectories of each source (1000)")
    p.add_argument("--seeds", type=int)
    p.add_argument("--points", type=int, nargs="+", help="updates at which to evaluate; "
                   "the last is where every learner is compared")
    p.add_argument("--long-points", type=int, nargs="+",
                   help="evaluation points of the --long-cell rows of BC(D_E) and MisoDICE")
    p.add_argument("--long-cell", default="teacher:10", help="SOURCE:COUNT trained longer")
    p.add_argument("--chunk", type=int, help="fused updates per compiled call")
    p.add_argument("--eval-episodes", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--hidden", type=int, nargs="+")
    p.add_argument("--diag-groups", type=int, help="batches for the DICE diagnostics")
    p.add_argument("--p1-cells", default="teacher:10,teacher:25",
                   help="SOURCE:COUNT cells that are also run with Phase-1 labels")
    p.add_argument("--p1-queries", type=int)
    p.add_argument("--p1-flip", type=float, default=0.1)
    p.add_argument("--p1-seeds", type=int)
    p.add_argument("--p1-updates", type=int)
    p.add_argument("--measure-episodes", type=int)
    p.add_argument("--teacher-max-chunks", type=int)
    p.add_argument("--teacher-step-chunks", type=int)
    p.add_argument("--teacher-eval-episodes", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--tag", default=None, help="name of the run's folder under runs/ (default: the scale)")
    p.add_argument("--out", default=None)
    p.add_argument("--budget-min", type=float, default=None,
                   help="start no row after this many minutes (rows left out are listed)")
    p.add_argument("--reuse", default=None, metavar="RESULTS_JSON",
                   help="take the rows of an earlier run's results.json (same pool and settings) "
                        "instead of training them again, e.g. the committed results/results.json")
    p.add_argument("--pools-only", action="store_true", help="build the pools (and teachers) and stop")
    p.add_argument("--intervention", action="store_true",
                   help="run only the intervention rows (BC(D_E) at batch 4, MisoDICE with a "
                        "stratified policy batch, beside BC(D_E) and MisoDICE) on the scarce "
                        "teacher cells, to --points")
    args = p.parse_args(argv)
    preset = {**DEFAULTS, **SCALES[args.scale], **(QUICK if args.quick else {})}
    for k, v in preset.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    args.sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    args.p1_cells = parse_cells(args.p1_cells) if not args.quick else [("teacher", 2)]
    args.long_cell = parse_cells(args.long_cell)[0] if not args.quick else ("teacher", 2)
    if args.intervention:
        args.long_cell, args.p1_cells = (None, None), []
    args.points = sorted(set(args.points))
    args.long_points = sorted(set(args.long_points) | set(args.points))
    COMPARE_AT[0] = args.points[-1]
    if any(pt % args.chunk for pt in args.points + args.long_points):
        raise SystemExit(f"error: every --points value must be a multiple of --chunk ({args.chunk})")
    if max(args.expert_counts) > args.experts:
        raise SystemExit(f"error: --expert-counts go up to {max(args.expert_counts)} but the pool "
                         f"has --experts {args.experts}")
    if args.reuse is not None:
        try:
            args.reuse = json.loads(Path(args.reuse).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"error: --reuse {args.reuse}: cannot read it as JSON ({e}); pass "
                             "an earlier run's results.json") from None
        if not isinstance(args.reuse, dict) or "envs" not in args.reuse:
            raise SystemExit("error: --reuse takes an earlier run's results.json (it has no "
                             "'envs'); pass e.g. experiments/misodice_regimes/results/results.json")
    out = Path(args.out or (HERE / ("results" if args.scale == "cpu" and not args.quick
                                    else f"results_{args.tag}")))
    t0 = time.perf_counter()
    if args.pools_only:
        for env in args.envs:
            _, meta = make_pool(env, args)
            print(env, json.dumps({k: meta[k] for k in ("group_normalised", "teacher_checkpoints")}),
                  flush=True)
        return
    results, skipped = run_all(args)
    for res in results.values():
        res["summary"] = summarise(res)
    meta = dict(command="python " + " ".join([sys.argv[0]] + (sys.argv[1:] if argv is None else argv)),
                wall_seconds=time.perf_counter() - t0,
                **{k: getattr(args, k) for k in ("seeds", "points", "chunk", "eval_episodes",
                                                 "batch_size", "hidden", "expert_counts", "sources",
                                                 "experts", "others", "p1_queries", "p1_flip",
                                                 "p1_seeds", "p1_updates", "seed", "data_seed",
                                                 "diag_groups")},
                p1_cells=args.p1_cells, long_cell=args.long_cell, long_points=args.long_points,
                compare_at=COMPARE_AT[0], budget_min=args.budget_min, skipped=skipped)
    write_outputs(results, out, meta)
    print((out / "table.md").read_text())


if __name__ == "__main__":
    main()
