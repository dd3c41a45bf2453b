"""Step 09: making the model write.

The GPT of step 08 gives, at every position, logits over the whole vocabulary for the next
token. Writing is a loop: run the model on the text so far, turn the last position's logits
into probabilities, pick one token, append it, repeat. How the token is picked decides the
style: always the most likely one (greedy), or a random draw whose spread is shaped by
temperature, top-k and top-p. Writing stops at `<|endoftext|>`, the token that ends a story.

Run the check:  uv run python -m tiny_llm.generate   (an untrained model: expect gibberish)
With a trained model:  uv run python -m tiny_llm.generate --checkpoint runs/small/ckpt.pt
"""

import argparse
import math
import os
import sys
import unicodedata
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from tiny_llm.checkpoint import model_from_checkpoint
from tiny_llm.checks import check_ids
from tiny_llm.device import pick_device
from tiny_llm.files import save_figure
from tiny_llm.gpt import GPT, PRESETS
from tiny_llm.paths import DATA_DIR
from tiny_llm.tokenize import EOT, load_tokenizer, tokenizer_path

DEFAULTS = {"temperature": 0.8, "top_k": 50, "top_p": None}  # the command line's sampling
PROMPT = "Once upon a time"  # the command line's prompt when none is given or piped in
SMALLEST = 1e-6  # the least temperature or top_p above 0 that float32 sampling can use


def check_sampling(temperature, top_k, top_p):
    """Raise a clear error for sampling settings that make no sense."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
        math.isfinite(temperature) and temperature >= 0
    ):
        raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {temperature!r}")
    if 0 < temperature < SMALLEST:  # the logits divided by it overflow float32: inf, then NaN
        raise ValueError(f"temperature {temperature!r} is too small to divide by: use 0 "
                         f"(greedy), or at least {SMALLEST}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive int (or None for no limit), got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] (or None for no limit), got {top_p!r}")
    if top_p is not None and top_p < SMALLEST:  # compared in float32, it would round to 0
        raise ValueError(f"top_p {top_p!r} is too small: use at least {SMALLEST} (that already "
                         "keeps only the most likely token)")


def top_k_filter(logits, top_k):
    """Keep the `top_k` largest logits of each row; the rest become -inf (probability 0).

    [2.0, 1.0, 3.0, 0.5] with top_k=2 -> [2.0, -inf, 3.0, -inf]
    """
    top_k = min(top_k, logits.shape[-1])  # asking for more tokens than exist keeps them all
    values, indices = torch.topk(logits, top_k, dim=-1)
    return torch.full_like(logits, float("-inf")).scatter(-1, indices, values)


def top_p_filter(logits, top_p):
    """Keep the smallest set of most likely tokens whose probability adds up to at least top_p.

    probs [0.5, 0.25, 0.125, 0.125]: top_p=0.75 keeps 2 tokens, top_p=0.8 keeps 3.
    """
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = F.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each token
    # a token is dropped when the tokens above it already reach top_p; the first never is
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def next_token_probs(logits, temperature=1.0, top_k=None, top_p=None):
    """(B, V) logits -> (B, V) probabilities after temperature (> 0), then top-k, then top-p."""
    logits = logits.float() / temperature  # below 1 sharpens the distribution, above 1 flattens
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return F.softmax(logits, dim=-1)


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
             generator=None, eot_id=0, cache=None, steer=None):
    """Append up to `max_new_tokens` sampled tokens to the prompt `idx`.

    (1, T) int64 prompt in, (1, T + n) out with n <= max_new_tokens: it stops early, after
    appending `eot_id`, when the model ends the story (eot_id=None never stops early).
    temperature 0 is greedy (always the most likely token); `generator` makes draws repeatable.
    With a `cache` (step 12) the model reads each token once instead of the whole text again.
    B prompts of one length, (B, T), write B stories at once (step 18): a row that has ended
    is filled with eot_id until every row has. `steer(idx, logits)` may change the scores
    before each draw (step 18's word boost).
    """
    was_training = model.training
    for next_id, _ in sample_tokens(model, idx, max_new_tokens, temperature, top_k, top_p,
                                    generator, eot_id, cache, steer):
        idx = torch.cat([idx, next_id], dim=1)
    model.train(was_training)
    return idx


@torch.no_grad()
def sample_tokens(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                  generator=None, eot_id=0, cache=None, steer=None):
    """generate()'s loop, handing out each token as it is made: yields (next ids (B, 1), the
    (B, V) logits they were drawn from). A caller can show a token at once, or stop by stopping
    to ask. It leaves the model in eval mode."""
    check_sampling(temperature, top_k, top_p)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or 0 in idx.shape:
        shape = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
        raise ValueError(f"idx must be a (B, T) tensor of token ids with B, T >= 1, got "
                         f"{shape}: for an empty prompt start from [[eot_id]]")
    check_ids(idx, model.config.vocab_size, math.inf)  # the prompt is cropped below, not refused
    model.eval()  # no dropout while writing
    M = model.config.max_seq_len  # the model has no positions beyond this
    unread = idx[:, -M:]  # what a cache has not seen yet: the prompt, then one token a step
    if cache is not None:
        cache.reset()
    ended = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)  # rows with an EOT
    for _ in range(max_new_tokens):
        if cache is None:
            logits, _ = model(idx[:, -M:])  # the whole context, every time
        else:
            if cache.length + unread.shape[1] > M:  # the window slides: every position moves,
                cache.reset()  # so the cached keys are stale; read the last M tokens afresh
                unread = idx[:, -M:]
            logits, _ = model(unread, cache=cache)
        logits = logits[:, -1, :]  # (B, V): only the last position predicts the next token
        if steer is not None:  # the text so far, (B, T + n), and the scores to change
            logits = steer(idx, logits)
        if temperature == 0:
            next_id = logits.argmax(dim=-1, keepdim=True)
        else:
            probs = next_token_probs(logits, temperature, top_k, top_p)
            next_id = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
        if eot_id is not None:  # a row that has ended stays ended
            next_id = next_id.masked_fill(ended[:, None], eot_id)
            ended |= next_id[:, 0] == eot_id
        yield next_id, logits
        idx, unread = torch.cat([idx, next_id], dim=1), next_id
        if eot_id is not None and ended.all():  # nothing ends without an eot_id
            break


def complete(model, tokenizer, prompt, max_new_tokens, generator=None, **sampling):
    """Text in, text out: encode `prompt` ('' starts a new story), generate, decode."""
    eot_id = tokenizer.token_to_id(EOT)  # 0 in the course's tokenizers, 50256 in GPT-2's
    ids = tokenizer.encode(prompt).ids or [eot_id]  # an empty prompt starts right after an EOT
    idx = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
    sampling = {"eot_id": eot_id, **sampling}  # a caller's eot_id wins (None: never stop)
    out = generate(model, idx, max_new_tokens, generator=generator, **sampling)
    return tokenizer.decode(out[0].tolist())  # decode drops the EOT tokens


def printable(text):
    r"""`text` with control characters written as escapes, so that no prompt or sample can
    drive the terminal (move the cursor, clear the screen); newlines and tabs stay as they are.
    'a\x1b[2Jb' -> 'a\\x1b[2Jb'"""
    return "".join(c if c in "\n\t" or unicodedata.category(c) != "Cc" else repr(c)[1:-1]
                   for c in text)


def stream_sample(model, tokenizer, prompt, max_new_tokens, write, generator=None, cache=None,
                  **sampling):
    """complete(), written out while it is made: `write` receives the prompt, then each new
    piece of text as soon as its tokens decode to whole characters (printable). Returns the
    ids. On Ctrl-C what was made is written before the KeyboardInterrupt goes on. A `cache`
    (step 12) makes it read each token once."""
    eot_id = tokenizer.token_to_id(EOT)  # 0 in the course's tokenizers, 50256 in GPT-2's
    ids = tokenizer.encode(prompt).ids or [eot_id]
    device = next(model.parameters()).device
    shown = 0  # ids[:shown] are written

    def flush(whole=True):  # a byte-level token can hold half of a character: wait for the rest
        nonlocal shown
        text = tokenizer.decode(ids[shown:])
        if whole or not text.endswith("\ufffd"):
            write(printable(text))
            shown = len(ids)

    try:
        flush(whole=False)
        idx = torch.tensor([ids], device=device)
        for next_id, _ in sample_tokens(model, idx, max_new_tokens, generator=generator,
                                        eot_id=None, cache=cache, **sampling):
            ids.append(next_id.item())
            if ids[-1] == eot_id:  # <|endoftext|>: the story is over
                break
            flush(whole=False)
    finally:
        flush()
    return ids


def story_from_checkpoint(path, max_new_tokens=200, seed=1337, device="cpu", data_dir=DATA_DIR,
                          prompt="Once upon a time", new_cache=None):
    """The text `uv run python -m tiny_llm.generate --checkpoint path --seed seed` prints;
    `new_cache(model)` (step 12's fresh_cache) makes it read each token once."""
    model, _ = model_from_checkpoint(path, device, data_dir=data_dir)
    tokenizer = load_tokenizer(Path(data_dir) / "tokenizer.json")
    generator = torch.Generator(device=device).manual_seed(seed)
    cache = new_cache(model) if new_cache else None
    return complete(model, tokenizer, prompt, max_new_tokens, generator, cache=cache,
                    **DEFAULTS)


def plot_sampling(path):
    """Draw one made-up next-token distribution as each sampling control reshapes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    words = ["mat", "floor", "bed", "chair", "box", "roof", "moon", "idea"]
    logits = torch.tensor([[3.0, 2.2, 1.8, 1.5, 1.0, 0.2, -0.8, -2.0]])
    panels = [("temperature 1.0", {}), ("temperature 0.5", {"temperature": 0.5}),
              ("temperature 2.0", {"temperature": 2.0}), ("top-k 3", {"top_k": 3}),
              ("top-p 0.9", {"top_p": 0.9})]
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 3), sharey=True)
    before = next_token_probs(logits)[0].tolist()
    for ax, (title, settings) in zip(axes, panels, strict=True):
        ax.bar(words, before, color="lightgrey")  # the distribution at temperature 1, behind
        ax.bar(words, next_token_probs(logits, **settings)[0].tolist(), color="tab:blue", width=0.5)
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=60)
    axes[0].set_ylabel('p(next word | "The cat sat on the")')
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


class WriteHooks:
    """Where a later step changes this command without step 09 importing it (step 17)."""

    def add_flags(self, parser):  # a later step's own flags
        pass

    def prompt(self, args):  # the text to write from
        return args.prompt

    def cache(self, model):  # step 09 reads the whole text for every token
        return None

    def check(self, args, ckpt, model, prompt_tokens):  # a ValueError refuses model or prompt
        pass

    def written(self, args, story):  # the story just written, without its prompt (step 18)
        pass

    def steer(self, args, tokenizer):  # a change to the scores before each draw (step 18)
        return None


def parse_args(argv=None, hooks=None):
    hooks = hooks or WriteHooks()
    parser = argparse.ArgumentParser(description="Step 09: sample text from a GPT.")
    parser.add_argument("--checkpoint", default=None, help="a ckpt.pt from tiny_llm.train "
                        "(default: an untrained tiny model, to see what training has to fix)")
    parser.add_argument("--prompt", default=None, help="'' starts a new story, - reads it from "
                        f"standard input, as does piping text in (default: {PROMPT!r})")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=DEFAULTS["temperature"],
                        help="0: greedy")
    parser.add_argument("--top-k", type=int, default=DEFAULTS["top_k"], help="0: no limit")
    parser.add_argument("--top-p", type=float, default=DEFAULTS["top_p"])
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--num-samples", type=int, default=1)
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="where tokenizer.json is")
    parser.add_argument("--plot", type=Path, default=None, help="save the sampling picture here")
    hooks.add_flags(parser)
    args = parser.parse_args(argv)
    try:
        args.prompt = hooks.prompt(args)
        check_sampling(args.temperature, args.top_k or None, args.top_p)
        if args.max_new_tokens < 0 or args.num_samples < 1 or args.seed < 0:
            raise ValueError("--max-new-tokens and --seed must be >= 0 and --num-samples >= 1, "
                             f"got {args.max_new_tokens}, {args.seed} and {args.num_samples}")
        if args.seed >= 2**64:  # what a torch.Generator can hold
            raise ValueError(f"--seed must be below 2**64 = {2**64:,}, got {args.seed}")
        args.prompt = read_prompt(args.prompt)
    except ValueError as err:
        parser.error(str(err))
    return args


def read_prompt(prompt, stdin=None, wait_s=0.2):
    """The prompt to write from: --prompt's text; with `--prompt -`, or none given while text is
    piped in (`echo Zebra | ...`), standard input without its last newline; else PROMPT.
    A terminal, /dev/null or a pipe that stays silent for wait_s seconds counts as no input."""
    stdin = sys.stdin if stdin is None else stdin
    if prompt == "-":
        return stdin.read().removesuffix("\n")
    if prompt is not None:
        return prompt
    text = stdin.read().removesuffix("\n") if piped_in(stdin, wait_s) else ""
    return text or PROMPT


def piped_in(stdin, wait_s):
    """True if `stdin` is a pipe or a file with something to read within wait_s seconds."""
    import select
    import stat

    try:
        mode = os.fstat(stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # none, or no file behind it (pytest's)
        return False
    if stat.S_ISREG(mode):  # `generate < prompt.txt`
        return True
    if not stat.S_ISFIFO(mode) or os.name == "nt":  # select works on pipes only off Windows
        return False
    return bool(select.select([stdin], [], [], wait_s)[0])


def load_model(args, device, vocab_size):
    """The trained model from --checkpoint, or a seeded untrained tiny GPT; with a description
    and the checkpoint it came from (None for the untrained one)."""
    if args.checkpoint is not None:
        model, ckpt = model_from_checkpoint(args.checkpoint, device, data_dir=args.data_dir)
        return model, f"{args.checkpoint} (step {ckpt['step']:,})", ckpt
    torch.manual_seed(args.seed)
    model = GPT(replace(PRESETS["tiny"], vocab_size=vocab_size)).to(device).eval()
    return model, f"untrained tiny GPT, {model.num_params():,} parameters (no --checkpoint)", None


def main(argv=None, hooks=None):
    """The generate command; a later step's command passes its own hooks (step 17)."""
    hooks = hooks or WriteHooks()
    args = parse_args(argv, hooks)
    if args.plot is not None:
        plot_sampling(args.plot)
        print(f"{'saved':<12} {args.plot}")
        return
    device = pick_device(args.device)
    try:
        # any tokenizer.json: ours, or an imported GPT-2's, whose <|endoftext|> is id 50256
        tokenizer = Tokenizer.from_file(str(tokenizer_path(args.data_dir / "tokenizer.json")))
        model, description, ckpt = load_model(args, device, tokenizer.get_vocab_size())
        hooks.check(args, ckpt, model, len(tokenizer.encode(args.prompt).ids))
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    ids = (tokenizer.encode(args.prompt).ids or [tokenizer.token_to_id(EOT)])
    ids = ids[-model.config.max_seq_len:]
    if (n := len(tokenizer.encode(args.prompt).ids)) > len(ids):  # no position beyond the context
        print(f"note: the prompt is {n:,} tokens and the model reads at most {len(ids)}: it "
              f"writes from the prompt's last {len(ids)} tokens", file=sys.stderr)
    with torch.no_grad():  # the distribution of the first new token, to see what sampling sees
        logits = model(torch.tensor([ids], device=device))[0][:, -1, :]
    probs, vocab_size = next_token_probs(logits), logits.shape[-1]
    kept = int((next_token_probs(logits, top_p=0.9) > 0).sum())
    print(f"{'model':<12} {description}")
    print(f"{'prompt':<12} {args.prompt!r}, {len(ids)} tokens")
    print(f"{'next token':<12} most likely p={probs.max().item():.4f} (uniform: "
          f"{1 / vocab_size:.4f}); top-p 0.9 keeps {kept:,} of {vocab_size:,} tokens")
    sampling = {"temperature": args.temperature, "top_k": args.top_k or None,
                "top_p": args.top_p}
    print(f"{'sampling':<12} " + ", ".join(f"{k} {v}" for k, v in sampling.items())
          + f", seed {args.seed}")
    generator = torch.Generator(device=device).manual_seed(args.seed)
    for i in range(args.num_samples):
        print(f"{f'sample {i + 1}':<12} ", end="", flush=True)
        try:  # printed as it is made: a long sample shows at once, and Ctrl-C keeps it
            out = stream_sample(model, tokenizer, args.prompt, args.max_new_tokens,
                                lambda text: print(text, end="", flush=True), generator,
                                hooks.cache(model), steer=hooks.steer(args, tokenizer),
                                **sampling)
        except KeyboardInterrupt:
            print(flush=True)
            print(f"stopped by Ctrl-C: sample {i + 1} ends where it was", file=sys.stderr)
            raise SystemExit(130) from None  # 130: the shell's code for a Ctrl-C
        print()
        hooks.written(args, tokenizer.decode(out[len(tokenizer.encode(args.prompt).ids):]))


if __name__ == "__main__":
    main()
