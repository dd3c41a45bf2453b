"""Solutions to the exercises of step 17 (steps/17-requests.md).

Run them:  uv run python -m solutions.ex17_instruct   (on the prepared data in data/)
"""

import torch

from tiny_llm.data import DATA_DIR, ensure_data, load_token_array
from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.instruct import (
    add_lora,
    derived_records,
    render_request,
    request_row,
    rows_of,
    trainable,
)
from tiny_llm.tokenize import load_tokenizer


def exercise_1_summary_rows(data_dir=DATA_DIR):
    """A request with a summary still opens its row, and every summary token's target is -1.
    Returns (the row starts with the request, the summary is masked)."""
    ensure_data(data_dir)
    tokenizer = load_tokenizer(data_dir / "tokenizer.json")
    prompt = render_request(["dog"], summary="A dog finds a ball and shares it.")
    request = tokenizer.encode(prompt).ids
    x, y = request_row(request, tokenizer.encode("Once upon a time").ids, 0, 64)
    return x[: len(request)].tolist() == request, bool((y[: len(request) - 1] == -1).all())


def lora_count_by_formula(preset="cpu", rank=8):
    """Each block's four Linears (qkv C->3C, proj C->C, fc C->4C, proj 4C->C) get A (r, in) and
    B (out, r): r·(in + out) each, r·16·C a block. cpu, rank 8: 4 · 8 · 16 · 128 = 65,536."""
    c = PRESETS[preset]
    return c.n_layers * rank * 16 * c.d_model


def exercise_2_lora_count(preset="cpu", rank=8):
    """The same count from the model: build it on the meta device (no memory), add adapters."""
    with torch.device("meta"):
        model = add_lora(GPT(PRESETS[preset]), rank, 16.0)
    return trainable(model)


def exercise_3_cut_share(data_dir=DATA_DIR, seq_len=128):
    """The share of validation story tokens (EOT included) that fall past the context behind
    their request, and so are never trained on."""
    ensure_data(data_dir)
    tokenizer = load_tokenizer(data_dir / "tokenizer.json")
    records = derived_records(load_token_array(data_dir / "valid.bin"), tokenizer, seq_len, 0)
    rows = rows_of(records, tokenizer, seq_len)
    return rows.cut_tokens / sum(len(ids) + 1 for _, ids in records)


if __name__ == "__main__":
    print(f"exercise 1  row starts with the request, summary masked: {exercise_1_summary_rows()}")
    print(f"exercise 2  LoRA rank 8 on cpu: {exercise_2_lora_count():,} trainable "
          f"(formula {lora_count_by_formula():,})")
    print(f"exercise 3  story tokens past a 128-token context: {exercise_3_cut_share():.1%}")
