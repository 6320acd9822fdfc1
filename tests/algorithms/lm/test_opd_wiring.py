"""The wiring of on-policy distillation
([`jaxil.algorithms.lm.distill`][jaxil.algorithms.lm.distill]): what it passes
into [`jaxil.losses.distillation_loss`][jaxil.losses.distill.distillation_loss]
(both networks' logits at the same steps, the SFT loss mask, β), the stopped
expert gradient, the budget's count and the refusal of a scripted expert.
Cheap: a few `tokens:arith` episodes and two tiny transformers. Each test names
the wiring bug it kills."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm import distill as OPD
from jaxil.algorithms.lm import sft
from jaxil.envs.experts import scripted_expert
from jaxil import losses as L
from jaxil.losses import agent_token_mask
from jaxil.nn import distributions as D
from jaxil.nn.transformer import TransformerPolicy, config_for_env

from helpers.fast_compile import fast_call


def distillation_loss(s, e, avail, mask, beta=1.0):
    """The loss of the logits `s` (student) and `e` (expert): the library's
    takes log-probabilities normalised over the legal tokens."""
    return L.distillation_loss(D.categorical_log_probs(s, avail), D.categorical_log_probs(e, avail),
                               avail, mask, beta=beta)


@pytest.fixture(scope="module")
def env():
    return envs.make("tokens:arith", num_ops=1)


@pytest.fixture(scope="module")
def setup(env):
    """(student, its params, expert LM, its params, 4 episodes with padding)."""
    student = TransformerPolicy(config_for_env(env, "tiny"))
    expert = TransformerPolicy(config_for_env(env, "tiny"))
    params = student.init(jax.random.PRNGKey(0))
    expert_params = expert.init(jax.random.PRNGKey(1))
    # A sharper expert than a fresh init: its logits scaled up, so that its
    # distribution differs clearly from step to step.
    expert_params = jax.tree.map(lambda x: 3.0 * x, expert_params)
    policy = scripted_expert(env)[0]
    eps = fast_call(lambda k: envs.run_episodes(env, policy, None, k, 4), jax.random.PRNGKey(2))
    batch = sft.from_episodes(env, eps)
    return student, params, expert, expert_params, batch


def _logits(policy, params, batch):
    return fast_call(jax.vmap(policy.chunk_logits, in_axes=(None, 0)), params, batch.obs)


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_opd_loss_passes_both_networks_same_steps_and_the_sft_mask(setup, beta):
    """Kills each wrong argument of the wiring: the loss equals
    `distillation_loss` of the student's and the expert's teacher-forced
    logits on the same episodes under the SFT mask (valid steps, choice
    tokens), and is far from it with the loss mask shifted one step, the
    expert's logits from the neighbouring step, the two networks swapped
    (the KL direction, for β ≠ 1/2), the forced tokens counted, or another
    β."""
    student, params, expert, expert_params, batch = setup
    s, e = _logits(student, params, batch), _logits(expert, expert_params, batch)
    n = batch.actions.shape[-1]
    mask = jax.vmap(agent_token_mask, in_axes=(0, None, 0))(batch.mask, n, batch.avail)
    got = float(fast_call(lambda p: OPD.opd_loss(student, p, expert, expert_params, batch, beta),
                          params))
    want = float(distillation_loss(s, e, batch.avail, mask, beta))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got > 0.1

    forced = jax.vmap(agent_token_mask, in_axes=(0, None))(batch.mask, n)
    wrong = {
        "mask one step late": distillation_loss(s, e, batch.avail, jnp.roll(mask, 1, axis=1), beta),
        "mask one step early": distillation_loss(s, e, batch.avail, jnp.roll(mask, -1, axis=1), beta),
        "expert one step late": distillation_loss(s, jnp.roll(e, 1, axis=1), batch.avail, mask, beta),
        "expert one step early": distillation_loss(s, jnp.roll(e, -1, axis=1), batch.avail, mask, beta),
        "forced tokens counted": distillation_loss(s, e, batch.avail, forced, beta),
        "other beta": distillation_loss(s, e, batch.avail, mask, 0.0 if beta == 1.0 else 1.0),
    }
    if beta != 0.5:  # JSD_0.5 is symmetric
        wrong["networks swapped"] = distillation_loss(e, s, batch.avail, mask, beta)
    for name, value in wrong.items():
        assert abs(float(value) - got) > 0.02 * got, name


def test_opd_loss_is_zero_against_itself_and_trains_the_student_only(setup):
    """Kills a gradient into the expert's parameters (a missing stop-gradient
    in the wiring: the expert would drift towards the student) and a loss
    that does not reach the student's: the student distilled from itself
    has loss 0; the gradient w.r.t. the expert's parameters is exactly 0,
    the student's is not."""
    student, params, expert, expert_params, batch = setup
    assert abs(float(fast_call(lambda p: OPD.opd_loss(student, p, student, p, batch), params))) < 1e-6
    g_s, g_e = fast_call(jax.grad(lambda p, q: OPD.opd_loss(student, p, expert, q, batch),
                                  argnums=(0, 1)), params, expert_params)
    assert all(float(jnp.max(jnp.abs(x))) == 0.0 for x in jax.tree.leaves(g_e))
    assert max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(g_s)) > 1e-4


def test_expert_tokens_scored_counts_every_speaking_token(setup, env):
    """Kills a budget that counts padding steps, `<wait>` tokens of the agent
    off turn, or only the loss mask's choice tokens (forced on-turn tokens
    are read from the expert too): a numpy count of the valid steps' agent
    tokens whose legal set is not `<wait>` alone."""
    *_, batch = setup
    avail, valid = np.asarray(batch.avail), np.asarray(batch.mask)
    assert not valid.all()  # the episodes end before max_steps: padding to leave out
    only_wait = avail[..., batch.wait] & (avail.sum(-1) == 1)
    want = (valid[..., None] & ~only_wait).sum(axis=(1, 2))
    got = np.asarray(OPD.expert_tokens_scored(batch))
    np.testing.assert_array_equal(got, want)
    choice = avail.sum(-1) > 1
    assert (got > (valid[..., None] & choice).sum(axis=(1, 2))).any()


def test_a_scripted_expert_or_another_vocabulary_is_refused_in_one_line(setup, env):
    """Kills OPD silently running with an expert that has no distribution (a
    scripted expert) or an LM over another task's tokens."""
    student, _, expert, _, _ = setup
    assert OPD.check_expert_lm(student, expert) is expert
    with pytest.raises(ValueError, match="needs an expert LM") as info:
        OPD.check_expert_lm(student, scripted_expert(env)[0])
    assert "\n" not in str(info.value)
    other = TransformerPolicy(config_for_env(envs.make("tokens:repair"), "tiny"))
    if (other.config.vocab_size, other.config.token_width) != (student.config.vocab_size,
                                                                 student.config.token_width):
        with pytest.raises(ValueError, match="same task") as info:
            OPD.check_expert_lm(student, other)
        assert "\n" not in str(info.value)
