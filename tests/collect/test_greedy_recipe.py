"""The `-greedy` recipe suffix: the expert tier acts on its teacher's mode.

The cheap tests parse names and refuse a greedy expert without a teacher;
the build test collects a tiny SMAX 3m recipe twice (greedy and plain) from
the shipped teacher and is `slow` for its compile time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil.cli.main import main
from jaxil.collect import recipes as rc
from jaxil.collect.zoo import teacher_path
from jaxil.teachers.io import load_checkpoint


def test_the_greedy_suffix_parses_before_dart_and_nowhere_else():
    """Kills: the suffix parsed but not passed on (`greedy_expert` False),
    a greedy recipe sharing the plain recipe's file, `-dart` parsed before
    `-greedy` (both orders accepted would give two names for one dataset), and
    the zero-noise message dropping `-greedy` from the name it suggests."""
    plain = rc.get_recipe("mamujoco-hopper_3x1/misodice-200e-1000p")
    greedy = rc.get_recipe("mamujoco-hopper_3x1/misodice-200e-1000p-greedy")
    both = rc.get_recipe("mamujoco-hopper_3x1/misodice-200e-1000p-greedy-dart0.5")
    assert (plain.greedy_expert, greedy.greedy_expert, both.greedy_expert) == (False, True, True)
    assert (greedy.action_noise, both.action_noise) == (0.0, 0.5)
    assert greedy.counts == plain.counts and "greedy" in greedy.description
    assert greedy.default_path() != plain.default_path()
    assert not rc.get_recipe("mpe-simple_spread_continuous/expert-dart0.8").greedy_expert
    with pytest.raises(KeyError, match="jaxil data list"):
        rc.get_recipe("mamujoco-hopper_3x1/misodice-200e-1000p-dart0.5-greedy")
    with pytest.raises(KeyError, match="noise level > 0") as e:
        rc.get_recipe("smax-3m/expert-greedy-dart0")
    assert e.value.args[0].endswith("without noise use smax-3m/expert-greedy")


def test_a_greedy_recipe_without_a_teacher_is_one_line_and_writes_nothing(tmp_path, capsys):
    """A scripted expert has no sampled policy to take the mode of: one line
    naming the suffix, exit 1, no file. Kills: a greedy build that silently
    records the scripted expert as if it were greedy."""
    out = tmp_path / "g.npz"
    argv = ["data", "build", "mpe-simple_spread_continuous/mix-2e-2p-greedy", "--no-teacher",
            "--measure-episodes", "0", "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a teacher" in err[0] and "-greedy" in err[0], err
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.slow  # compiles three SMAX collectors (~40 s); run with -m slow
def test_a_greedy_build_records_the_mode_and_keeps_the_poor_trajectories(tmp_path):
    """On SMAX 3m's shipped teacher, 4 expert + 4 poor episodes, greedy and
    plain. Every recorded expert action is the teacher's argmax at the
    recorded observation and available actions; the plain build's expert
    actions are not (it samples); the poor trajectories are byte-for-byte the
    plain build's (same seeds, same checkpoint); the creation args say so.
    Kills: the suffix parsed but the sampling expert collected, the mode
    taken of another checkpoint, the poor tier also made greedy, and a
    greedy key written into plain builds (which would change their bytes)."""
    tiny = dict(counts={"expert": 4, "poor": 4}, chunk_size=4, measure_episodes=0,
                progress=False)
    greedy = rc.build("smax-3m/misodice-200e-1000p-greedy", 0, tmp_path / "g.npz", **tiny)
    plain = rc.build("smax-3m/misodice-200e-1000p", 0, tmp_path / "p.npz", **tiny)
    args_g, args_p = greedy.info.creation_args, plain.info.creation_args
    assert "greedy_expert" in args_g and "greedy_expert" not in args_p
    assert args_g["zoo"]["expert"]["source"] == args_p["zoo"]["expert"]["source"] + " (greedy)"
    assert args_g["zoo"]["expert"]["step"] == args_p["zoo"]["expert"]["step"]

    # The reference mode: the sampling policy's most likely available action,
    # from its log-probabilities at the same checkpoint.
    expert = args_p["zoo"]["expert"]
    pol, params, spec, _ = load_checkpoint(teacher_path(expert["teacher_dir"]),
                                           step=expert["step"])
    every = jnp.arange(spec.action.num_actions)

    def mode(o, a):  # [N, O], [N, A] -> [N]
        logp = jax.vmap(lambda b: pol.log_prob(params, o, a, jnp.full(o.shape[:1], b)))(every)
        return jnp.argmax(jnp.where(a.T.astype(bool), logp, -jnp.inf), axis=0)

    modes = jax.jit(jax.vmap(jax.vmap(mode)))

    def expert_steps(ds):
        idx = np.flatnonzero(ds.expert)
        t = ds.actions.shape[1]  # observations and availability also hold the last state
        want = np.asarray(modes(jnp.asarray(ds.obs[idx, :t]),
                                jnp.asarray(ds.avail_actions[idx, :t])))
        live = ds.mask[idx].astype(bool)
        return want[live], ds.actions[idx][live]

    want, got = expert_steps(greedy)
    np.testing.assert_array_equal(got, want)
    want_p, got_p = expert_steps(plain)
    assert (got_p != want_p).mean() > 0.05  # the sampling expert leaves its mode

    poor_g, poor_p = np.flatnonzero(~greedy.expert), np.flatnonzero(~plain.expert)
    order_g, order_p = poor_g[np.argsort(greedy.seed[poor_g])], poor_p[np.argsort(plain.seed[poor_p])]
    np.testing.assert_array_equal(greedy.seed[order_g], plain.seed[order_p])
    for field in ("obs", "actions", "reward", "mask"):
        np.testing.assert_array_equal(getattr(greedy, field)[order_g],
                                      getattr(plain, field)[order_p])
