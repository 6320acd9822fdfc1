"""SFT of the transformer on token episodes (:mod:`jaxil.algorithms.lm.sft`):
it learns the scripted expert's episodes, a flipped objective unlearns them,
a stopped run resumes to the same rows, and demonstrations of another
environment are refused in one line.

The fast tests share one module-scoped run on ``tokens:arith`` with one
operation (``CALC a op b``, then ``SUBMIT`` the result: copying tokens from
the prompt and from the tool's answer); the compiled programs are shared
through the persistent compilation cache.
"""

import dataclasses

import jax
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm import sft
from jaxil.envs.experts import scripted_expert
from jaxil.runs import engine

from helpers.fast_compile import fast_call

CFG = sft.SFTConfig(num_updates=40, eval_every=20, batch_episodes=8, eval_episodes=32,
                    learning_rate=3e-3)
NUM_DEMOS, NUM_HELDOUT = 96, 32


@pytest.fixture(scope="module")
def env():
    return envs.make("tokens:arith", num_ops=1)


@pytest.fixture(scope="module")
def demos(env):
    """(training demos, held-out demos) of the scripted expert, one rollout."""
    expert = scripted_expert(env)[0]
    both = sft.collect_demos(env, expert, None, jax.random.PRNGKey(1), NUM_DEMOS + NUM_HELDOUT)
    return both.take(slice(0, NUM_DEMOS)), both.take(slice(NUM_DEMOS, None))


@pytest.fixture(scope="module")
def trained(env, demos, tmp_path_factory):
    """The uninterrupted run (2 chunks of 20 updates), in a run directory."""
    train, held = demos
    out = tmp_path_factory.mktemp("sft") / "full"
    return sft.train_sft(env, train, CFG, seeds=(0,), heldout=held, out_dir=out)


def _row(result, update):
    (row,) = [r for r in result.rows if r["update"] == update]
    return row


@pytest.mark.slow
def test_sft_student_learns_the_expert_episodes(env, demos, trained):
    """The untrained student never solves the task and scores the expert's
    tokens near chance; after 40 updates on 96 demonstrations its own
    greedy rollouts solve most instances (the expert solves all) and it
    predicts the expert's held-out tokens. Kills: a loss that does not reach
    the parameters, a mask that trains on padding only, and an evaluation
    that does not use the trained parameters."""
    train, _ = demos
    expert_win = float(np.mean(train.won))
    start, end = _row(trained, 0), _row(trained, CFG.num_updates)
    assert expert_win == 1.0
    assert start["eval_win_rate"] <= 0.1 and start["eval_accuracy"] < 0.5
    assert end["eval_win_rate"] >= 0.8 and end["eval_win_rate"] <= expert_win
    assert end["eval_accuracy"] > 0.9
    assert end["eval_nll"] < 0.25 * start["eval_nll"]
    assert trained.summary["points"][0]["win_mean"] == end["eval_win_rate"]
    assert trained.summary["update"] == CFG.num_updates


@pytest.mark.slow
def test_negated_sft_loss_makes_the_expert_tokens_less_likely(env, demos, trained, monkeypatch):
    """The same run with the learner's loss negated (gradient ascent on the
    NLL) makes the held-out expert tokens LESS likely, while the real loss
    makes them more likely. Kills a flipped objective (``+Σ m·log π``) in
    :func:`sft.sft_loss` or :func:`masked_sequence_nll`."""
    train, held = demos
    real = sft.sft_loss
    monkeypatch.setattr(sft, "sft_loss", lambda *a, **k: -real(*a, **k))
    cfg = dataclasses.replace(CFG, num_updates=20, eval_every=20)
    flipped = sft.train_sft(env, train, cfg, seeds=(0,), heldout=held)
    assert _row(flipped, 20)["eval_nll"] > _row(flipped, 0)["eval_nll"] + 0.5
    assert _row(trained, CFG.num_updates)["eval_nll"] < _row(trained, 0)["eval_nll"]


@pytest.mark.slow
def test_sft_stopped_after_one_chunk_and_resumed_repeats_the_uninterrupted_rows(
        env, demos, trained, tmp_path):
    """A run stopped after the first of its 2 chunks (as a kill would) and
    resumed from its checkpoint gives the uninterrupted run's metrics rows
    exactly. Kills an update or minibatch key that is not carried in the
    checkpointed state, and an evaluation key that depends on the session."""
    train, held = demos
    ident = sft.sft_identity(env, train, CFG, (0,), held)
    stopped = engine.run(sft.sft_program(env, train, CFG, (0,), held),
                         rundir=engine.open_run(tmp_path, ident, step_key="update"),
                         stop_after_chunks=1, progress=False)
    assert not stopped.summary["complete"]
    assert [r["update"] for r in stopped.rows] == [0, CFG.eval_every]
    resumed = sft.train_sft(env, train, CFG, seeds=(0,), heldout=held, out_dir=tmp_path,
                            resume=True)
    assert resumed.rows == trained.rows
    with pytest.raises(ValueError, match="differ"):
        sft.train_sft(env, train, dataclasses.replace(CFG, learning_rate=1e-3), seeds=(0,),
                      heldout=held, out_dir=tmp_path, resume=True)


def test_sft_refuses_demos_of_another_environment_in_one_line(env, demos):
    """Demonstrations of another task, of the same task at another
    difficulty (other widths), or with a field cut, raise a one-line
    ValueError naming the problem. Kills a check that only compares ids,
    and one that lets a shape error surface deep inside jit."""
    train, held = demos
    assert train.obs.shape[-1] == env.token_width  # no privileged columns kept
    harder = envs.make("tokens:arith", num_ops=2)
    cases = [
        (env, train.replace(env_id="tokens:repair"), "come from tokens:repair"),
        (harder, train, "field `obs` has shape"),
        (env, train.replace(actions=train.actions[:, :-1]), "field `actions` has shape"),
        (env, train.replace(avail=train.avail[..., :-1]), "field `avail` has shape"),
        (env, train.take(slice(0, 0)), "hold no episode"),
    ]
    for e, d, msg in cases:
        with pytest.raises(ValueError, match=msg) as info:
            sft.sft_program(e, d, CFG, (0,))
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="heldout demos"):
        sft.sft_program(env, train, CFG, (0,), heldout=held.replace(env_id="tokens:exchange"))
    with pytest.raises(ValueError, match="multiple of eval_every"):
        sft.SFTConfig(num_updates=30, eval_every=20)


@pytest.mark.slow
def test_sft_learns_a_two_step_chain():
    """On ``tokens:arith`` with two operations (copying the first result
    into the second ``CALC``) 400 updates on 256 demonstrations take the
    student from no success to most instances."""
    env = envs.make("tokens:arith", num_ops=2)
    expert = scripted_expert(env)[0]
    both = sft.collect_demos(env, expert, None, jax.random.PRNGKey(1), 320)
    train, held = both.take(slice(0, 256)), both.take(slice(256, None))
    cfg = dataclasses.replace(CFG, num_updates=400, eval_every=200, eval_episodes=64,
                              batch_episodes=16)
    result = sft.train_sft(env, train, cfg, seeds=(0,), heldout=held)
    assert _row(result, 0)["eval_win_rate"] <= 0.1
    assert _row(result, 400)["eval_win_rate"] >= 0.8
    assert _row(result, 400)["eval_accuracy"] > 0.9


def _np_fit(logits, avail, actions, mask):
    """float64 reference of the masked NLL and greedy accuracy."""
    z = np.where(avail, np.asarray(logits, np.float64), -1e30)
    logp = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - z.max(-1, keepdims=True)
    lp = np.take_along_axis(logp, actions[..., None], -1)[..., 0]
    hit = z.argmax(-1) == actions
    return -lp[mask].sum() / mask.sum(), hit[mask].mean()


def test_sft_loss_and_heldout_fit_leave_out_the_tokens_the_grammar_forces(env, demos):
    """The SFT loss and the held-out NLL and accuracy count the valid
    tokens that had a choice (more than one legal token), not the forced
    ``<eot>`` / ``<wait>`` (one legal token, always 'right'), and count
    all valid tokens with ``forced_tokens=True``; checked against a float64
    reference on an untrained student. Kills building the token mask
    without the legal masks (``agent_token_mask(valid, n)``), which dilutes
    the loss and inflates the reported held-out accuracy, and a mask that
    keeps the padding after an episode's end. (One compiled program, XLA
    level 0: the transformer passes dominate.)"""
    held = demos[1].take(slice(0, 6))
    student = sft.make_student(env, CFG)
    params = sft.initial_params(student, 0)

    def fit(params, held):
        out = {forced: (sft.sft_loss(student, params, held, forced),
                        sft.score_demos(student, params, held, forced))
               for forced in (False, True)}
        return jax.vmap(student.chunk_logits, in_axes=(None, 0))(params, held.obs), out

    logits, out = fast_call(fit, params, held)
    avail, actions = np.asarray(held.avail), np.asarray(held.actions)
    valid = np.broadcast_to(np.asarray(held.mask)[:, :, None], actions.shape)
    choice = valid & (avail.sum(-1) > 1)
    assert (valid & ~choice).sum() > 0.2 * valid.sum()  # many forced tokens to leave out
    assert choice.sum() > 0 and not valid.all()  # and padding
    for forced, mask in ((False, choice), (True, valid)):
        nll, acc = _np_fit(logits, avail, actions, mask)
        loss, scored = out[forced]
        np.testing.assert_allclose(float(loss), nll, rtol=1e-4)
        np.testing.assert_allclose(float(scored["nll"]), nll, rtol=1e-4)
        np.testing.assert_allclose(float(scored["accuracy"]), acc, rtol=1e-6)
    # The two masks give clearly different numbers, so the check above has power.
    assert float(out[True][1]["accuracy"]) > float(out[False][1]["accuracy"]) + 0.1


def test_sft_program_threads_forced_tokens_to_its_loss_and_heldout_fit(env, demos, monkeypatch):
    """The program's update and held-out evaluation build their token masks
    with the configuration's ``forced_tokens`` (traced, not compiled).
    Kills an update or evaluation that calls the loss or the fit with the
    default instead of the configuration (the held-out accuracy would then
    count the forced tokens of a run configured to leave them out, or the
    reverse); the non-default setting is the one that tells."""
    train, held = demos
    seen = []
    real = sft._token_mask
    monkeypatch.setattr(sft, "_token_mask",
                        lambda batch, forced: seen.append(forced) or real(batch, forced))
    cfg = dataclasses.replace(CFG, forced_tokens=True, eval_episodes=2)
    program = sft.sft_program(env, train.take(slice(0, 8)), cfg, (0,),
                              heldout=held.take(slice(0, 4)))
    state = jax.eval_shape(program.init)
    jax.eval_shape(program.chunk, state, 0)
    jax.eval_shape(program.evaluate, state, 0)
    assert seen == [True, True], seen  # the update's loss, then the held-out fit
