"""Teacher run directories: layout, loading, and the teachers shipped with jaxil.

Layout of a run (written by
[`jaxil.teachers.train.train_teacher`][jaxil.teachers.train.train_teacher]):

```text
out_dir/teacher.json         env id, algo, config, spec, random baseline,
                             checkpoints with their evaluations
out_dir/metrics.jsonl        one line per chunk (training-rollout stats)
out_dir/checkpoints/<env_steps>/actor/      the actor's parameters
out_dir/checkpoints/<env_steps>/runner/     the full RunnerState
                                            (every checkpoint)
out_dir/checkpoints/<env_steps>/checkpoint.json   its evaluation
```

Arrays are stored with
[`jaxil.runs.checkpoint.save_tree`][jaxil.runs.checkpoint.save_tree].
`teacher.json` records `actor_format`: 2 is the
[`jaxil.nn.policy.PolicyNet`][jaxil.nn.policy.PolicyNet] layout; runs written
before it (no `actor_format`; the earlier flax `Actor` module) are converted on
load, so old run directories keep working.

Shipped teachers. `jaxil/teachers/shipped/<name>/` holds the teachers the
dataset recipes use, as policy parameters only (every evaluated checkpoint's
actor, no runner state) with a SHA-256 of each in `teacher.json`, verified on
load. [`ship_teacher`][jaxil.teachers.io.ship_teacher] makes one from a run
directory.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxil.envs.core import EnvSpec
from jaxil.runs.checkpoint import params_digest, restore_tree, save_tree
from jaxil.runs.io_atomic import atomic_dir, atomic_write_text
from jaxil.algorithms.rl.config import PPOConfig
from jaxil.algorithms.rl.ppo import make_actor, make_policy

TEACHER_FILE = "teacher.json"
METRICS_FILE = "metrics.jsonl"
CKPT_DIR = "checkpoints"
ACTOR_FORMAT = 2
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON atomically (temporary file + rename)."""
    atomic_write_text(path, json.dumps(obj, indent=2, default=_json_default))


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def jsonable_metrics(m: dict) -> dict:
    """Scalars as Python numbers, non-finite ones as None."""
    out = {}
    for k, v in m.items():
        v = np.asarray(v).item()
        out[k] = None if isinstance(v, float) and not math.isfinite(v) else v
    return out


def list_checkpoints(out_dir: str | os.PathLike) -> list[int]:
    """Steps of the complete checkpoints (those with a `checkpoint.json`)."""
    d = os.path.join(out_dir, CKPT_DIR)
    if not os.path.isdir(d):
        return []
    steps = []
    for name in os.listdir(d):
        if name.isdigit() and os.path.exists(os.path.join(d, name, "checkpoint.json")):
            steps.append(int(name))
    return sorted(steps)


def read_teacher(out_dir: str | os.PathLike) -> dict:
    """The `teacher.json` of a run; FileNotFoundError / ValueError that say what
    is wrong otherwise."""
    path = os.path.join(out_dir, TEACHER_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {out_dir} a train_teacher output?")
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); the run directory is damaged") from e


def _legacy_actor_like(spec: EnvSpec, config: PPOConfig) -> dict:
    """Shapes of an `actor_format` 1 actor (the flax `Actor` of earlier
    jaxil versions: `_Torso_0/Dense_<i>` hidden layers, `Dense_0` output,
    `log_std` for box actions)."""
    f32 = jnp.float32
    width = spec.obs_dim + spec.num_agents
    torso = {}
    for i, h in enumerate(config.hidden_sizes):
        torso[f"Dense_{i}"] = {"kernel": jax.ShapeDtypeStruct((width, h), f32),
                               "bias": jax.ShapeDtypeStruct((h,), f32)}
        width = h
    out = spec.num_actions if spec.discrete else spec.action.dim
    params = {"_Torso_0": torso, "Dense_0": {"kernel": jax.ShapeDtypeStruct((width, out), f32),
                                             "bias": jax.ShapeDtypeStruct((out,), f32)}}
    if not spec.discrete:
        params["log_std"] = jax.ShapeDtypeStruct((out,), f32)
    return {"params": params}


def legacy_mlp_variables(old: dict) -> dict:
    """The variables of an `actor_format` 1 network (actor or critic:
    `_Torso_0/Dense_<i>` hidden layers, `Dense_0` output) as those of the
    shared [`jaxil.nn.nets.LocalMLP`][jaxil.nn.nets.LocalMLP] that replaces it
    (same weights, same function)."""
    p = old["params"]
    mlp = {f"hidden_{i}": layer for i, layer in
           ((int(k.split("_")[1]), v) for k, v in p["_Torso_0"].items())}
    mlp["out"] = p["Dense_0"]
    return {"params": {"mlp": mlp}}


def _from_legacy(old: dict, spec: EnvSpec) -> Any:
    """An `actor_format` 1 actor as
    [`jaxil.nn.policy.PolicyNet`][jaxil.nn.policy.PolicyNet] parameters."""
    variables = legacy_mlp_variables(old)
    if spec.discrete:
        return variables
    return {"net": variables, "log_std": old["params"]["log_std"]}


def _restore_actor(out_dir: str | os.PathLike, step: int, doc: dict) -> tuple[Any, str]:
    """`(params, stored digest)`: the actor of checkpoint `step` as
    [`jaxil.nn.policy.PolicyNet`][jaxil.nn.policy.PolicyNet] parameters, and
    the SHA-256 of the tree as it is stored (an `actor_format` 1 run keeps its
    own layout's digest, so datasets built from it record the same digest as
    before)."""
    config = PPOConfig.from_dict(doc["config"])
    spec = EnvSpec.from_dict(doc["spec"])
    path = os.path.join(out_dir, CKPT_DIR, str(int(step)), "actor")
    fmt = doc.get("actor_format", 1)
    if fmt == 1:
        stored = restore_tree(path, _legacy_actor_like(spec, config))
        return _from_legacy(stored, spec), params_digest(stored)
    if fmt == ACTOR_FORMAT:
        actor = make_actor(spec, config)
        params = restore_tree(path, jax.eval_shape(actor.init, jax.random.PRNGKey(0)))
        return params, params_digest(params)
    raise ValueError(f"{out_dir}: actor_format {fmt} is newer than this jaxil "
                     f"(knows 1..{ACTOR_FORMAT}); upgrade jaxil")


def load_actor_params(out_dir: str | os.PathLike, step: int,
                      doc: Optional[dict] = None) -> tuple[Any, str]:
    """`(params, digest)` of checkpoint `step` (any `actor_format`; the
    digest is that of the stored tree, see `_restore_actor`), checked
    against the digest a shipped teacher records."""
    doc = read_teacher(out_dir) if doc is None else doc
    params, digest = _restore_actor(out_dir, step, doc)
    want = (doc.get("params_sha256") or {}).get(str(int(step)))
    if want is not None and digest != want:
        path = os.path.join(out_dir, CKPT_DIR, str(int(step)), "actor")
        raise ValueError(
            f"{path}: the parameters' SHA-256 is {digest[:12]}… but {TEACHER_FILE} records "
            f"{want[:12]}…; the files are damaged (reinstall jaxil or restore the directory)"
        )
    return params, digest


def load_teacher(
    out_dir: str | os.PathLike, step: Optional[int] = None, deterministic: bool = False
) -> tuple[Callable, Any, EnvSpec]:
    """Load a teacher run (or a shipped teacher).

    Args:
      out_dir: the run directory (holds `teacher.json`).
      step: environment-step count of the checkpoint; `None` = the latest.
      deterministic: the greedy / mean-action policy instead of the stochastic
        one.

    Returns:
      `(policy, params, spec)`: an
      [`envs.policies.Policy`][jaxil.envs.policies.Policy] for one environment
      (`act`, `log_prob`, `entropy`), usable with
      [`envs.run_episodes`][jaxil.envs.rollout.run_episodes]; the actor
      parameters; the [`EnvSpec`][jaxil.envs.core.EnvSpec].
    """
    policy, params, spec, _ = load_checkpoint(out_dir, step, deterministic)
    return policy, params, spec


def load_checkpoint(
    out_dir: str | os.PathLike, step: Optional[int] = None, deterministic: bool = False
) -> tuple[Callable, Any, EnvSpec, str]:
    """[`load_teacher`][jaxil.teachers.io.load_teacher] plus the SHA-256 of the
    checkpoint's weights as stored (what datasets record), from one read."""
    doc = read_teacher(out_dir)
    steps = list_checkpoints(out_dir)
    if not steps:
        raise FileNotFoundError(f"{out_dir} has no checkpoints yet")
    if step is None:
        step = steps[-1]
    elif int(step) not in steps:
        raise ValueError(f"no checkpoint at step {step} in {out_dir}; available: {steps}")
    config = PPOConfig.from_dict(doc["config"])
    spec = EnvSpec.from_dict(doc["spec"])
    params, digest = load_actor_params(out_dir, step, doc)
    return make_policy(spec, config, deterministic=deterministic), params, spec, digest


def list_teacher_checkpoints(out_dir: str | os.PathLike) -> list[dict]:
    """The checkpoint entries of `teacher.json` (step, evaluations, ...)."""
    return read_teacher(out_dir)["checkpoints"]


# --------------------------------------------------------------------------
# Shipped teachers
# --------------------------------------------------------------------------
def shipped_teachers() -> dict[str, Path]:
    """`{env_id: directory}` of the teachers shipped inside the package."""
    out = {}
    if SHIPPED_DIR.is_dir():
        for d in sorted(SHIPPED_DIR.iterdir()):
            f = d / TEACHER_FILE
            if f.is_file():
                with open(f) as fh:
                    out[json.load(fh)["env_id"]] = d
    return out


def ship_teacher(run_dir: str | os.PathLike, dest: Optional[str | os.PathLike] = None) -> Path:
    """Copy a complete teacher run into the shipped format: every evaluated
    checkpoint's actor parameters (current `actor_format`, converted if the
    run is older) with their SHA-256, and `teacher.json` (no runner state,
    no metrics). `dest` defaults to `jaxil/teachers/shipped/<run name>`.
    Returns the directory written."""
    run_dir = Path(run_dir)
    doc = read_teacher(run_dir)
    if not doc.get("complete"):
        raise ValueError(f"{run_dir} is not a complete teacher run; let training finish first")
    dest = Path(dest) if dest is not None else SHIPPED_DIR / run_dir.name
    digests = {}
    with atomic_dir(dest) as tmp:
        for step in list_checkpoints(run_dir):
            params, _ = load_actor_params(run_dir, step, doc)
            cdir = tmp / CKPT_DIR / str(step)
            save_tree(cdir / "actor", params)
            shutil.copy2(run_dir / CKPT_DIR / str(step) / "checkpoint.json",
                         cdir / "checkpoint.json")
            digests[str(step)] = params_digest(params)
        shipped = dict(doc, actor_format=ACTOR_FORMAT, params_sha256=digests,
                       shipped_from=dict(run=run_dir.name, actor_format=doc.get("actor_format", 1)))
        write_json(tmp / TEACHER_FILE, shipped)
    return dest
