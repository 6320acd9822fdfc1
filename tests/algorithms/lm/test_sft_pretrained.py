"""SFT of a pretrained model on token episodes: full fine-tuning and LoRA
(jaxil.algorithms.lm.sft with `model=`, jaxil.nn.lora).

The model is a tiny Llama GGUF the test writes (tests/helpers/pretrained.py)
mapped into ``tokens:arith`` with one operation; the runs are a few updates
on a few dozen scripted-expert episodes, enough to see the held-out NLL fall.
"""

import dataclasses

import jax
import numpy as np
import pytest

from jaxil import envs
from jaxil.algorithms.lm import sft
from jaxil.cli.main import main as cli_main
from jaxil.envs.experts import scripted_expert
from jaxil.nn import lora
from jaxil.nn.task_vocab import task_decoder
from jaxil.runs import engine


CFG = sft.SFTConfig(num_updates=20, eval_every=10, batch_episodes=4, eval_episodes=4,
                    learning_rate=3e-3)
LORA = dataclasses.replace(CFG, lora_rank=2, lora_alpha=4.0)


@pytest.fixture(scope="module")
def env():
    return envs.make("tokens:arith", num_ops=1)


@pytest.fixture(scope="module")
def gguf(tiny_gguf):
    return tiny_gguf


@pytest.fixture(scope="module")
def model(env, gguf):
    return task_decoder(gguf, env)


@pytest.fixture(scope="module")
def demos(env):
    both = sft.collect_demos(env, scripted_expert(env)[0], None, jax.random.PRNGKey(1), 48)
    return both.take(slice(0, 32)), both.take(slice(32, None))


@pytest.fixture(scope="module")
def lora_program(env, demos, model):
    """The LoRA run's program, traced once for the uninterrupted run and the
    stopped one (the resumed run is `train_sft`'s own)."""
    train, held = demos
    return sft.sft_program(env, train, LORA, (0,), held, model=model)


def _lora_rundir(env, demos, model, out):
    train, held = demos
    ident = sft.sft_identity(env, train, LORA, (0,), held, model=model)
    return engine.open_run(out, ident, step_key="update", info=dict(num_updates=LORA.num_updates))


@pytest.fixture(scope="module")
def lora_run(env, demos, model, lora_program, tmp_path_factory):
    """The uninterrupted LoRA run (2 chunks of 10 updates), in a run
    directory, as `train_sft` runs it."""
    out = tmp_path_factory.mktemp("lora") / "run"
    return engine.run(lora_program, rundir=_lora_rundir(env, demos, model, out), progress=False)


def _nll(result, update):
    (row,) = [r for r in result.rows if r["update"] == update]
    return row["eval_nll"]


def test_lora_merge_against_a_float64_reference(model):
    """`merge` against numpy: `W + (α/r)·A B` reshaped to each kernel, with
    `attn_out [H, D, d]` read as `[H·D, d]` (two input axes) and `q [d, H,
    D]` as `[d, H·D]`; untargeted leaves unchanged, B zero at init. Kills
    the attention output flattened on the wrong axes, a scale of α·r or α,
    and adapters that do not start at the pretrained model."""
    cfg = lora.LoraConfig(rank=3, alpha=5.0)
    fresh = lora.init_adapters(model.params, cfg, jax.random.PRNGKey(0))
    flat = jax.tree_util.tree_flatten_with_path(fresh)[0]
    assert all(np.all(np.asarray(x) == 0) for k, x in flat if jax.tree_util.keystr(k)[-5:] ==
               "['b']")
    rng = np.random.default_rng(0)
    ad = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), fresh)
    merged = lora.merge(model.params, ad, cfg)
    p, m = model.params["params"], merged["params"]
    for name in ("q", "k", "v", "attn_out", "mlp_gate", "mlp_in", "mlp_out"):
        w = np.asarray(p["blocks_1"][name]["kernel"], np.float64)
        a = np.asarray(ad["params"]["blocks_1"][name]["kernel"]["a"], np.float64)
        b = np.asarray(ad["params"]["blocks_1"][name]["kernel"]["b"], np.float64)
        n_in = 2 if name == "attn_out" else 1
        want = w + (5.0 / 3.0) * (a @ b).reshape(w.shape)
        assert a.shape == (int(np.prod(w.shape[:n_in])), 3)
        np.testing.assert_allclose(np.asarray(m["blocks_1"][name]["kernel"]), want, rtol=1e-5,
                                   atol=1e-5)
    for path in (("token_embed", "embedding"), ("head", "kernel"), ("ln_final", "scale"),
                 ("blocks_0", "ln_attn", "scale")):
        x, y = p, m
        for k in path:
            x, y = x[k], y[k]
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(ValueError, match="rank must be an integer >= 1, got 0"):
        lora.LoraConfig(rank=0)
    with pytest.raises(ValueError, match="match no kernel"):
        lora.init_adapters(model.params, lora.LoraConfig(targets="nothing"), jax.random.PRNGKey(0))


def test_lora_sft_trains_only_the_adapters_and_lowers_the_heldout_nll(env, demos, model,
                                                                      lora_run):
    """LoRA SFT: the run's parameters are the adapters alone (no base
    kernel in them), the held-out NLL at update 0 is the pretrained model's
    (B starts at zero) and falls by update 20, the frozen parameters are
    unchanged, and the merged decoder differs from them only in adapted
    kernels. Kills adapters applied nowhere (the NLL would not move),
    training that updates the base (or an adapter folded into it twice), and
    an adapter start other than the pretrained model."""
    train, held = demos
    before = jax.tree.map(np.asarray, model.params)
    state = lora_run.state.params
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    assert {jax.tree_util.keystr(k)[-5:] for k, _ in flat} == {"['a']", "['b']"}
    student = sft.make_student(env, LORA, model)
    start = jax.jit(lambda p: sft.score_demos(student, p, held)["nll"])(model.params)
    assert _nll(lora_run, 0) == pytest.approx(float(start), rel=1e-5)
    assert _nll(lora_run, 20) < _nll(lora_run, 0) - 0.3
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, model.params))
    merged = sft.decoder_params(jax.tree.map(lambda x: x[0], state), LORA, model)
    changed = {jax.tree_util.keystr(k) for (k, x), y in
               zip(jax.tree_util.tree_flatten_with_path(merged)[0], jax.tree.leaves(before))
               if not np.array_equal(np.asarray(x), y)}
    assert changed and all("kernel" in c and "head" not in c for c in changed)


@pytest.mark.slow  # a program of its own to compile (~30 s); LoRA's covers the shared machinery
def test_full_fine_tuning_lowers_the_heldout_nll_from_the_pretrained_start(env, demos, model):
    """Full SFT of the pretrained model: it starts at the pretrained
    parameters (the same update-0 NLL as LoRA's) and the held-out NLL falls.
    Kills a full run that starts from a fresh initialisation instead."""
    train, held = demos
    res = sft.train_sft(env, train, dataclasses.replace(CFG, num_updates=10), heldout=held,
                        model=model)
    student = sft.make_student(env, CFG, model)
    start = jax.jit(lambda p: sft.score_demos(student, p, held)["nll"])(model.params)
    assert _nll(res, 0) == pytest.approx(float(start), rel=1e-5)
    assert _nll(res, 10) < _nll(res, 0) - 0.3


def test_lora_run_stopped_and_resumed_equals_the_uninterrupted_one(env, demos, model, lora_run,
                                                                   lora_program, tmp_path):
    """A LoRA run stopped after its first chunk and resumed gives the
    uninterrupted run's rows and adapters exactly; resuming with another
    rank, or from another pretrained model, is refused in one line. Kills
    adapters re-drawn on resume, a frozen base missing from the resumed
    program, and a run identity that forgets the model."""
    train, held = demos
    engine.run(lora_program, rundir=_lora_rundir(env, demos, model, tmp_path),
               stop_after_chunks=1, progress=False)
    resumed = sft.train_sft(env, train, LORA, heldout=held, model=model, out_dir=tmp_path,
                            resume=True)
    assert resumed.rows == lora_run.rows
    jax.tree.map(np.testing.assert_array_equal, resumed.state.params, lora_run.state.params)
    other = dataclasses.replace(model, params=jax.tree.map(lambda x: x * 1.01, model.params))
    for cfg, m in ((dataclasses.replace(LORA, lora_rank=3), model), (LORA, other)):
        with pytest.raises(ValueError, match="differ") as info:
            sft.train_sft(env, train, cfg, heldout=held, model=m, out_dir=tmp_path, resume=True)
        assert "\n" not in str(info.value)


def test_pretrained_settings_that_do_not_fit_are_refused_in_one_line(env, demos, model, gguf,
                                                                     capsys):
    """LoRA without a model, an agent-id embedding on a pretrained model, a
    model mapped for another setting of the task, and on the command line a
    rank below 1, `--lora` without `--model`, an unknown model name and
    `--size` beside `--model`: each one line naming the fix, the CLI exiting
    non-zero without a traceback. Kills a LoRA rank of 0 taken as full
    fine-tuning, a model of another context length trained silently and a
    `--size` silently ignored."""
    train, _ = demos
    harder = envs.make("tokens:arith", num_ops=2)
    cases = [(env, CFG.__class__(lora_rank=4), None, "LoRA adapts a pretrained model"),
             (env, dataclasses.replace(CFG, agent_ids=True), model, "no agent-id embedding"),
             (harder, CFG, model, "mapped for another task or setting")]
    for e, cfg, m, msg in cases:
        with pytest.raises(ValueError, match=msg) as info:
            sft.check_model(e, cfg, m)
        assert "\n" not in str(info.value)
    base = ["lm", "sft", "--env", "tokens:arith", "--updates", "2", "--eval-every", "2"]
    for extra, msg in ((["--model", str(gguf), "--lora", "0"], "rank must be an integer >= 1"),
                       (["--lora", "4"], "--lora adapts a pretrained model; give --model"),
                       (["--model", "no-such-model"], "neither a file or directory nor a known"),
                       (["--model", str(gguf), "--size", "small"], "leave out --size")):
        assert cli_main(base + extra) != 0
        err = capsys.readouterr().err.strip()
        assert msg in err and "Traceback" not in err and len(err.splitlines()) == 1, err
