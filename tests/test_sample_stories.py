import re

import pytest

from tiny_llm.sample_stories import ARCS, BOYS, GIRLS, PET_NAMES, generate_stories


@pytest.fixture(scope="module")
def stories():
    return list(generate_stories(2000, seed=0))


def test_same_seed_same_stories_other_seed_other_stories(stories):
    assert list(generate_stories(50, seed=0)) == stories[:50]
    assert list(generate_stories(50, seed=1)) != stories[:50]


def test_stories_are_not_near_duplicates(stories):
    assert len(set(stories)) == len(stories)
    first_sentences = {story.split(".")[0] for story in stories}
    assert len(first_sentences) > 0.5 * len(stories)
    paragraphs = [p for story in stories for p in story.split("\n\n")]
    assert len(set(paragraphs)) > 0.8 * len(paragraphs)


def test_train_and_valid_seeds_share_no_story(stories):
    assert not set(generate_stories(500, seed=1)) & set(stories)


def test_stories_vary_in_cast_arc_and_shape(stories):
    text = "\n".join(stories)
    names = {name for name in (*GIRLS, *BOYS, *PET_NAMES) if re.search(rf"\b{name}\b", text)}
    assert len(names) > 0.9 * len(set(GIRLS + BOYS + PET_NAMES))
    arc_markers = ["could not find", "want to share", "afraid of", "I must help", "start again",
                   "near the river", "had a race", "birthday"]
    assert len(arc_markers) == len(ARCS)
    for marker in arc_markers:
        assert 0.05 < sum(marker in s for s in stories) / len(stories) < 0.3, marker
    with_dialogue = sum('"' in story for story in stories) / len(stories)
    with_moral = sum("moral of the story" in s or "they learned:" in s for s in stories)
    assert with_dialogue > 0.95
    assert 0.2 < with_moral / len(stories) < 0.4
    words = [len(story.split()) for story in stories]
    assert 60 < min(words) and max(words) < 250


def test_stories_are_clean_text(stories):
    for story in stories[:500]:
        assert "{" not in story and "}" not in story, story  # every template slot was filled
        assert "  " not in story and story == story.strip(), story
        assert all(p.strip() for p in story.split("\n\n")), story
        assert story[-1] in '.!"', story
        assert story.isascii()


def test_bad_n_stories_is_refused():
    with pytest.raises(ValueError, match="non-negative int, got -1"):
        list(generate_stories(-1))
    with pytest.raises(ValueError, match="got 2.5"):
        list(generate_stories(2.5))
    assert list(generate_stories(0)) == []
