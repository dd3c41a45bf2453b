"""Shared helper (step 17): what a request is and where requests come from, what a model learned
to take, and whether a story did what it asked.

A request has TinyStories-Instruct's fields (parse_record reads a record, instruct_records a
whole source). Its words, sentence and Dialogue can be read off any story (derive_request), so
step 17 needs no request data to learn from; a checkpoint says which fields and features it was
taught (learned_requests); and a program checks each in a story (score_story), which steps 17
and 18 measure with and step 18 rewards. The rules are stated once, here. So are the rows the
loop draws (RequestRows, MixedRows) and the checks of step 17's settings (init_from_flags,
check_request_config).
"""

import itertools
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from tiny_llm.checkpoint import load_checkpoint
from tiny_llm.data import file_stories, get_batch, hub_reachable, split_tail
from tiny_llm.tokenize import EOT
from tiny_llm.tuning import PARTS

FEATURES = ("Dialogue", "BadEnding", "MoralValue", "Twist", "Foreshadowing", "Conflict")
FIELDS = {"Features": "features", "Words": "words", "Random sentence": "sentence",
          "Summary": "summary"}  # TinyStories-Instruct's field names -> render_request's
REQUEST_ROOM = 48  # tokens kept for the request when a story is cut to fit behind it
MAX_RECORDS = 50_000  # records read from a TinyStories-Instruct source (held in memory)
STOPWORDS = set("""a an the and or but so if then than that this these those there here is are
was were be been being am do does did done have has had having he she it they we you i me him
her them us my your his its our their mine not no yes to of in on at by for with from up down
out over under into onto off about after before again all any each every some many much more
most very too also just only own same such can could will would shall should may might must
said says say what when where which who whom whose why how one two three once upon time day
lily tim tom ben sue sam anna max mia lucy jack bob sara mom dad mommy daddy named name""".split())
COMMON_WORDS = ("dog", "cat", "ball", "tree", "park", "happy", "sad", "big", "jump", "play",
                "friend", "toy", "sun", "bird", "house", "car", "red", "little", "find", "help",
                "water", "flower", "box", "fish", "cake", "garden", "boat", "hat", "sing", "moon",
                "brave", "scared", "run", "smile", "rain", "apple", "book", "door", "shiny",
                "kind")  # the "free" requests draw three of these


def content_words(text):
    """Lower-case words of 3+ letters that are not stop words or names, first occurrence order."""
    seen = dict.fromkeys(w.lower() for w in re.findall(r"\b[A-Za-z]{3,}\b", text))
    return [w for w in seen if w not in STOPWORDS]


def sentences(text):
    """Sentences of a story that end in . ! or ?, without quotes, 4 to 20 words long."""
    found = re.findall(r"[A-Z][^.!?\"\n]*[.!?]", text)
    return [s.strip() for s in found if 4 <= len(s.split()) <= 20]


def derive_request(story, seed=0, stories_using=None):
    """A request read off a story: three of its content words, one of its sentences (half the
    time) and Dialogue exactly when it has quoted speech. The same story and seed give the same
    request, in any process (random.Random seeded by a string is deterministic).
    stories_using ({word: how many stories use it}): rarer words are likelier, a word's weight
    1 / that count, so "kite" is asked for more than "play": a story that uses a rare word it
    was asked for has copied it, where a common one it would have written anyway."""
    rng = random.Random(f"{seed}:{story}")
    words = content_words(story)
    if stories_using is None:
        chosen = rng.sample(words, min(3, len(words)))
    else:  # weighted draws without replacement: the 3 largest u ** (1 / weight) (Efraimidis)
        keys = {w: rng.random() ** stories_using.get(w, 1) for w in words}
        chosen = sorted(words, key=keys.get, reverse=True)[:3]
    request = {"words": tuple(chosen),
               "features": ("Dialogue",) if re.search(r"\"[^\"]+\"", story) else (),
               "sentence": None, "summary": None}
    if (found := sentences(story)) and rng.random() < 0.5:
        request["sentence"] = rng.choice(found)
    return request


def free_request(index, seed=0):
    """Request number `index` of the free set: three words from COMMON_WORDS, nothing else."""
    rng = random.Random(f"free:{seed}:{index}")
    return {"words": tuple(rng.sample(COMMON_WORDS, 3)), "features": (), "sentence": None,
            "summary": None}


def uses_word(story, word):
    """Whether the story uses `word` or a regular inflection of it (dog: dogs; jump: jumps,
    jumped, jumping; smile: smiled, smiling; run: running; happy: happier). Irregular forms
    (run: ran) do not count. The rule is the one every figure of step 17 uses."""
    w = word.lower()
    forms = {w, w + "s", w + "es", w + "ed", w + "d", w + "ing", w + "er", w + "est"}
    forms |= {w + w[-1] + "ing", w + w[-1] + "ed", w + w[-1] + "er"}  # run -> running
    if w.endswith("e"):
        forms |= {w[:-1] + "ing"}  # smile -> smiling
    if w.endswith("y"):
        forms |= {w[:-1] + "ies", w[:-1] + "ied", w[:-1] + "ier", w[:-1] + "iest"}
    return any(t in forms for t in re.findall(r"[a-z]+", story.lower()))


MIN_SENTENCE_WORDS = 5  # shorter, or mostly the asked-for words: a pile, not a sentence


def story_sentences(story):
    """The story cut after . ! ? and at line ends, quotes dropped, each as its lower-case words.
    'Dog moon brave. "Hi," she said.' -> [['dog', 'moon', 'brave'], ['hi', 'she', 'said']]"""
    pieces = re.split(r"(?<=[.!?])\s+(?=[A-Z])|\n+", story.replace('"', " "))
    return [words for p in pieces if (words := re.findall(r"[a-z']+", p.lower()))]


def is_pile(sentence, words):
    """Whether a sentence (its words) holds an asked-for word without being a sentence: under
    MIN_SENTENCE_WORDS words, or half of it or more the asked-for words. ['dog', 'moon',
    'brave'] -> True; ['the', 'dog', 'looked', 'at', 'the', 'moon'] -> False."""
    asked = sum(any(uses_word(t, w) for w in words) for t in sentence)
    return asked > 0 and (len(sentence) < MIN_SENTENCE_WORDS or 2 * asked >= len(sentence))


def in_a_sentence(story, word, words=None):
    """Whether the story uses `word` (uses_word's forms) inside a sentence that is no pile of
    the asked-for `words`, and at most max(3, a twentieth of its words) times: 'The dog slept
    by the door.' uses dog in a sentence; 'Dog moon brave.' does not; 'dog' thirty times in
    a story of 100 words is repetition, not use."""
    words, sentences = words or (word,), story_sentences(story)
    n = sum(uses_word(t, word) for s in sentences for t in s)
    if n > max(3, sum(map(len, sentences)) // 20):
        return False
    return any(uses_word(" ".join(s), word) and not is_pile(s, words) for s in sentences)


def word_grades(story, words):
    """The shares of the asked-for words the story uses, anywhere and in a sentence (step 11's
    grades of a requests model). 'Dog moon brave.', (dog, moon) -> 1.0 and 0.0."""
    return {"words used": sum(uses_word(story, w) for w in words) / len(words),
            "in a sentence": sum(in_a_sentence(story, w, words) for w in words) / len(words)}


def score_story(request, story):
    """{"words": share of requested words used, "sentence": 1/0 or None (none asked),
    "dialogue": 1 if quoted speech is present exactly when Dialogue was asked, else 0}."""
    words = request["words"]
    return {"words": sum(uses_word(story, w) for w in words) / len(words) if words else None,
            "sentence": None if not request["sentence"] else float(request["sentence"] in story),
            "dialogue": float(bool(re.search(r"\"[^\"]+\"", story))
                              == ("Dialogue" in request["features"]))}


def parse_record(text):
    """A TinyStories-Instruct record (fields in any order, then "Story:") -> (request, story).
    request is a dict of render_request's arguments; parse_record(render_request(**r) + s) == (r, s)
    for a request r with all four fields (parse fills the absent ones with empty values)."""
    request = {"words": (), "features": (), "sentence": None, "summary": None}
    head, sep, story = text.partition("Story:")
    if not sep:
        raise ValueError(f"no 'Story:' in the record {text[:80]!r}...: is it TinyStories-Instruct?")
    lines = story.split("\n")  # a field may follow the story too: it ends the story
    end = next((i for i, line in enumerate(lines) if line.partition(":")[0].strip() in FIELDS
                and ":" in line), len(lines))
    story = "\n".join(lines[:end])
    for line in head.splitlines() + lines[end:]:
        name, _, value = line.partition(":")
        if name.strip() in FIELDS and value.strip():
            key, value = FIELDS[name.strip()], value.strip()
            if key in ("words", "features"):
                value = tuple(v.strip() for v in value.split(",") if v.strip())
            request[key] = value
    request["features"] = tuple(f for f in request["features"] if f in FEATURES)
    return request, story.strip()


def measure_line(request, story):
    """What --measure prints under a story: each score_story field the request asks for, and
    the words it missed. 'measured     words 2/3 (missed brave), dialogue none, not asked'"""
    words, scores = request["words"], score_story(request, story)
    missed = [w for w in words if not uses_word(story, w)]
    parts = [f"words {len(words) - len(missed)}/{len(words)}"
             + (f" (missed {', '.join(missed)})" if missed else "")] if words else []
    if scores["sentence"] is not None:
        parts.append(f"sentence {'yes' if scores['sentence'] else 'no'}")
    asked = "Dialogue" in request["features"]
    quoted = scores["dialogue"] == asked  # the score is 1 when quotes come exactly when asked
    parts.append(f"dialogue {'written' if quoted else 'none'}, {'' if asked else 'not '}asked")
    return f"{'measured':<12} " + ", ".join(parts)


def learned_requests(ckpt):
    """What a loaded checkpoint dict was fine-tuned to take: {"fields": [...], "features": [...]}
    in render_request's names, or None for a model never tuned on requests. Derived requests
    teach words, a sentence and Dialogue (the one feature a story shows by itself: quotes);
    TinyStories-Instruct teaches every field and feature. An imported model carries its own
    ("requests", from the export's config.json)."""
    if isinstance(own := ckpt.get("requests"), dict):  # checked: a config.json can be edited
        return {key: [v for v in own.get(key) if v in known] if isinstance(own.get(key), list)
                else [] for key, known in (("fields", FIELDS.values()), ("features", FEATURES))}
    source = (ckpt.get("train_config") or {}).get("requests")
    if not source:
        return None
    if source == "derived":
        return {"fields": ["words", "sentence"], "features": ["Dialogue"]}
    return {"fields": list(FIELDS.values()), "features": list(FEATURES)}


def takes_requests(ckpt):
    """Whether a loaded checkpoint dict was fine-tuned on requests (train --requests)."""
    return learned_requests(ckpt) is not None


def check_request(ckpt, request, name):
    """What generate does with a request for the checkpoint `name`: refuse what a model tuned
    on requests was not taught; for a model never tuned, say that it reads it as plain text."""
    if (learned := learned_requests(ckpt)) is None:
        print(f"note: {name} was never fine-tuned on requests: it reads this one as plain text "
              "(zero-shot), the base line a fine-tuning is measured against", file=sys.stderr)
    else:
        check_learned(learned, request, name)


def check_learned(learned, request, name="the model"):
    """Raise a ValueError naming what `request` (render_request's arguments) asks that the
    checkpoint never learned (`learned`, from learned_requests): it would read it as noise."""
    if learned is None:
        raise ValueError(f"{name} was not fine-tuned to take requests (train --requests): "
                         "give it a plain prompt")
    unlearned = [f for f in request.get("features") or () if f not in learned["features"]]
    unlearned += [f"a {field}" for field in ("sentence", "summary")
                  if request.get(field) and field not in learned["fields"]]
    if unlearned:
        taught = ", ".join(learned["features"]) or "no feature"
        raise ValueError(f"{name} was never taught {', '.join(unlearned)}: its requests held "
                         f"{', '.join(learned['fields'])} and {taught}; leave the rest out")


def story_ids(tokens, eot_id=0):
    """A token file's stories, int64 ids without their EOT: [5, 6, 0, 7, 0] -> [5 6], [7]."""
    ends = np.flatnonzero(np.asarray(tokens) == eot_id)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [np.asarray(tokens[s:e], dtype=np.int64) for s, e in zip(starts, ends, strict=True)
            if e > s]


def derived_records(tokens, tokenizer, seq_len, seed, words="any", per_story=1):
    """(request, story ids) for each story of a token file, the request read off the part of
    the story that fits behind it (the rest is cut, so asking for a word it never sees would
    teach the model to ignore requests). words="rare" weighs each word by 1 / the number of
    the file's stories that use it (derive_request); per_story > 1 reads that many requests
    off each story (seeds seed, seed+1, ...), so its story is asked for in several ways."""
    if words not in ("any", "rare"):
        raise ValueError(f"request words must be any or rare, got {words!r}")
    stories = story_ids(tokens)
    fits = tokenizer.decode_batch([s[: seq_len - REQUEST_ROOM].tolist() for s in stories])
    # the fitting part may end inside a word: read the request off whole words only
    texts = [text.rsplit(" ", 1)[0] for text in fits]
    using = Counter(w for text in texts for w in content_words(text)) if words == "rare" else None
    return [(derive_request(text, seed + k, using), ids)
            for text, ids in zip(texts, stories, strict=True) for k in range(per_story)]


def instruct_records(source, tokenizer):
    """{"train": [...], "valid": [...]} of (request, story ids) from TinyStories-Instruct:
    "tinystories-instruct" (the Hub, through `datasets`) or the path of a local copy of its text
    files (records between EOT lines; its last 5%, at most 1,000, held out). MAX_RECORDS at most."""
    if source == "tinystories-instruct":
        if not hub_reachable():
            raise ConnectionError("cannot reach the Hugging Face Hub for TinyStories-Instruct: "
                                  "use --requests derived, or a local copy of its text files")
        import datasets
        rows = datasets.load_dataset("roneneldan/TinyStoriesInstruct", split="train",
                                     streaming=True)
        lines = (row["text"] for row in rows)
        texts = ("\n".join(run) for is_eot, run in
                 itertools.groupby(lines, key=lambda t: t.strip() == EOT)
                 if not is_eot)
    else:
        if not Path(source).exists():
            import difflib
            near = difflib.get_close_matches(source, ("derived", "tinystories-instruct"), 1)
            raise FileNotFoundError(
                f"--requests {source!r} is no file, and not one of derived or "
                f"tinystories-instruct" + (f": did you mean --requests {near[0]}?" if near
                                          else ": pass a TinyStories-Instruct text file"))
        texts = file_stories(source)
    records, empty = {"train": [], "valid": []}, 0
    for i, (split, text) in enumerate(split_tail(texts, source)):
        if i == MAX_RECORDS:
            break
        request, story = parse_record(text)
        if not story:  # nothing to learn but the end: skipped, and counted
            empty += 1
            continue
        records[split].append((request, np.array(tokenizer.encode(story).ids)))
    if not records["train"] or not records["valid"]:
        raise ValueError(f"{source}: {empty} records have nothing after 'Story:', and too few "
                         "have a story to train and validate on: every record needs its story")
    if empty:
        print(f"note: {source}: {empty} records have nothing after 'Story:': skipped",
              file=sys.stderr)
    return records


# A Jinja chat template: the last user message rendered as step 17's render_request renders
# its fields ({"role": "user", "words": ["dog"], "features": ["Dialogue"], "sentence": ...}), or
# a chat's "content" as the words ("dog, moon", or OpenAI's list of {"type": "text"} parts);
# what the model was not taught is refused, and so are a system message (a request has no place
# for one), a chat with no user message, and a request longer than the model can read.
CHAT_TEMPLATE = r"""
{%- for s in messages if s.role == "system" and s.content -%}
  {{- raise_exception("this model follows requests (words, features, a sentence), not a system "
                      ~ "message: leave the system message out") -}}
{%- endfor -%}
{%- set users = messages | selectattr("role", "equalto", "user") | list -%}
{%- if not users -%}
  {{- raise_exception("no user message: give one, with the words as its content (\"dog, moon\")"
                      ~ " or as fields (\"words\": [\"dog\", \"moon\"])") -}}
{%- endif -%}
{%- set m = users | last -%}
{%- set ns = namespace(words=m.words if m.words is defined else [], text="") -%}
{%- if m.content is string or m.content is none -%}
  {%- set ns.text = m.content or "" -%}
{%- else -%}
  {%- for part in m.content -%}
    {%- if part.type != "text" -%}
      {{- raise_exception("this model reads text only: a message part of type " ~ part.type) -}}
    {%- endif -%}
    {%- set ns.text = ns.text ~ "," ~ part.text -%}
  {%- endfor -%}
{%- endif -%}
{%- for w in ns.text.split(",") if m.words is not defined and w.strip() -%}
  {%- set ns.words = ns.words + [w.strip()] -%}
{%- endfor -%}
{%- set features = m.features if m.features is defined else [] -%}
{%- for f in features if f not in FEATURES_TAUGHT -%}
  {{- raise_exception("this model was not taught the feature " ~ f) -}}
{%- endfor -%}
{%- for key in ["sentence", "summary"] if m[key] and key not in FIELDS_TAUGHT -%}
  {{- raise_exception("this model was not taught a " ~ key) -}}
{%- endfor -%}
{%- if ((ns.words | join(", ")) ~ (m.sentence or "") ~ (m.summary or "")) | length > MAX_CHARS -%}
  {{- raise_exception("the request is longer than this model reads: it reads MAX_TOKENS tokens, "
                      ~ "and no request over MAX_CHARS characters fits in them; shorten its "
                      ~ "sentence or its words") -}}
{%- endif -%}
{%- macro field(name, value) -%}
  {{- name ~ ": " ~ (value | replace("\n", " ")) ~ "\n" -}}
{%- endmacro -%}
{%- if features %}{{ field("Features", features | join(", ")) }}{% endif -%}
{%- if ns.words %}{{ field("Words", ns.words | join(", ")) }}{% endif -%}
{%- if m.sentence %}{{ field("Random sentence", m.sentence) }}{% endif -%}
{%- if m.summary %}{{ field("Summary", m.summary) }}{% endif -%}
{{- "Story:\n" -}}
"""


def chat_template(learned, max_tokens=None, longest_token=1):
    """CHAT_TEMPLATE for a model that learned `learned` (step 17's learned_requests) and reads
    `max_tokens` tokens, none of them longer than `longest_token` characters: a request of more
    characters than max_tokens · longest_token cannot fit, and is refused before the model."""
    limit = max_tokens * longest_token if max_tokens else 10**9
    return (CHAT_TEMPLATE.strip().replace("FEATURES_TAUGHT", json.dumps(learned["features"]))
            .replace("FIELDS_TAUGHT", json.dumps(learned["fields"]))
            .replace("MAX_CHARS", str(limit)).replace("MAX_TOKENS", str(max_tokens or "any")))


def init_from_flags(given):
    """The flags given, with --init-from's model (its run's --model, --preset and step 15's
    parts) filled in, so the run prints, prices and records what it trains; a flag that
    chooses another model is refused."""
    if not given.get("init_from") or given.get("resume"):
        return given
    saved = load_checkpoint(given["init_from"]).get("train_config") or {}
    names = [n for n in ("model", "preset", *PARTS) if n in saved]
    if other := [f"--{n.replace('_', '-')} {given[n]} (it has {saved[n]})" for n in names
                 if n in given and given[n] != saved[n]]:
        raise ValueError(f"--init-from fine-tunes the model in {given['init_from']} as it "
                         f"is: leave out {', '.join(other)}")
    return {**given, **{n: saved[n] for n in names}}


def check_request_config(cfg):
    """Raise a clear error for step 17's settings (RequestConfig) that cannot work together."""
    if not 0 < cfg.request_share <= 1 or cfg.request_share < 1 and not cfg.requests:
        raise ValueError(f"--request-share is the share of rows that carry a request, in "
                         f"(0, 1], with --requests: got {cfg.request_share}: 1 fine-tunes "
                         "on requests alone, 0.5 pretrains on requests and plain stories")
    if cfg.request_words not in ("any", "rare") or not (
            isinstance(cfg.requests_per_story, int) and cfg.requests_per_story >= 1):
        raise ValueError(f"need --request-words any or rare and --requests-per-story >= 1, "
                         f"got {cfg.request_words!r} and {cfg.requests_per_story!r}")
    if cfg.story_starts and cfg.requests:
        raise ValueError("--requests rows each start at a request already: leave out "
                         "--story-starts")
    if not isinstance(cfg.lora_rank, int) or cfg.lora_rank < 0 or not cfg.lora_alpha > 0:
        raise ValueError(f"need --lora-rank >= 0 (0: full fine-tuning) and --lora-alpha > 0, "
                         f"got {cfg.lora_rank} and {cfg.lora_alpha}")


class RequestRows:
    """Rows that each start at a record's beginning: x, y (N, T) int64, y = -1 off the story.
    get_batch draws random rows as data.get_batch draws windows, from the loop's generator,
    so a resumed run draws the same rows."""

    def __init__(self, x, y, cut_tokens=0):
        self.x, self.y, self.cut_tokens = x, y, cut_tokens  # cut: story tokens past the context

    def __len__(self):
        return len(self.x)

    def get_batch(self, batch_size, seq_len, device=None, generator=None, part=slice(None)):
        """(x, y) of batch_size random rows, each (B, seq_len) int64, on `device`; with `part`,
        only those of the B rows (a rank's share, as data.get_batch takes it)."""
        if seq_len != self.x.shape[1]:
            raise ValueError(f"the rows hold {self.x.shape[1]} tokens, asked for {seq_len}")
        i = torch.randint(len(self.x), (batch_size,), generator=generator)[part]
        return self.x[i].to(device), self.y[i].to(device)


class MixedRows:
    """Rows for pretraining with requests: of B rows, round(share·B) RequestRows (loss on the
    story), the rest plain windows (data.get_batch), all from the loop's generator."""

    def __init__(self, request_rows, data, share):
        self.request_rows, self.data, self.share = request_rows, data, share

    def get_batch(self, batch_size, seq_len, device=None, generator=None, part=slice(None)):
        """(x, y), each (B, seq_len) int64: the request rows first, then the windows."""
        n = round(self.share * batch_size)
        qx, qy = self.request_rows.get_batch(n, seq_len, generator=generator)
        px, py = get_batch(self.data, batch_size - n, seq_len, generator=generator)
        return torch.cat([qx, px])[part].to(device), torch.cat([qy, py])[part].to(device)
