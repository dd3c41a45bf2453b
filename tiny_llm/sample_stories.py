"""Shared helper: an offline corpus of short, TinyStories-like stories, written by our own code.

TinyStories (Eldan and Li, 2023) is a set of simple stories a small child could follow. Without
internet the course still needs text of that kind, so this module writes some: a cast (children
and named animals), a place, a thing they care about, one of several story arcs (a lost thing, a
toy to share, a fear, an animal to help, something to build, a rule broken, a race, a present),
dialogue in quotes, a resolution and sometimes a moral. Each sentence is a template picked from a
few variants and filled with the cast, so stories share phrases but rarely whole paragraphs.
The same seed gives the same stories on every machine.

Run it:  uv run python -m tiny_llm.sample_stories -n 3
"""

import argparse
import random

GIRLS = ("Lily", "Mia", "Sue", "Anna", "Emma", "Lucy", "Zoe", "Ella", "Sara", "Amy", "Kim",
         "Rosa", "Nina", "Ivy", "Ruby", "Grace", "Maya", "Lena", "Jill", "Hana")
BOYS = ("Tom", "Ben", "Max", "Sam", "Leo", "Jack", "Tim", "Noah", "Finn", "Sid", "Ravi", "Omar",
        "Luke", "Jake", "Eli", "Kai", "Bob", "Dan", "Joe", "Theo")
ANIMALS = ("cat", "dog", "bunny", "bird", "frog", "duck", "bear", "fox", "mouse", "puppy",
           "kitten", "turtle", "owl", "squirrel", "lamb", "pig", "horse", "hen", "goat", "deer")
PET_NAMES = ("Spot", "Fluffy", "Pip", "Coco", "Buddy", "Daisy", "Rusty", "Mittens", "Tweet",
             "Hoppy", "Bingo", "Lulu", "Sunny", "Patch", "Nibbles", "Shadow", "Bubbles", "Goldie")
TRAITS = ("happy", "curious", "kind", "brave", "shy", "silly", "little", "playful", "gentle",
          "clever", "cheerful", "busy")
PLACES = ("in the park", "in the garden", "at the beach", "in the forest", "on the farm",
          "on the big hill", "by the lake", "in the meadow", "in the backyard", "by the river",
          "at the playground", "in the woods")  # each with the word that goes before it
THINGS = ("red ball", "blue kite", "shiny rock", "toy car", "teddy bear", "little boat",
          "yellow hat", "box of crayons", "small drum", "rag doll", "book about stars",
          "green scarf", "wooden train", "magic wand", "pink bucket", "silver bell")
HIDING = ("under a big bush", "behind a tree", "in the tall grass", "next to a rock",
          "under a pile of leaves", "by the old fence", "inside a hollow log", "near the water")
FEARS = ("the dark", "the big slide", "the deep water", "the loud thunder", "the tall ladder",
         "the barking dog", "the high swing")
BUILDS = ("a sandcastle", "a tower of blocks", "a cake", "a paper boat", "a little house of sticks",
          "a snowman", "a bird feeder")
GIFTS = ("a card with a big heart", "a bunch of flowers", "a drawing of the sun",
         "a bracelet of beads", "a little clay cup")
TROUBLES = (("was stuck in a tree", "helped it climb down"),
            ("had hurt its wing", "made it a soft bed of leaves"),
            ("was lost and crying", "helped it find its home"),
            ("was stuck in the mud", "pulled it out gently"))
FEELINGS = ("sad", "worried", "upset", "very sad", "scared")
OPENINGS = ("Once upon a time, there was", "One day, there was", "Long ago, there lived",
            "Once there was", "In a small town, there lived", "One sunny morning, there was")
WEATHER = ("The sun was warm.", "The sky was blue and clear.", "It was a windy day.",
           "The birds sang in the trees.", "It had rained, and everything was wet.", "")
CLOSINGS = ("That night, {name} went to bed with a big smile.", "It was the best day ever.",
            "{He} told {his} {grown} all about it at dinner.", "{name} never forgot that day.",
            "The sun went down, and everyone went home happy.", "", "", "")


def pick(rng, *variants):
    """One of the variants, chosen by `rng`: pick(rng, "a", "b") -> "a" or "b"."""
    return rng.choice(variants)


def character(rng):
    """A child or a named animal: {"name": "Mia", "kind": "girl", "he": "she", ...}."""
    he, him, his = pick(rng, ("he", "him", "his"), ("she", "her", "her"))
    if rng.random() < 0.35:
        name, kind = rng.choice(PET_NAMES), rng.choice(ANIMALS)
    else:
        name, kind = rng.choice(GIRLS if he == "she" else BOYS), "girl" if he == "she" else "boy"
    return {"name": name, "kind": kind, "he": he, "him": him, "his": his}


def cast(rng):
    """The words a story is filled with: the hero's fields, the friend's as f_name, f_he, ..."""
    hero, friend = character(rng), character(rng)
    while friend["name"] == hero["name"]:
        friend = character(rng)
    c = {**hero, **{"f_" + key: value for key, value in friend.items()}}
    c["f_who"] = friend["name"] if friend["kind"] in ("girl", "boy") else "{f_name} the {f_kind}"
    c["pet"] = rng.choice(ANIMALS)  # the animal that needs help in arc_help
    c["trouble"], c["rescue"] = rng.choice(TROUBLES)
    c["at_place"] = rng.choice(PLACES)
    c["place"] = c["at_place"].split(" ", 1)[1]  # "in the park" -> "the park"
    c.update(trait=rng.choice(TRAITS), thing=rng.choice(THINGS), hiding=rng.choice(HIDING),
             fear=rng.choice(FEARS), build=rng.choice(BUILDS), gift=rng.choice(GIFTS),
             feel=rng.choice(FEELINGS), parent=pick(rng, "mom", "dad"),
             grown=pick(rng, "mom", "dad", "grandma", "grandpa"))
    c["f_who"] = c["f_who"].format(**c)
    for key in ("he", "his", "f_he"):  # for sentences that start with a pronoun
        c[key.replace("he", "He").replace("his", "His")] = c[key].capitalize()
    return c


def opening(rng):
    return [rng.choice(OPENINGS) + " a {trait} {kind} named {name}.",
            pick(rng, "{He} loved to play {at_place}.", "{name} liked to run and jump {at_place}.",
                 "{He} lived near {place} and went there every day."),
            pick(rng, "{His} favorite toy was a {thing}.",
                 "{He} had a {thing} that {he} took everywhere.",
                 "{name} had a {thing}, and {he} loved it very much.")]


def arc_lost(rng):
    return [rng.choice(WEATHER), "One day, {name} went to {place} with {his} {thing}.",
            pick(rng, "{He} played and played, and then the {thing} was gone!",
                 "When it was time to go home, {he} could not find the {thing}."),
            '{name} felt {feel}. "Where is my {thing}?" {he} cried.',
            'A {f_kind} named {f_name} saw {him}. "I will help you look," {f_he} said.',
            pick(rng, "They looked everywhere. At last, {f_name} found it {hiding}.",
                 "They looked and looked. Then {name} saw something {hiding}. It was the {thing}!"),
            pick(rng, '"Thank you, {f_name}!" said {name}. "You are a good friend."',
                 '{name} gave {f_name} a big hug. "Thank you for helping me," {he} said.'),
            "From that day on, they played together every day."]


def arc_share(rng):
    return ["One day, a {f_kind} named {f_name} came to {place}.",
            '"Can I play with your {thing}?" asked {f_name}.',
            pick(rng, '"No, it is mine!" said {name}, and {he} held it tight.',
                 '{name} did not want to share. "It is my {thing}," {he} said.'),
            "{f_name} felt {feel} and sat down alone.",
            pick(rng, "{name} looked at {f_name}. {He} did not feel happy either.",
                 'Then {name} remembered what {his} {parent} said: "It is good to share."'),
            '{He} walked over and said, "Here, we can play with it together."',
            pick(rng, "{f_name} smiled. They played with the {thing} until the sun went down.",
                 "They took turns with the {thing} and laughed all afternoon."),
            "{name} learned that playing with a friend is more fun than playing alone."]


def arc_fear(rng):
    return ["But {name} was afraid of {fear}.",
            'One evening, {he} told {his} {grown}, "I am scared of {fear}."',
            pick(rng, '{His} {grown} smiled. "Everyone is scared sometimes. I will stay with you."',
                 '"Let us be brave together," said {his} {grown}, and held {his} hand.'),
            'The next day, {f_who} came to play. "Come on, {name}!" {f_he} called.',
            pick(rng, "{name} took a deep breath. {He} counted to three and tried.",
                 "{name} closed {his} eyes, then opened them and took one small step."),
            'It was not so bad! {name} laughed. "I did it!" {he} said.',
            "Now {name} is not afraid of {fear} anymore, and {he} feels very proud."]


def arc_help(rng):
    return [("One day, {name} went to {place}. " + rng.choice(WEATHER)).rstrip(),
            "{He} heard a small sound. It was a little {pet}, and it {trouble}.",
            '"Oh no!" said {name}. "I must help."',
            pick(rng, "{He} was careful and kind. {He} {rescue}.",
                 "{name} asked {his} {grown} for help, and together they {rescue}."),
            'The little {pet} was so happy. "Thank you," it seemed to say.',
            pick(rng, "After that, the {pet} came to visit {name} every morning.",
                 "{name} told {f_who} about it, and the next day they went to see the {pet}.")]


def arc_build(rng):
    return ["One day, {name} wanted to make {build}.",
            "{He} worked very hard. {He} made it big and tall.",
            pick(rng, "But then, the wind came, and it fell down!",
                 "But then, it broke into many pieces!",
                 "But then, {f_who} bumped into it, and it fell."),
            '{name} felt {feel}. "Now I have to start again," {he} said.',
            '{f_who} came over. "Do not be sad. I will help you. We can make it together."',
            pick(rng, "So they made {build} again. This time it was even better.",
                 "They tried again, slowly and carefully, and it stood up tall."),
            "{name} and {f_name} were very proud. They showed it to {name}'s {grown}.",
            '"What a beautiful job!" said {his} {grown}.']


def arc_rule(rng):
    return ['{His} {parent} said, "Do not go near the river without me. It is not safe."',
            "But one day, {name} saw something shiny by the river, and {he} wanted it.",
            "{He} walked to the water alone. {He} slipped and fell in the mud!",
            pick(rng, '{name} was wet and cold. "Help!" {he} called.',
                 "{His} {thing} floated away, and {name} began to cry."),
            "{His} friend {f_who} heard {him} and ran to get {his} {parent}.",
            '{His} {parent} came fast and lifted {him} up. "Are you okay?"',
            '"I am sorry," said {name}. "I should have listened to you."',
            pick(rng, '{His} {parent} hugged {him}. "I am glad you are safe."',
                 "They went home and had warm soup by the fire.")]


def arc_race(rng):
    return ["One day, {name} and {f_who} had a race {at_place}.",
            '"Ready, set, go!" they shouted, and off they ran.',
            "{name} ran very fast. But then {he} tripped on a stone and fell down.",
            '{f_name} could win the race, but {f_he} stopped. "Are you hurt?" {f_he} asked.',
            pick(rng, '"My knee hurts a little," said {name}.',
                 '"I am okay," said {name}, "but it hurts."'),
            "{f_name} helped {him} up, and they walked to the finish together.",
            pick(rng, "Nobody won the race, but they both felt like winners.",
                 'They laughed and said, "Let us finish every race together!"')]


def arc_gift(rng):
    return ["Soon it was {his} {grown}'s birthday. {name} wanted to give a present.",
            '"What can I give?" {he} asked {f_who}.',
            '"You can make {gift}," said {f_name}.',
            pick(rng, "So {name} made {gift}. It took a long time, but {he} did not stop.",
                 "{name} worked all morning to make {gift}."),
            "When {his} {grown} saw it, {his} {grown} smiled very big.",
            pick(rng, '"This is the best present ever," said {his} {grown}, and hugged {name}.',
                 '"Thank you, {name}. I love it!" said {his} {grown}.'),
            "{name} felt warm and happy inside."]


ARCS = {  # each arc with the moral that fits it
    arc_lost: "a good friend helps you look.",
    arc_share: "sharing makes everyone happy.",
    arc_fear: "being brave does not mean you are not scared.",
    arc_help: "a kind act is never too small.",
    arc_build: "if something breaks, do not give up. Try again.",
    arc_rule: "listen to the people who love you.",
    arc_race: "a friend matters more than winning.",
    arc_gift: "the best presents are made with love.",
}


def story(rng):
    """One story: an opening, the arc in two paragraphs, sometimes a moral; '\\n\\n' between."""
    c = cast(rng)
    arc = rng.choice(list(ARCS))
    body = arc(rng) + [rng.choice(CLOSINGS)]
    cut = rng.randint(2, len(body) - 3)  # where the second paragraph starts varies
    paragraphs = [opening(rng), body[:cut], body[cut:]]
    if rng.random() < 0.3:
        moral = pick(rng, "The moral of the story is: ", "And so they learned: ") + ARCS[arc]
        paragraphs.append([moral])
    return "\n\n".join(" ".join(s.format(**c) for s in p if s) for p in paragraphs)


def generate_stories(n_stories, seed=0):
    """Yield `n_stories` stories (str, ~100-170 words each), the same ones for the same seed."""
    if not isinstance(n_stories, int) or n_stories < 0:
        raise ValueError(f"n_stories must be a non-negative int, got {n_stories!r}")
    rng = random.Random(seed)
    for _ in range(n_stories):
        yield story(rng)


def main():
    parser = argparse.ArgumentParser(description="Print a few generated sample stories.")
    parser.add_argument("-n", type=int, default=3, help="how many stories")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for text in generate_stories(args.n, args.seed):
        print(text, end="\n<|endoftext|>\n")


if __name__ == "__main__":
    main()
