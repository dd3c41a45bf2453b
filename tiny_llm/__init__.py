"""tiny-llm: build a small GPT from scratch, one step at a time."""

import os

if os.environ.get("TINY_LLM_WORKALONG"):
    # The type-along path (tiny_llm/workalong.py): the learner's file stands in for one step in
    # this process and in every process it starts (torchrun ranks, a chapter's commands).
    from tiny_llm.workalong import LearnerFinder

    LearnerFinder.install(os.environ["TINY_LLM_WORKALONG"])
