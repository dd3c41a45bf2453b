"""The course's own tools, not steps: the type-along (`uv run workalong NN`), the build-up that
derives every step's package from the finished one and the chapters' diffs, and the chapters'
diagrams. A learner never writes these; `ls tiny_llm/` shows the steps and their helpers."""
