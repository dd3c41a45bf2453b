"""tiny-llm: build a small GPT from scratch, one step at a time."""
