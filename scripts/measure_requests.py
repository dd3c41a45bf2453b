"""Step 17's table: how well models follow requests, and what fine-tuning costs in bits per byte.

    uv run python scripts/measure_requests.py --data-dir DIR --n 60 \\
        base=runs/cpu/ckpt.pt full=runs/requests/ckpt.pt lora=runs/lora/ckpt.pt

For each checkpoint: word inclusion, sentence inclusion and dialogue-when-asked on N held-out
requests read off the validation stories (never trained on) and N free requests (three words
from instruct.COMMON_WORDS); the first checkpoint is also prompted with "Once upon a time" (the
chance rate). Then bits per byte on the plain validation stories. --stories FILE keeps every story.
"""

import argparse
import json
from pathlib import Path

from tiny_llm.checkpoint import model_from_checkpoint
from tiny_llm.data import load_token_array
from tiny_llm.evaluate import bits_per_byte
from tiny_llm.instruct import derived_records, measure
from tiny_llm.loss import evaluate_loss
from tiny_llm.prepared import load_meta
from tiny_llm.request_data import free_request
from tiny_llm.tokenize import load_tokenizer


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="name=checkpoint, the first one the base model")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--max-new-tokens", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stories", type=Path, default=None)
    parser.add_argument("--no-chance", action="store_true", help="skip the first's plain prompt")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.data_dir / "tokenizer.json")
    valid = load_token_array(args.data_dir / "valid.bin")
    meta = load_meta(args.data_dir)
    held_out = [r for r, _ in derived_records(valid, tokenizer, 128, seed=12345)[: args.n]]
    free = [free_request(i) for i in range(args.n)]
    print(f"{'model':<26} {'held-out words':>14} {'sentence':>8} {'dialogue':>8} "
          f"{'free words':>10} {'bits/byte':>9}")
    kept = {}
    for i, (name, path) in enumerate(run.split("=", 1) for run in args.runs):
        model, _ = model_from_checkpoint(path, data_dir=args.data_dir)
        loss = evaluate_loss(model, valid)["loss"]
        bpb = bits_per_byte(loss, meta["valid"]["tokens"], meta["valid"]["bytes"])
        prompts = [("once upon a time", True)] if i == 0 and not args.no_chance else []
        for label, plain in prompts + [("request", False)]:
            held, s1 = measure(model, tokenizer, held_out, args.max_new_tokens, args.seed, plain)
            freed, s2 = measure(model, tokenizer, free, args.max_new_tokens, args.seed, plain)
            kept[f"{name} {label}"] = {"held_out": list(zip(held_out, s1, strict=True)),
                                       "free": list(zip(free, s2, strict=True))}
            print(f"{name + ', ' + label:<26} {held['words']:>14.1%} {held['sentence']:>8.1%} "
                  f"{held['dialogue']:>8.1%} {freed['words']:>10.1%} {bpb:>9.4f}", flush=True)
    if args.stories:
        args.stories.write_text(json.dumps(kept, indent=1))


if __name__ == "__main__":
    main()
