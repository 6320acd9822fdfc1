"""Is the refactored PPO trainer the same algorithm as before, not just
"as good"? Start it from the earlier trainer's initial weights and compare.

The policy-layer change renamed the teacher's flax modules, so the same seed
now draws different initial weights, and ``run.py`` can only compare returns
over seeds. This check removes that difference:

1. ``--dump FILE`` (run with the OLD checkout on the path) writes the initial
   actor and critic weights of ``train_teacher(env, preset, seed)``, and the
   actor after ``--chunks`` training chunks.
2. ``--replay FILE`` (the NEW checkout) converts them to the current layout,
   puts them into the new trainer's initial state (same key, same
   environments, same zero Adam moments), runs every chunk, evaluates the
   final actor exactly as ``train_teacher`` does, and compares with the old
   run's ``teacher.json`` (``--old-run DIR``) and its final actor weights;
   it also reports how far the two actors are apart after ``--chunks``
   chunks, and after ONE update on one full minibatch (``update_epochs=1``,
   ``num_minibatches=1``), where nothing but float rounding can separate
   two implementations of the same maths (Adam's normalised steps amplify
   rounding in near-zero gradients over many updates).

    PYTHONPATH=OLD python experiments/teacher_check/same_init.py --dump init.npz
    PYTHONPATH=NEW python experiments/teacher_check/same_init.py --replay init.npz --old-run DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import numpy as np


def _flat(tree) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _unflat(flat: dict, prefix: str) -> dict:
    """``{"['params']['_Torso_0']...": array}`` back into nested dicts."""
    out: dict = {}
    for k, v in flat.items():
        if not k.startswith(prefix):
            continue
        keys = [s.strip("'[]") for s in k[len(prefix):].split("][")]
        d = out
        for s in keys[:-1]:
            d = d.setdefault(s, {})
        d[keys[-1]] = v
    return out


def ONE_UPDATE(cfg):
    """One PPO update on one full minibatch."""
    return cfg.replace(updates_per_chunk=1, update_epochs=1, num_minibatches=1)


def _max_rel_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))) / (np.max(np.abs(np.asarray(y))) + 1e-30))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def dump(args) -> int:
    from jaxil import envs
    from jaxil.algorithms.rl.ppo import make_ppo
    from jaxil.teachers.presets import preset

    ppo = make_ppo(envs.make(args.env), preset(args.env))
    k_init, _ = jax.random.split(jax.random.PRNGKey(args.seed))
    runner = ppo.init(k_init)
    flat = {f"actor{k}": v for k, v in _flat(runner.actor.params).items()}
    flat.update({f"critic{k}": v for k, v in _flat(runner.critic.params).items()})
    one = make_ppo(envs.make(args.env), ONE_UPDATE(preset(args.env)))
    r1, _ = jax.jit(one.update_chunk)(runner)
    flat.update({f"one{k}": v for k, v in _flat(r1.actor.params).items()})
    chunk = jax.jit(ppo.update_chunk)
    for _ in range(args.chunks):
        runner, _ = chunk(runner)
    flat.update({f"after{k}": v for k, v in _flat(runner.actor.params).items()})
    np.savez(args.dump, **flat)
    print(f"wrote {len(flat)} arrays to {args.dump}")
    return 0


def replay(args) -> int:
    from flax.training.train_state import TrainState

    from jaxil.teachers.io import _from_legacy, legacy_mlp_variables, load_teacher, read_teacher
    from jaxil.teachers.train import _program
    from jaxil.teachers.presets import preset

    cfg = preset(args.env)
    prog = _program(args.env, (), cfg, ())
    spec = prog.spec
    k_init, k_eval = jax.random.split(jax.random.PRNGKey(args.seed))
    runner = prog.init(k_init)
    flat = dict(np.load(args.replay))
    old_actor = _unflat(flat, "actor")
    old_critic = _unflat(flat, "critic")

    def put(ts, params):
        return TrainState.create(apply_fn=ts.apply_fn, params=params, tx=ts.tx)

    actor_p = jax.tree.map(jax.numpy.asarray, _from_legacy(old_actor, spec))
    critic_p = jax.tree.map(jax.numpy.asarray, legacy_mlp_variables(old_critic))
    runner = runner._replace(actor=put(runner.actor, actor_p), critic=put(runner.critic, critic_p))
    from jaxil.algorithms.rl.ppo import make_ppo

    one = make_ppo(prog.env, ONE_UPDATE(cfg))
    r1, _ = jax.jit(one.update_chunk)(runner)
    one_update = _max_rel_diff(r1.actor.params, _from_legacy(_unflat(flat, "one"), spec))
    chunk, _ = prog.chunk(runner)
    after = _from_legacy(_unflat(flat, "after"), spec)
    t0 = time.perf_counter()
    early = None
    for i in range(cfg.num_chunks):
        runner, _ = chunk(runner)
        if i + 1 == args.chunks:
            early = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
                        zip(jax.tree.leaves(runner.actor.params), jax.tree.leaves(after)))
    jax.block_until_ready(runner)
    ev = prog.evaluate(runner.actor.params, k_eval, args.eval_episodes)
    old = read_teacher(args.old_run)
    old_ev = old["checkpoints"][-1]
    _, old_params, _ = load_teacher(args.old_run, step=old_ev["step"])
    diffs = [float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
             for a, b in zip(jax.tree.leaves(runner.actor.params), jax.tree.leaves(old_params))]
    res = dict(env_id=args.env, seed=args.seed, env_steps=cfg.env_steps,
               train_seconds=time.perf_counter() - t0,
               new_final_eval=ev, old_final_eval={k: old_ev[k] for k in
                                                  ("eval_stochastic", "eval_deterministic")},
               max_rel_weight_difference_one_update=one_update,
               chunks_compared_early=args.chunks,
               max_abs_weight_difference_early=early,
               max_abs_weight_difference=max(diffs),
               identical_weights=all(d == 0.0 for d in diffs))
    print(json.dumps(res, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="smax:3m")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dump", metavar="FILE")
    p.add_argument("--replay", metavar="FILE")
    p.add_argument("--old-run", metavar="DIR", help="the old code's train_teacher output")
    p.add_argument("--eval-episodes", type=int, default=128)
    p.add_argument("--chunks", type=int, default=1,
                   help="compare the actors after this many chunks too")
    p.add_argument("--out", help="write the comparison as JSON here")
    args = p.parse_args(argv)
    if bool(args.dump) == bool(args.replay):
        raise SystemExit("error: give exactly one of --dump FILE or --replay FILE")
    if args.replay and not args.old_run:
        raise SystemExit("error: --replay needs --old-run DIR (the old code's run to compare with)")
    return dump(args) if args.dump else replay(args)


if __name__ == "__main__":
    sys.exit(main())
