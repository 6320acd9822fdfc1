"""`jaxil lm generate`: a first look at a pretrained language model.

Loads a checkpoint (a short name such as `smollm2-135m-instruct`, a GGUF
file or an HF directory), renders the prompt under its chat template
(`--chat`, the default when it has one) or tokenizes it as it is
(`--raw`), and continues it with [`jaxil.nn.generate`][jaxil.nn.generate]:
greedy by default, or sampled with `--temperature`, `--top-k`,
`--top-p`. A row ends at the checkpoint's EOS or end-of-turn token, or
after `--max-new-tokens`. `--batch B` continues B copies of the prompt in
one batch (with sampling, B different answers).

It prints each answer, then the timings: loading, compiling, and the
generation itself with its new tokens per second.
"""

from __future__ import annotations

import argparse
import time

from jaxil.cli.args import nonneg_int, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True,
                   help="a short name (smollm2-135m-instruct), a GGUF file or an HF directory")
    p.add_argument("--prompt", required=True, help="the user's message (--chat) or the text to "
                                                   "continue (--raw)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="render the prompt as one user turn of the checkpoint's chat template "
                           "(the default when it has one)")
    mode.add_argument("--raw", dest="chat", action="store_false",
                      help="tokenize the prompt as it is (the default without a chat template)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128,
                   help="the token limit per answer (default 128)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 for greedy (the default); else sample at this temperature")
    p.add_argument("--top-k", type=int, default=0,
                   help="sample among the k most likely tokens (0: all; default 0)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="sample among the smallest set of most likely tokens of this mass, "
                        "in (0, 1] (default 1: all)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="the sampling seed (default 0)")
    p.add_argument("--batch", type=positive_int, default=1,
                   help="continue this many copies of the prompt in one batch (default 1)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the parameters' and the forward pass's dtype (default float32)")


def run(args: argparse.Namespace) -> int:
    import jax
    import numpy as np

    from jaxil.lm import encode_prompt, stop_ids
    from jaxil.nn.generate import Sampling, check_request, make_generate
    from jaxil.nn.pretrained_params import from_checkpoint
    from jaxil.pretrained import load_checkpoint

    sampling = Sampling(args.temperature, args.top_k, args.top_p)  # bad settings fail first
    t0 = time.perf_counter()
    ckpt = load_checkpoint(args.model, args.dtype)
    ids, chat = encode_prompt(ckpt, args.prompt, args.chat)
    n_new = args.max_new_tokens
    # The cache holds just this request (a step's attention reads all of it),
    # at most the checkpoint's trained context: check_request names the fix.
    context = min(len(ids) + n_new - 1, ckpt.arch.max_positions)
    config, params = from_checkpoint(ckpt, max_context=context, compute_dtype=args.dtype)
    check_request(config, (args.batch, len(ids)), n_new)
    t_load = time.perf_counter() - t0

    stops = stop_ids(ckpt)
    fn = make_generate(config, n_new, sampling, stops, -1)
    batch = np.tile(np.asarray(ids, np.int32), (args.batch, 1))
    lengths = np.full((args.batch,), len(ids), np.int32)
    key = jax.random.key(args.seed)
    t0 = time.perf_counter()
    compiled = fn.lower(params, batch, lengths, key).compile()
    t_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(params, batch, lengths, key))
    t_gen = time.perf_counter() - t0

    tokens, counts = np.asarray(out.tokens), np.asarray(out.lengths)
    for b in range(args.batch):
        row = tokens[b, :counts[b]].tolist()
        if args.batch > 1:
            print(f"--- answer {b + 1} of {args.batch}")
        print(ckpt.tokenizer.decode(row, skip_special_tokens=True).strip())
    ended = sum(bool(counts[b]) and int(tokens[b, counts[b] - 1]) in stops
                for b in range(args.batch))
    total = int(counts.sum())
    what = "greedy" if sampling.greedy else (f"temperature {args.temperature:g}, top-k "
                                             f"{args.top_k}, top-p {args.top_p:g}")
    print(f"({ckpt.path.name}, {'chat' if chat else 'raw'}, {len(ids)} prompt tokens, {what}; "
          f"{total} new tokens, {ended} of {args.batch} ended by a stop token; load {t_load:.1f} "
          f"s, compile {t_compile:.1f} s, generate {t_gen:.2f} s = "
          f"{total / max(t_gen, 1e-9):.1f} tokens/s)")
    return 0


def register(lsub) -> None:
    """Adds `generate` to the `jaxil lm` subcommands."""
    g = lsub.add_parser("generate", help="continue a prompt with a pretrained model (chat or raw)",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(g)
    g.set_defaults(func=run)
