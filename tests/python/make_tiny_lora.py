"""Writes a tiny LoRA adapter for the tiny test model (a GGUF of a few hundred KB, made in a second).

llama.cpp's `src/llama-adapter.cpp` says what it accepts: `general.type = "adapter"`, the
model's `general.architecture` ("llama"), `adapter.type = "lora"`, `adapter.lora.alpha`, and
pairs of tensors `<model tensor>.lora_a` / `.lora_b` whose shapes match the model's tensor
(`a` is (rank, n_in), `b` is (n_out, rank) as numpy arrays). At scale s the engine adds
`s * alpha / rank * b @ a` to the model tensor's product.

This one adapts `output.weight` with rank 1: `a` reads dimension 0 of the final hidden
state, which is 1 for every token of the tiny model (see make_tiny_model.py), and `b` adds
a fixed logit to each token named by `--boost SLOT=LOGIT` (SLOT is a position in the
model's REPLY). So a boost of 75 on REPLY[1] beats REPLY's first token (50) after any
prompt, and never a chain's successor (100): the answer starts at REPLY[1] and goes on as
the model does, " from the tiny test model." Two adapters applied at once add their boosts.

Usage: make_tiny_lora.py --vocab ggml-vocab-llama-spm.gguf --boost 1=75 --boost 2=45 --out sql.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_model import REPLY, TINY, read_vocab, write_gguf  # noqa: E402

ALPHA = 1.0
RANK = 1


def boosts(specs: list[str]) -> list[tuple[int, float]]:
    """`SLOT=LOGIT` pairs."""
    pairs = []
    for spec in specs:
        slot, _, logit = spec.partition("=")
        pairs.append((int(slot), float(logit)))
    return pairs


def write_lora(vocab: dict, pairs: list[tuple[int, float]], out: Path) -> None:
    index = {token: i for i, token in enumerate(vocab["tokens"])}
    n_vocab = len(vocab["tokens"])
    lora_a = np.zeros((RANK, TINY.embd), dtype=np.float32)
    lora_a[0, 0] = 1.0
    lora_b = np.zeros((n_vocab, RANK), dtype=np.float32)
    for slot, logit in pairs:
        token = index.get(REPLY[slot].encode())
        if token is None:
            sys.exit(f"the vocab has no token {REPLY[slot]!r}")
        lora_b[token, 0] = logit

    def fill(writer: gguf.GGUFWriter) -> None:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, ALPHA)
        writer.add_name(out.stem)
        writer.add_tensor("output.weight.lora_a", lora_a)
        writer.add_tensor("output.weight.lora_b", lora_b)

    write_gguf(out, fill)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=Path, required=True, help="ggml-vocab-llama-spm.gguf")
    parser.add_argument("--boost", action="append", default=[], help="SLOT=LOGIT, repeatable")
    parser.add_argument("--out", type=Path, required=True, help="the adapter file to write")
    args = parser.parse_args()
    write_lora(read_vocab(args.vocab), boosts(args.boost), args.out)


if __name__ == "__main__":
    main()
