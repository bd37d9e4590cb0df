"""A plan script for ``tiermem plan --script examples/plan/gpt2.py``: Hugging Face GPT-2
(built from a config: no weights are downloaded) with AdamW, its loss the model's own.

    tiermem plan --script examples/plan/gpt2.py --ratio 8:1 --run
"""

import torch
import transformers

name = "hf-gpt2"
BATCH, SEQ, VOCAB = 8, 256, 4096


def model() -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=256, n_layer=6, n_head=8, attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0
    )
    m = transformers.GPT2LMHeadModel(config)
    m.config.use_cache = False
    return m


def batch(i: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(i))
    return {"input_ids": ids, "labels": ids}


def optimizer(params):  # type: ignore[no-untyped-def]
    return torch.optim.AdamW(params, lr=1e-4)


# No loss: GPT2LMHeadModel given labels returns its own (output.loss).
