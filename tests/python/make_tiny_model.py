"""Writes a tiny llama-architecture GGUF model for the tests (a few MB, made in a second).

The weights are made, not trained: a fixed seed fills the transformer blocks with small
random numbers, and the embedding and output matrices are built so that the next token
depends only on the current one:

* after one of the reply's tokens comes the next one, and after the last one (".") the
  end-of-sequence token: the model answers every prompt with REPLY, then stops;
* after any other token comes REPLY's first token.

So a chat answer is always " Hello from the tiny test model." (7 tokens, then
finish_reason "stop"); `max_tokens` below 7 cuts it ("length"); with the end-of-sequence
token banned (`logit_bias {"2": -100}` or llama-server's `ignore_eos`) the reply repeats
until `max_tokens`. The margins between the chosen token and the rest are 50 logits or more,
so sampling settings do not change the answer. Every other token still gets its own random
embedding, so different inputs give different pooled embeddings.

The vocabulary (SentencePiece, 32000 tokens) is copied from the llama.cpp vocab-only file
`ggml-vocab-llama-spm.gguf`; the chat template is a plain "role: content" one.

The same construction makes larger models of the same behaviour (`--embd`, `--layers`,
`--ffn`, `--heads`, `--heads-kv`): tests/it/models_fit.rs makes one of about 250 MiB
(`--embd 1024 --layers 3 --ffn 2816 --heads 8 --heads-kv 4`), whose memory once loaded is
compared with the footprint the node derives from its header. The transformer blocks' weights
are scaled down with the width, so they stay a small perturbation of the chain above.

Usage: make_tiny_model.py --vocab ggml-vocab-llama-spm.gguf --out tiny.gguf
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from dataclasses import dataclass

import gguf
import numpy as np

SEED = 20260101


@dataclass(frozen=True)
class Shape:
    """The model's dimensions; the defaults are the tiny model's."""

    embd: int = 32  # hidden size
    layers: int = 2
    heads: int = 4
    heads_kv: int = 2
    ffn: int = 64
    context: int = 32768  # the context length it declares; a long one costs the tiny model little


TINY = Shape()
# The reply, as SentencePiece pieces ("▁" is a space); each must be one token of the vocab.
REPLY = ["▁Hello", "▁from", "▁the", "▁tiny", "▁test", "▁model", "."]
# Logit of the chosen successor, and of REPLY's first token after any other token.
CHAIN_LOGIT = 100.0
START_LOGIT = 50.0
# Rendered by llama-server's Jinja engine (and by minja-compatible engines in general).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}"
    "{{- message['role'] + ': ' + message['content'] + '\\n' -}}"
    "{%- else -%}"
    "{{- message['role'] + ': ' -}}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{{- '\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'assistant:' -}}{%- endif -%}"
)


def read_vocab(path: Path) -> dict:
    """The tokenizer of a llama.cpp vocab-only GGUF file."""
    reader = gguf.GGUFReader(path)
    fields = reader.fields

    def scalar(key: str):
        return fields[key].contents()

    tokens_field = fields["tokenizer.ggml.tokens"]
    tokens = [bytes(tokens_field.parts[i]) for i in tokens_field.data]
    if scalar("tokenizer.ggml.model") != "llama":
        sys.exit(f"{path}: expected a SentencePiece ('llama') tokenizer")
    return {
        "tokens": tokens,
        "scores": [float(s) for s in scalar("tokenizer.ggml.scores")],
        "types": [int(t) for t in scalar("tokenizer.ggml.token_type")],
        "pre": scalar("tokenizer.ggml.pre"),
        "bos": int(scalar("tokenizer.ggml.bos_token_id")),
        "eos": int(scalar("tokenizer.ggml.eos_token_id")),
        "unk": int(scalar("tokenizer.ggml.unknown_token_id")),
        "add_bos": bool(scalar("tokenizer.ggml.add_bos_token")),
    }


def embeddings_and_output(
    vocab: dict, rng: np.random.Generator, embd_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """token_embd and output, each (n_vocab, embd_size).

    Every embedding has norm sqrt(embd_size) (so the final RMS norm leaves it as it is) and a 1
    in dimension 0, which carries REPLY's first token's bias. Each REPLY token owns one more
    dimension (a one-hot of size R); every other token gets a random direction in the
    dimensions left, so the transitions below cannot interfere with each other.
    """
    index = {token: i for i, token in enumerate(vocab["tokens"])}
    reply = []
    for piece in REPLY:
        token = index.get(piece.encode())
        if token is None:
            sys.exit(f"the vocab has no token {piece!r}")
        reply.append(token)
    n_vocab = len(vocab["tokens"])
    chain = len(reply)
    free = embd_size - 1 - chain
    radius = np.sqrt(embd_size - 1.0)

    embd = np.zeros((n_vocab, embd_size), dtype=np.float32)
    embd[:, 0] = 1.0
    directions = rng.standard_normal((n_vocab, free)).astype(np.float32)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    embd[:, 1 + chain :] = directions * radius
    for slot, token in enumerate(reply):
        embd[token, 1:] = 0.0
        embd[token, 1 + slot] = radius

    output = np.zeros((n_vocab, embd_size), dtype=np.float32)
    output[reply[0], 0] = START_LOGIT
    successors = reply[1:] + [vocab["eos"]]
    for slot, successor in enumerate(successors):
        output[successor, 1 + slot] = CHAIN_LOGIT / radius
    return embd, output


def write_model(vocab: dict, out: Path, shape: Shape = TINY) -> None:
    rng = np.random.default_rng(SEED)
    embd, output = embeddings_and_output(vocab, rng, shape.embd)
    head_dim = shape.embd // shape.heads
    # The blocks' weights shrink with the width, so a wider model's blocks perturb the
    # residual stream no more than the tiny model's do.
    scale = 0.02 * np.sqrt(TINY.embd / shape.embd)
    EMBD, FFN, HEADS_KV = shape.embd, shape.ffn, shape.heads_kv

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, "llama")
        writer.add_name("edge-tiny-test-model")
        writer.add_context_length(shape.context)
        writer.add_embedding_length(EMBD)
        writer.add_block_count(shape.layers)
        writer.add_feed_forward_length(FFN)
        writer.add_head_count(shape.heads)
        writer.add_head_count_kv(HEADS_KV)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(10000.0)
        writer.add_vocab_size(len(vocab["tokens"]))
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre(vocab["pre"])
        writer.add_token_list(vocab["tokens"])
        writer.add_token_scores(vocab["scores"])
        writer.add_token_types(vocab["types"])
        writer.add_bos_token_id(vocab["bos"])
        writer.add_eos_token_id(vocab["eos"])
        writer.add_unk_token_id(vocab["unk"])
        writer.add_add_bos_token(vocab["add_bos"])
        writer.add_add_eos_token(False)
        writer.add_chat_template(CHAT_TEMPLATE)

        def small(*shape: int) -> np.ndarray:
            return (rng.standard_normal(shape) * scale).astype(np.float32)

        writer.add_tensor("token_embd.weight", embd.astype(np.float16))
        for layer in range(shape.layers):
            prefix = f"blk.{layer}."
            writer.add_tensor(prefix + "attn_norm.weight", np.ones(EMBD, dtype=np.float32))
            writer.add_tensor(prefix + "attn_q.weight", small(EMBD, EMBD))
            writer.add_tensor(prefix + "attn_k.weight", small(HEADS_KV * head_dim, EMBD))
            writer.add_tensor(prefix + "attn_v.weight", small(HEADS_KV * head_dim, EMBD))
            writer.add_tensor(prefix + "attn_output.weight", small(EMBD, EMBD))
            writer.add_tensor(prefix + "ffn_norm.weight", np.ones(EMBD, dtype=np.float32))
            writer.add_tensor(prefix + "ffn_gate.weight", small(FFN, EMBD))
            writer.add_tensor(prefix + "ffn_up.weight", small(FFN, EMBD))
            writer.add_tensor(prefix + "ffn_down.weight", small(EMBD, FFN))
        writer.add_tensor("output_norm.weight", np.ones(EMBD, dtype=np.float32))
        writer.add_tensor("output.weight", output.astype(np.float16))

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        tmp.chmod(0o644)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=Path, required=True, help="ggml-vocab-llama-spm.gguf")
    parser.add_argument("--out", type=Path, required=True, help="the model file to write")
    parser.add_argument("--embd", type=int, default=TINY.embd, help="hidden size")
    parser.add_argument("--layers", type=int, default=TINY.layers, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=TINY.heads, help="attention heads")
    parser.add_argument("--heads-kv", type=int, default=TINY.heads_kv, help="KV heads")
    parser.add_argument("--ffn", type=int, default=TINY.ffn, help="feed-forward size")
    args = parser.parse_args()
    shape = Shape(args.embd, args.layers, args.heads, args.heads_kv, args.ffn)
    write_model(read_vocab(args.vocab), args.out, shape)


if __name__ == "__main__":
    main()
