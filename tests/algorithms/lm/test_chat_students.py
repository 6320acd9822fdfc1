"""A pretrained model as the student of a chat-form token task: its decoder
in its own vocabulary (`chat_model`), SFT and the interactive learners on
it, and `jaxil lm sft|interactive --model M --chat`, with a tiny GGUF the
test writes (the byte-level BPE and chat template of helpers.pretrained)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm import interactive as TI
from jaxil.algorithms.lm import reward as R
from jaxil.algorithms.lm import sft
from jaxil.algorithms.lm.turns import speaking
from jaxil.cli.main import main
from jaxil.envs.token_chat import ChatEnv, chat_expert
from jaxil.nn.task_vocab import chat_model
from jaxil.nn.transformer import TransformerPolicy
from jaxil.pretrained import CheckpointError
from jaxil.pretrained.load import load_checkpoint

ARITH = ["--env", "tokens:arith", "--task-knob", "num_ops=1"]


@pytest.fixture(scope="module")
def gguf(tiny_gguf):
    return tiny_gguf


@pytest.fixture(scope="module")
def chat(gguf):
    ckpt = load_checkpoint(gguf)
    return ChatEnv.from_model(envs.make("tokens:arith", num_ops=1), ckpt), ckpt


def test_chat_model_is_the_model_in_its_own_vocabulary(chat):
    """`chat_model` keeps every parameter of the checkpoint (identity
    vocabulary: the embedding is the model's, row for row), takes the chat
    form's token width and context, pads with token 0, and passes SFT's
    check; the private-vocabulary task and a chat form of another vocabulary
    are refused. Fails if the vocabulary axis is gathered or permuted, or a
    chat student keeps the model's own padding convention."""
    env, ckpt = chat
    model = chat_model(ckpt, env)
    c = model.config
    assert (c.vocab_size, c.token_width, c.max_context, c.pad_id) == (
        ckpt.arch.vocab_size, env.token_width, env.max_context, 0)
    np.testing.assert_array_equal(np.asarray(model.params["params"]["token_embed"]["embedding"]),
                                  np.asarray(ckpt.params["embed.embedding"], np.float32))
    assert model.vocab.is_identity and "own vocabulary of 270" in model.vocab.describe()
    sft.check_model(env, sft.SFTConfig(), model)
    with pytest.raises(CheckpointError, match="not a chat form"):
        chat_model(ckpt, env.inner)
    other = dataclasses.replace(model, config=dataclasses.replace(c, max_context=c.max_context - 1))
    with pytest.raises(ValueError, match="another task or setting"):
        sft.check_model(env, sft.SFTConfig(), other)


def test_chat_flags_are_refused_in_one_line(capsys):
    """`--chat` without `--model`, `--constrained` without `--chat` and an
    interactive `--model` without `--chat` each exit 1 with one line naming
    the fix."""
    for argv, needle in (
            (["lm", "sft", *ARITH, "--chat"], "--chat renders the task as text"),
            (["lm", "sft", *ARITH, "--constrained"], "add --chat"),
            (["lm", "interactive", "oec", *ARITH, "--budget", "100", "--model", "x.gguf"],
             "add --chat to --model")):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err and needle in err, err


@pytest.mark.slow  # an SFT program on a 922-token context (~40 s)
def test_sft_teaches_a_pretrained_student_the_chat_form(chat):
    """Twenty full fine-tuning updates on the transcript expert's chats cut
    the tiny model's held-out NLL of the assistant tokens by more than 3
    nats. Fails if the loss mask covers the template's text instead of the
    assistant's (the held-out score reads the same mask), or the gradient
    does not reach the model's parameters."""
    env, ckpt = chat
    model = chat_model(ckpt, env)
    demos = sft.collect_demos(env, chat_expert(env), None, jax.random.key(0), 40)
    assert float(demos.won.mean()) == 1.0
    cfg = sft.SFTConfig(num_updates=20, eval_every=20, batch_episodes=8, eval_episodes=2,
                        learning_rate=3e-3)
    res = sft.train_sft(env, demos.take(slice(0, 32)), cfg, seeds=[0],
                        heldout=demos.take(slice(32, 40)), model=model)
    nll = {r["update"]: r["eval_nll"] for r in res.rows}
    assert nll[20] < nll[0] - 3.0, nll


@pytest.mark.slow  # three learners' programs with a pretrained student (~1 min)
def test_interactive_learners_run_with_a_pretrained_chat_student(chat):
    """BC, DAgger and OEC run end to end from the model's parameters (no
    `size`), spend expert tokens within their budget and record the model's
    digest in the run's identity."""
    env, ckpt = chat
    model = chat_model(ckpt, env)
    cfg = TI.TokenInteractiveConfig(rounds=1, episodes_per_round=4, updates_per_round=5,
                                    sft_tokens=100, sft_updates=5, batch_episodes=4,
                                    eval_episodes=2)
    regs = [(m, TI.token_regime(m, 300, sft_tokens=100)) for m in ("bc", "dagger", "oec")]
    with pytest.warns(TI.BudgetUnderspent):
        res = TI.run(env, chat_expert(env, "transcript"), None, regs, seeds=1, config=cfg,
                     model=model)
    table = {g["regime"]: g for g in res.summary["regimes"]}
    assert set(table) == {"bc", "dagger", "oec"}
    assert all(0 < g["expert_tokens_mean"] <= 300 for g in table.values())
    ident = TI.identity(env, regs, 1, cfg, 0, "transcript", model)
    assert len(ident["model"]) == 16


@pytest.mark.slow  # an SFT run through the command line, then its export loaded back (~1 min)
def test_cli_sft_chat_exports_a_model_that_acts_in_the_chat_form(gguf, tmp_path, capsys):
    """`jaxil lm sft --model GGUF --chat --constrained --out DIR` fine-tunes
    the model in the chat form and exports it; the export loads as a
    checkpoint with the same vocabulary, tokenizer and template, and its
    chat form is the same environment."""
    out = tmp_path / "run"
    assert main(["lm", "sft", *ARITH, "--model", str(gguf), "--chat", "--constrained",
                 "--demos", "8", "--heldout", "2", "--updates", "4", "--eval-every", "2",
                 "--batch-episodes", "2", "--eval-episodes", "1", "--out", str(out),
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "chat form of tokens:arith" in printed and "constrained" in printed
    back = load_checkpoint(out / "hf")
    again = ChatEnv.from_model(envs.make("tokens:arith", num_ops=1), back, constrained=True)
    assert again.spec == ChatEnv.from_model(envs.make("tokens:arith", num_ops=1),
                                            load_checkpoint(gguf), constrained=True).spec
    assert back.arch.vocab_size == 270



@pytest.mark.slow  # a chat rollout and a scoring program (~11 s)
def test_reward_model_on_a_pretrained_base_reads_its_logits(chat):
    """A sequence reward model on the pretrained chat model starts from the
    model's own parameters and scores an episode as the sum of the model's
    logits at the tokens the assistant wrote: a float64 numpy reference
    over the speaking mask. Fails if the base is replaced by a fresh
    network of `config.size`, or the reads are taken at the template's
    tokens instead of the assistant's."""
    env, ckpt = chat
    model = chat_model(ckpt, env)
    rm = R.SequenceRewardModel(env, R.SequenceRewardConfig(read="token"), model)
    base = rm.init(jax.random.key(0))
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(base),
                                                   jax.tree.leaves(model.params)))
    pos = sft.collect_demos(env, chat_expert(env), None, jax.random.key(1), 2)
    net = TransformerPolicy(model.config)
    scores = np.asarray(jax.jit(rm.scores)(base, pos), np.float64)
    for e in range(2):
        ep = pos.take(slice(e, e + 1))
        logits = np.asarray(net.chunk_logits(model.params, ep.obs[0]), np.float64)
        picked = np.take_along_axis(logits, np.asarray(ep.actions[0])[..., None], -1)[..., 0]
        says = np.asarray(speaking(ep.avail[0], ep.mask[0], wait=env.wait_token), bool)
        np.testing.assert_array_equal(np.asarray(rm.read_masks(ep)[0], bool), says)
        assert 0 < says.sum() < np.asarray(ep.mask[0]).sum()
        np.testing.assert_allclose(scores[e], picked[says].sum(), rtol=1e-5, atol=1e-3)


@pytest.mark.slow  # sampled chats of the model and a reward-model program (~1 min)
def test_reward_model_on_a_pretrained_base_learns_to_separate(chat):
    """Twenty updates of a last-token reward model on the pretrained base
    score every one of the transcript expert's chats (positive) above every
    one of the untrained model's sampled chats (negative) it was trained
    on. Fails if the discriminator's sign is flipped (the order reverses)
    or the gradient does not reach the base's parameters (the scores stay
    those of the random base, which interleave). With 24 chats a side the
    tiny random base does not generalise to held-out chats within 30
    updates, so this checks the fit only."""
    env, ckpt = chat
    model = chat_model(ckpt, env)
    net = TransformerPolicy(model.config)
    pos = sft.collect_demos(env, chat_expert(env), None, jax.random.key(1), 12)
    neg = jax.tree.map(lambda x: x[0], R.policy_episodes(
        env, net, jax.tree.map(lambda x: x[None], model.params), jax.random.key(2), 12))
    cfg = R.SequenceRewardConfig(read="last", batch_episodes=4, learning_rate=3e-3,
                                 num_updates=20, eval_every=20)
    rm = R.SequenceRewardModel(env, cfg, model)
    before_p, before_n = np.asarray(rm.scores(model.params, pos)), np.asarray(
        rm.scores(model.params, neg))
    assert not before_p.min() > before_n.max()
    data = R.RewardEpisodes.build(env, pos, neg)
    res = R.train_reward_model(env, jax.tree.map(lambda x: x[None], data), cfg, seeds=[0],
                               labels=["demo-init"], model=model)
    params = jax.tree.map(lambda x: x[0], res.state.params)
    s_p, s_n = np.asarray(rm.scores(params, pos)), np.asarray(rm.scores(params, neg))
    assert s_p.min() > s_n.max(), (s_p, s_n)


@pytest.mark.slow  # RL rollouts and updates of the tiny pretrained model in the chat form (~1 min)
def test_rl_against_a_learned_reward_trains_a_pretrained_chat_policy(chat):
    """`train_align(..., model=)` runs RL on the pretrained model's decoder
    from its parameters: at update 0 the policy is π_SFT itself (KL 0),
    after the updates its parameters have moved and the KL to π_SFT is
    positive. Without `model` the decoder's parameters are refused in one
    line naming `model=`. Fails if the policy is built from
    `AlignConfig.size` instead of the model, or the reference is the
    moving policy (the KL would stay 0)."""
    from jaxil.algorithms.lm import align as A

    env, ckpt = chat
    model = chat_model(ckpt, env)
    rm = R.SequenceRewardModel(env, R.SequenceRewardConfig(read="last"), model)
    stack = lambda tree: jax.tree.map(lambda x: x[None], tree)  # noqa: E731
    cfg = A.AlignConfig(prompts=2, rollouts_per_prompt=2, learning_rate=1e-3, num_updates=4,
                        eval_every=4, eval_episodes=2)
    res = A.train_align(env, R.token_rewards_of(rm), stack(model.params), stack(model.params),
                        [0.1], [0], cfg, model=model)
    kl = {r["update"]: r["eval_kl"] for r in res.rows}
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[4] > 0, kl
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a[0], np.float32)
                                                   - np.asarray(b, np.float32)).max()),
                         res.state.params, model.params)
    assert max(jax.tree.leaves(moved)) > 0
    with pytest.raises(ValueError, match="model="):
        A.align_program(env, R.token_rewards_of(rm), stack(model.params), stack(model.params),
                        [0.1], [0], cfg)
