"""The teacher driver: a PPO run in chunks, with a progress bar, metrics,
checkpoints, evaluations and exact resume (:func:`train_teacher`).

``train_teacher(env_id, config, seed, out_dir)`` loops over chunks of the
compiled :func:`jaxil.algorithms.rl.ppo.make_ppo` program, writes ``metrics.jsonl``,
saves the actor at several points, evaluates each checkpoint with
:func:`envs.run_episodes`, writes ``teacher.json`` and resumes bit-for-bit from
the last checkpoint. The directory layout is in :mod:`jaxil.teachers.io`.

A run that cannot lie: the output directory is checked writable and free of
other runs before any compilation; ``resume`` refuses any setting that differs
from the recorded run; a loss or parameter turning NaN/inf stops the run with
:class:`jaxil.runs.guard.NonFiniteError` before that chunk's metrics or checkpoint
are written, so the directory keeps its last good checkpoint.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxil import envs
from jaxil.envs.core import MultiAgentEnv
from jaxil.envs.policies import random_policy
from jaxil.runs import guard
from jaxil.runs.checkpoint import restore_tree, save_tree
from jaxil.runs.io_atomic import atomic_write_text
from jaxil.runs.rundir import check_writable
from jaxil.algorithms.rl.config import PPOConfig
from jaxil.teachers.io import (
    ACTOR_FORMAT,
    CKPT_DIR,
    METRICS_FILE,
    TEACHER_FILE,
    jsonable_metrics,
    list_checkpoints,
    write_json,
)
from jaxil.algorithms.rl.ppo import RunnerState, make_ppo


# --------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------
def summarize_episodes(eps: Any, has_win: bool) -> dict[str, float]:
    """Mean return (± std), mean length and win rate of an
    :class:`envs.rollout.Episodes` batch."""
    ret = np.asarray(eps.episode_return, np.float64)
    out = dict(
        episodes=int(ret.shape[0]),
        return_mean=float(ret.mean()),
        return_std=float(ret.std()),
        length_mean=float(np.asarray(eps.length).mean()),
    )
    if has_win:
        out["win_rate"] = float(np.asarray(eps.won).mean())
    return out


def evaluate(
    env: MultiAgentEnv, policy: Any, params: Any, key: jax.Array, num_episodes: int = 128
) -> dict[str, float]:
    """Mean episodic return (± std), win rate (if the env has one) and length
    over ``num_episodes`` complete episodes of :func:`envs.run_episodes`
    (jitted; the compiled program is cached per ``(env, policy)`` object)."""
    eps = _jit_run_episodes(env, policy, num_episodes)(params, key)
    return summarize_episodes(eps, env.spec.has_win)


@functools.lru_cache(maxsize=32)
def _jit_run_episodes(env, policy, num_episodes):
    return jax.jit(lambda params, key: envs.run_episodes(env, policy, params, key, num_episodes))


# --------------------------------------------------------------------------
# Driver: chunks, progress bar, metrics, checkpoints, resume
# --------------------------------------------------------------------------
def checkpoint_chunks(num_chunks: int, num_checkpoints: int) -> list[int]:
    """Chunk indices (1-based) after which a checkpoint is saved: evenly
    spaced, the last one always at the end of the run."""
    if num_checkpoints < 1:
        raise ValueError(f"num_checkpoints must be >= 1, got {num_checkpoints}")
    k = min(num_checkpoints, num_chunks)
    return sorted({max(1, round(i * num_chunks / k)) for i in range(1, k + 1)})


class _Program:
    """The compiled pieces of one (env, config) pair. Cached per process (see
    :func:`_program`) so that a resume, or a second run with the same config,
    does not compile again."""

    def __init__(self, env_id: str, env_kwargs_items: tuple, config: PPOConfig,
                 compiler_items: tuple = ()):
        self.env = envs.make(env_id, **dict(env_kwargs_items))
        self.spec = self.env.spec
        self.ppo = make_ppo(self.env, config)
        self.compiler_options = dict(compiler_items) or None
        self._init = None
        self._chunk = None
        self._checked = None
        self._eval = {}

    def _compile(self, fn, *args):
        return jax.jit(fn).lower(*args).compile(self.compiler_options)

    def init(self, key: jax.Array) -> RunnerState:
        if self._init is None:
            self._init = self._compile(self.ppo.init, key)
        return self._init(key)

    def chunk(self, runner: RunnerState):
        """Ahead-of-time compiled ``update_chunk`` (first chunk timings stay
        honest); returns ``(executable, compile_seconds)``."""
        if self._chunk is None:
            t0 = time.time()
            self._chunk = (self._compile(self.ppo.update_chunk, runner), time.time() - t0)
        return self._chunk

    def checked_chunk(self, runner: RunnerState):
        """Like :meth:`chunk` for ``update_chunk_checked``: the executable
        returns ``(runner, metrics, health)`` (:mod:`jaxil.runs.guard`)."""
        if self._checked is None:
            t0 = time.time()
            self._checked = (self._compile(self.ppo.update_chunk_checked, runner),
                             time.time() - t0)
        return self._checked

    def evaluate(self, params: Any, key: jax.Array, num_episodes: int) -> dict[str, dict]:
        """Stochastic and deterministic evaluation with ONE compiled program
        (the mode is a traced flag)."""
        if num_episodes not in self._eval:
            stoch = self.ppo.actor.policy_fn(deterministic=False)
            greedy = self.ppo.actor.policy_fn(deterministic=True)

            def policy(p, obs, avail, key):
                actor_params, det = p
                return jax.lax.cond(det, greedy, stoch, actor_params, obs, avail, key)

            self._eval[num_episodes] = self._compile(
                lambda p, det, k: envs.run_episodes(self.env, policy, (p, det), k, num_episodes),
                params, jnp.bool_(False), key,
            )
        run = self._eval[num_episodes]
        has_win = self.spec.has_win
        return dict(
            eval_stochastic=summarize_episodes(run(params, jnp.bool_(False), key), has_win),
            eval_deterministic=summarize_episodes(run(params, jnp.bool_(True), key), has_win),
        )

    @functools.lru_cache(maxsize=8)
    def random_baseline(self, num_episodes: int, seed: int) -> dict:
        key = jax.random.fold_in(jax.random.PRNGKey(seed), 0x5EED)
        policy = random_policy(self.spec)
        run = self._compile(
            lambda k: envs.run_episodes(self.env, policy, None, k, num_episodes), key
        )
        return summarize_episodes(run(key), self.spec.has_win)


@functools.lru_cache(maxsize=8)
def _program(
    env_id: str, env_kwargs_items: tuple, config: PPOConfig, compiler_items: tuple = ()
) -> _Program:
    return _Program(env_id, env_kwargs_items, config, compiler_items)


def train_teacher(
    env_id: str,
    config: PPOConfig,
    seed: int,
    out_dir: str,
    num_checkpoints: int = 5,
    eval_episodes: int = 128,
    resume: bool = False,
    env_kwargs: Optional[dict] = None,
    stop_after_chunks: Optional[int] = None,
    progress: bool = True,
    compiler_options: Optional[dict] = None,
) -> dict:
    """Train an IPPO/MAPPO teacher chunk by chunk and write it to ``out_dir``.

    Layout::

        out_dir/teacher.json         env id, algo, config, spec, random baseline,
                                     checkpoints with their evaluations
        out_dir/metrics.jsonl        one line per chunk (training-rollout stats)
        out_dir/checkpoints/<env_steps>/actor/      orbax: actor params
        out_dir/checkpoints/<env_steps>/runner/     orbax: full RunnerState
                                                    (latest checkpoint only)
        out_dir/checkpoints/<env_steps>/checkpoint.json   its evaluation

    Checkpoints are evenly spaced over the run (``num_checkpoints``, the last
    at the end). Each is evaluated with :func:`envs.run_episodes` on
    ``eval_episodes`` episodes (same reset keys for every checkpoint), with
    the stochastic policy (the one used to generate data) and
    deterministically (greedy action / squashed Gaussian mean).

    ``resume=True`` continues from the latest checkpoint's runner state; the
    result is bit-identical to an uninterrupted run. Without it, an ``out_dir``
    that already holds checkpoints is an error; with it, any difference in
    the env, seed, config, checkpoint schedule or ``eval_episodes`` is. An
    ``out_dir`` holding another kind of run (a ``jaxil train`` run directory)
    is refused either way. ``stop_after_chunks`` (>= 1) stops after that chunk
    (as a kill would), for tests and time-boxed runs.
    ``compiler_options`` go to XLA (``jax.stages.Lowered.compile``), e.g.
    ``{"xla_backend_optimization_level": 0}`` halves CPU compile time for smoke
    runs (and slows the run down).

    Returns the ``teacher.json`` content.

    Raises:
      jaxil.runs.guard.NonFiniteError: a loss or the parameters became NaN/inf;
        the message names the env, seed, update and quantity, and the
        directory keeps the checkpoints written before.
      FileExistsError: ``out_dir`` holds another run (see above).
      PermissionError: ``out_dir`` cannot be written.
    """
    if not isinstance(config, PPOConfig):
        raise TypeError(f"config must be a PPOConfig, got {type(config).__name__}")
    if isinstance(eval_episodes, bool) or not isinstance(eval_episodes, int) or eval_episodes < 1:
        raise ValueError(f"eval_episodes must be a positive integer, got {eval_episodes!r}")
    if stop_after_chunks is not None and (isinstance(stop_after_chunks, bool)
                                          or not isinstance(stop_after_chunks, int)
                                          or stop_after_chunks < 1):
        raise ValueError(f"stop_after_chunks must be an integer >= 1 (or None), "
                         f"got {stop_after_chunks!r}")
    check_writable(Path(out_dir), "out_dir")
    _refuse_foreign_run(out_dir)
    session_start = time.time()
    env_kwargs = dict(env_kwargs or {})
    ckpt_chunks = checkpoint_chunks(config.num_chunks, num_checkpoints)
    teacher_path = os.path.join(out_dir, TEACHER_FILE)
    metrics_path = os.path.join(out_dir, METRICS_FILE)
    existing = list_checkpoints(out_dir)
    header = dict(
        env_id=env_id,
        env_kwargs=env_kwargs,
        algo=config.algo,
        seed=int(seed),
        config=config.to_dict(),
        actor_format=ACTOR_FORMAT,
        eval_episodes=int(eval_episodes),
        eval_note="stochastic = actions sampled from the policy (as used for data); "
        "deterministic = greedy action / squashed Gaussian mean; the same "
        "eval_episodes reset keys for every checkpoint",
        checkpoint_chunks=ckpt_chunks,
    )
    old = None
    if existing:
        if not resume:
            raise FileExistsError(
                f"{out_dir} already has checkpoints {existing}; pass resume=True "
                f"(--resume) to continue, or choose an empty out_dir"
            )
        if not os.path.exists(teacher_path):
            raise FileNotFoundError(
                f"cannot resume {out_dir}: it holds checkpoints {existing} but no "
                f"{TEACHER_FILE}, so their settings cannot be checked; choose an empty out_dir"
            )
        with open(teacher_path) as f:
            old = json.load(f)
        if old.get("actor_format", 1) != ACTOR_FORMAT:
            raise ValueError(
                f"cannot resume {out_dir}: it was written by an earlier jaxil (actor_format "
                f"{old.get('actor_format', 1)}); its checkpoints still load for data, but train "
                f"a new run in an empty out_dir to continue training"
            )
        # eval_episodes: the checkpoints of one run are evaluated alike (runs
        # written before it was recorded are not compared on it).
        keys = ("env_id", "env_kwargs", "seed", "config", "checkpoint_chunks") + (
            ("eval_episodes",) if "eval_episodes" in old else ())
        for k in keys:
            if old.get(k) != json.loads(json.dumps(header[k])):
                raise ValueError(
                    f"cannot resume {out_dir}: its {k} is {old.get(k)!r} but this run has "
                    f"{header[k]!r} (num_checkpoints and eval_episodes must match too); "
                    f"rerun with the original settings, or choose another out_dir"
                )

    prog = _program(env_id, tuple(sorted(env_kwargs.items())), config,
                    tuple(sorted((compiler_options or {}).items())))
    spec = prog.spec
    header["spec"] = spec.to_dict()
    os.makedirs(os.path.join(out_dir, CKPT_DIR), exist_ok=True)
    k_init, k_eval = jax.random.split(jax.random.PRNGKey(seed))

    start_chunk, wall = 0, 0.0
    if old is not None:
        with_state = [s for s in existing
                      if os.path.isdir(os.path.join(out_dir, CKPT_DIR, str(s), "runner"))]
        if not with_state:
            raise FileNotFoundError(f"no runner state to resume from in {out_dir}/{CKPT_DIR}")
        step = with_state[-1]
        like = jax.eval_shape(prog.ppo.init, k_init)
        runner = restore_tree(os.path.join(out_dir, CKPT_DIR, str(step), "runner"), like)
        start_chunk = int(runner.update) // config.updates_per_chunk
        # Drop checkpoints and metrics written after the state we resume from.
        for s in existing:
            if s > step:
                shutil.rmtree(os.path.join(out_dir, CKPT_DIR, str(s)))
        wall = _truncate_metrics(metrics_path, start_chunk)
        header["random_baseline"] = old.get("random_baseline")
    else:
        runner = prog.init(k_init)
        if os.path.exists(metrics_path):
            os.remove(metrics_path)
        header["random_baseline"] = prog.random_baseline(eval_episodes, seed)
        write_json(teacher_path, dict(header, checkpoints=[], complete=False))

    def save_checkpoint(runner, chunk, wall):
        step = int(runner.update) * config.batch_size
        cdir = os.path.join(out_dir, CKPT_DIR, str(step))
        params = runner.actor.params
        save_tree(os.path.join(cdir, "actor"), params)
        save_tree(os.path.join(cdir, "runner"), runner)
        info = dict(step=step, update=int(runner.update), chunk=chunk, wall_time_s=wall,
                    **prog.evaluate(params, k_eval, eval_episodes))
        write_json(os.path.join(cdir, "checkpoint.json"), info)
        # Keep the full runner state for the latest checkpoint only.
        for s in list_checkpoints(out_dir):
            rdir = os.path.join(out_dir, CKPT_DIR, str(s), "runner")
            if s != step and os.path.isdir(rdir):
                shutil.rmtree(rdir)
        return info

    def write_teacher(complete, wall):
        ckpts = []
        for s in list_checkpoints(out_dir):
            with open(os.path.join(out_dir, CKPT_DIR, str(s), "checkpoint.json")) as f:
                ckpts.append(json.load(f))
        # wall_time_s: training chunks only (all sessions); session_elapsed_s:
        # this call, with compilation, evaluations and checkpoint writes.
        doc = dict(header, checkpoints=ckpts, complete=complete, wall_time_s=wall,
                   session_elapsed_s=time.time() - session_start,
                   env_steps=int(runner.update) * config.batch_size)
        write_json(teacher_path, doc)
        return doc

    chunk_exec, compile_s = prog.checked_chunk(runner)
    K = config.updates_per_chunk
    learner = f"the {config.algo.upper()} teacher of {env_id}"
    kept = _kept(out_dir, config)
    end_chunk = config.num_chunks
    if stop_after_chunks is not None:
        end_chunk = min(end_chunk, stop_after_chunks)
    steps_per_chunk = config.updates_per_chunk * config.batch_size
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=config.env_steps, initial=start_chunk * steps_per_chunk, unit="step",
            unit_scale=True, desc=f"{config.algo} {env_id}", dynamic_ncols=True,
            mininterval=5.0,
        )
    try:
        with open(metrics_path, "a") as mf:
            for chunk in range(start_chunk + 1, end_chunk + 1):
                t = time.time()
                runner, m, health = chunk_exec(runner)
                m, health = jax.device_get((m, health))
                # Before this chunk's metrics line and checkpoint: a diverged
                # chunk leaves no trace but the error.
                guard.check(jax.tree.map(lambda x: np.asarray(x)[None], health),
                            learner=learner, run_labels=[f"seed {seed} ({out_dir})"],
                            first_step=(chunk - 1) * K + 1, chunk_len=K,
                            kept=kept)
                dt = time.time() - t
                wall += dt
                rec = dict(chunk=chunk, update=int(runner.update), **jsonable_metrics(m))
                rec.update(env_steps_per_s=steps_per_chunk / dt, chunk_time_s=dt, wall_time_s=wall)
                if chunk == start_chunk + 1:
                    rec["compile_s"] = compile_s
                mf.write(json.dumps(rec) + "\n")
                mf.flush()
                if bar is not None:
                    post = {"ret": "-" if rec["return_mean"] is None else f"{rec['return_mean']:.3g}"}
                    if rec.get("win_rate") is not None:
                        post["win"] = f"{rec['win_rate']:.2f}"
                    post["sps"] = f"{rec['env_steps_per_s']:.0f}"
                    bar.set_postfix(post, refresh=False)
                    bar.update(steps_per_chunk)
                if chunk in ckpt_chunks:
                    info = save_checkpoint(runner, chunk, wall)
                    write_teacher(complete=False, wall=wall)
                    kept = _kept(out_dir, config)
                    if bar is not None:
                        ev = info["eval_stochastic"]
                        msg = f"checkpoint {info['step']}: eval return {ev['return_mean']:.3f}"
                        if "win_rate" in ev:
                            msg += f", win rate {ev['win_rate']:.3f}"
                        bar.write(msg)
    finally:
        if bar is not None:
            bar.close()
    return write_teacher(complete=int(runner.update) == config.num_updates, wall=wall)


def _refuse_foreign_run(out_dir: str) -> None:
    """Refuse a directory that holds a run other than a teacher's: a teacher
    would remove its ``metrics.jsonl`` and mix its files with ours."""
    d = Path(out_dir)
    foreign = [f for f in ("run.json", "results.json") if (d / f).exists()]
    if not (d / TEACHER_FILE).exists():
        foreign += [f for f in (METRICS_FILE,) if (d / f).exists()]
        ck = d / CKPT_DIR
        if ck.is_dir() and any(ck.iterdir()):
            foreign.append(CKPT_DIR + "/")
    if foreign:
        raise FileExistsError(
            f"{out_dir} holds {', '.join(foreign)}: the files of another kind of run (a "
            f"`jaxil train` run directory?), not of a teacher; choose another --out"
        )


def _kept(out_dir: str, config: PPOConfig) -> str:
    """What a diverged run leaves behind (for its error message)."""
    steps = list_checkpoints(out_dir)
    if not steps:
        return "no checkpoint was written (it diverged before the first)"
    return (f"{out_dir} keeps its last good checkpoint (env step {steps[-1]}, update "
            f"{steps[-1] // config.batch_size})")


def _truncate_metrics(path: str, upto_chunk: int) -> float:
    """Keep metric lines of chunks <= upto_chunk; return their wall time."""
    if not os.path.exists(path):
        return 0.0
    keep, wall = [], 0.0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec["chunk"] <= upto_chunk:
                keep.append(line if line.endswith("\n") else line + "\n")
                wall = rec.get("wall_time_s", wall)
    atomic_write_text(path, "".join(keep))
    return wall
