"""The teacher program: PPO in chunks, run by the run engine
([`train_teacher`][jaxil.teachers.train.train_teacher]).

`train_teacher(env_id, config, seed, out_dir)` builds a
[`jaxil.runs.engine.Program`][jaxil.runs.engine.Program] from the compiled
[`jaxil.algorithms.rl.ppo.make_ppo`][jaxil.algorithms.rl.ppo.make_ppo] chunk
and hands it to [`jaxil.runs.engine.run`][jaxil.runs.engine.run], which owns
the loop: the guard, one metrics row per chunk, a few evenly spaced
checkpoints, each evaluated with
[`jaxil.envs.run_episodes`][jaxil.envs.rollout.run_episodes], the progress bar
and exact resume. The directory keeps the teacher layout of
[`jaxil.teachers.io`][jaxil.teachers.io]
([`jaxil.teachers.rundir`][jaxil.teachers.rundir] maps it onto the engine).

A run that cannot lie: the output directory is checked writable and free of
other runs before any compilation; `resume` refuses any setting that differs
from the recorded run; a loss or parameter turning NaN/inf stops the run with
[`jaxil.runs.guard.NonFiniteError`][jaxil.runs.guard.NonFiniteError] before
that chunk's metrics or checkpoint are written, so the directory keeps its last
good checkpoint.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxil import envs
from jaxil.envs.core import MultiAgentEnv
from jaxil.envs.policies import random_policy
from jaxil.runs import engine
from jaxil.runs.loggers import LoggerFactory
from jaxil.algorithms.rl.config import PPOConfig
from jaxil.algorithms.rl.ppo import RunnerState, make_ppo
from jaxil.teachers.io import ACTOR_FORMAT
from jaxil.teachers.rundir import STEP_KEY, evaluation_fields, open_teacher_dir


# --------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------
def evaluate(
    env: MultiAgentEnv, policy: Any, params: Any, key: jax.Array, num_episodes: int = 128
) -> dict[str, float]:
    """Mean episodic return (± std), win rate (if the env has one) and length
    over `num_episodes` complete episodes of
    [`envs.run_episodes`][jaxil.envs.rollout.run_episodes] (jitted; the
    compiled program is cached per `(env, policy)` object)."""
    eps = _jit_run_episodes(env, policy, num_episodes)(params, key)
    return envs.episode_summary(eps, env.spec.has_win)


@functools.lru_cache(maxsize=32)
def _jit_run_episodes(env, policy, num_episodes):
    return jax.jit(lambda params, key: envs.run_episodes(env, policy, params, key, num_episodes))


# --------------------------------------------------------------------------
# The program
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
    `_program`) so that a resume, or a second run with the same config,
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
        """Ahead-of-time compiled `update_chunk` (first chunk timings stay
        honest); returns `(executable, compile_seconds)`."""
        if self._chunk is None:
            t0 = time.time()
            self._chunk = (self._compile(self.ppo.update_chunk, runner), time.time() - t0)
        return self._chunk

    def checked_chunk(self, runner: RunnerState):
        """Like `chunk` for `update_chunk_checked`: the executable
        returns `(runner, metrics, health)` ([`jaxil.runs.guard`][jaxil.runs.guard])."""
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
            eval_stochastic=envs.episode_summary(run(params, jnp.bool_(False), key), has_win),
            eval_deterministic=envs.episode_summary(run(params, jnp.bool_(True), key), has_win),
        )

    @functools.lru_cache(maxsize=8)
    def random_baseline(self, num_episodes: int, seed: int) -> dict:
        key = jax.random.fold_in(jax.random.PRNGKey(seed), 0x5EED)
        policy = random_policy(self.spec)
        run = self._compile(
            lambda k: envs.run_episodes(self.env, policy, None, k, num_episodes), key
        )
        return envs.episode_summary(run(key), self.spec.has_win)


@functools.lru_cache(maxsize=8)
def _program(
    env_id: str, env_kwargs_items: tuple, config: PPOConfig, compiler_items: tuple = ()
) -> _Program:
    return _Program(env_id, env_kwargs_items, config, compiler_items)


def teacher_program(prog: _Program, config: PPOConfig, seed: int, *, eval_episodes: int,
                    checkpoint_at: list[int], env_id: str, label: str) -> engine.Program:
    """The [`jaxil.runs.engine.Program`][jaxil.runs.engine.Program] of one
    teacher: one run, one metrics row per chunk (the training rollouts'
    statistics, timed), a checkpoint and evaluation after each chunk of
    `checkpoint_at`. Rows and checkpoints are keyed by env steps; the guard
    numbers updates."""
    k_init, k_eval = jax.random.split(jax.random.PRNGKey(seed))
    env_steps_per_chunk = config.updates_per_chunk * config.batch_size
    compiled: dict[str, Any] = {}

    def init() -> RunnerState:
        runner = prog.init(k_init)
        compiled["chunk"], compiled["compile_s"] = prog.checked_chunk(runner)
        return runner

    def chunk(runner: RunnerState, c: int):
        runner, metrics, health = compiled["chunk"](runner)
        if "reported" not in compiled:  # the first chunk of this session
            compiled["reported"] = True
            metrics = dict(metrics, compile_s=compiled["compile_s"])
        return runner, metrics, health

    def evaluate(runner: RunnerState, c: int) -> dict:
        return evaluation_fields(prog.evaluate(runner.actor.params, k_eval, eval_episodes))

    def derive(row: dict) -> dict:
        return dict(chunk=row[STEP_KEY] // env_steps_per_chunk,
                    update=row[STEP_KEY] // config.batch_size,
                    env_steps_per_s=env_steps_per_chunk / row["chunk_time_s"])

    def postfix(values: dict) -> dict:
        ret = values["return_mean"][0]
        out = {"ret": "-" if not np.isfinite(ret) else f"{ret:.3g}"}
        if "win_rate" in values and np.isfinite(values["win_rate"][0]):
            out["win"] = f"{values['win_rate'][0]:.2f}"
        if "eval_stochastic/return_mean" in values:
            out["eval"] = f"{values['eval_stochastic/return_mean'][0]:.3g}"
        return out

    return engine.Program(
        name=f"the {config.algo.upper()} teacher of {env_id}", step_key=STEP_KEY,
        num_chunks=config.num_chunks, steps_per_chunk=config.updates_per_chunk,
        run_ids=[{"run": 0, "seed": int(seed)}], run_labels=[f"seed {seed} ({label})"],
        init=init, chunk=chunk, evaluate=evaluate, step_unit=env_steps_per_chunk,
        eval_chunks=checkpoint_at, row_every_chunk=True, timed=True, derive=derive,
        postfix=postfix, summarize=lambda rows: {},
        fetch=lambda tree: jax.tree.map(lambda x: np.asarray(x)[None], jax.device_get(tree)),
        describe_step=lambda s: f"env step {s}, update {s // config.batch_size}",
    )


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
    loggers: Sequence[LoggerFactory] = (),
) -> dict:
    """Train an IPPO/MAPPO teacher chunk by chunk and write it to `out_dir`.

    Layout:

    ```text
    out_dir/teacher.json         env id, algo, config, spec, random baseline,
                                 checkpoints with their evaluations
    out_dir/metrics.jsonl        one row per chunk (training-rollout stats;
                                 the evaluation too at checkpoints)
    out_dir/checkpoints/<env_steps>/actor/      orbax: actor params
    out_dir/checkpoints/<env_steps>/runner/     orbax: full RunnerState
                                                (every checkpoint)
    out_dir/checkpoints/<env_steps>/checkpoint.json   its evaluation
    ```

    Checkpoints are evenly spaced over the run (`num_checkpoints`, the last at
    the end). Each is evaluated with
    [`envs.run_episodes`][jaxil.envs.rollout.run_episodes] on `eval_episodes`
    episodes (same reset keys for every checkpoint), with the stochastic policy
    (the one used to generate data) and deterministically (greedy action /
    squashed Gaussian mean).

    `resume=True` continues from the runner state of the newest checkpoint that
    can be read (and whose metrics rows are all kept); the result is
    bit-identical to an uninterrupted run. Without it, an `out_dir` that
    already holds checkpoints is an error; with it, any difference in the env,
    seed, config, checkpoint schedule or `eval_episodes` is. An `out_dir`
    holding another kind of run (a `jaxil train` run directory) is refused
    either way. `stop_after_chunks` (>= 1) stops after that chunk (as a kill
    would), for tests and time-boxed runs. `compiler_options` go to XLA
    (`jax.stages.Lowered.compile`), e.g. `{"xla_backend_optimization_level":
    0}` halves CPU compile time for smoke runs (and slows the run down).
    `loggers`: where the metrics rows go besides `metrics.jsonl`
    ([`jaxil.runs.loggers`][jaxil.runs.loggers]; the run is named
    `<env_id>-seed<seed>`).

    Returns the `teacher.json` content.

    Raises:
      jaxil.runs.guard.NonFiniteError: a loss or the parameters became NaN/inf;
        the message names the env, seed, update and quantity, and the
        directory keeps the checkpoints written before.
      FileExistsError: `out_dir` holds another run (see above).
      PermissionError: `out_dir` cannot be written.
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
    env_kwargs = dict(env_kwargs or {})
    ckpt_chunks = checkpoint_chunks(config.num_chunks, num_checkpoints)
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
    rundir = open_teacher_dir(out_dir, header, resume=resume,
                              env_steps_per_chunk=config.updates_per_chunk * config.batch_size)
    prog = _program(env_id, tuple(sorted(env_kwargs.items())), config,
                    tuple(sorted((compiler_options or {}).items())))
    rundir.begin(prog.spec.to_dict(), None if rundir.latest is not None
                 else prog.random_baseline(eval_episodes, seed))
    program = teacher_program(prog, config, seed, eval_episodes=eval_episodes,
                              checkpoint_at=ckpt_chunks, env_id=env_id, label=str(out_dir))
    engine.run(program, rundir=rundir, progress=progress, stop_after_chunks=stop_after_chunks,
               loggers=loggers, log_names=[f"{env_id}-seed{seed}"])
    return rundir.doc
