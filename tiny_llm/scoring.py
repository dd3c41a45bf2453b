"""Shared helper (step 17): what a request asks of a story, and whether the story did it.

A request's words, sentence and Dialogue can be read off any story (derive_request), so step 17
needs no request data to learn from; and each can be checked in a story by a program (score_story),
which steps 17 and 18 measure with and step 18 rewards. The rules are stated once, here.
"""

import random
import re

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


def derive_request(story, seed=0):
    """A request read off a story: three of its content words, one of its sentences (half the
    time) and Dialogue exactly when it has quoted speech. The same story and seed give the same
    request, in any process (random.Random seeded by a string is deterministic)."""
    rng = random.Random(f"{seed}:{story}")
    words = content_words(story)
    request = {"words": tuple(rng.sample(words, min(3, len(words)))),
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


def score_story(request, story):
    """{"words": share of requested words used, "sentence": 1/0 or None (none asked),
    "dialogue": 1 if quoted speech is present exactly when Dialogue was asked, else 0}."""
    words = request["words"]
    return {"words": sum(uses_word(story, w) for w in words) / len(words) if words else None,
            "sentence": None if not request["sentence"] else float(request["sentence"] in story),
            "dialogue": float(bool(re.search(r"\"[^\"]+\"", story))
                              == ("Dialogue" in request["features"]))}


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
