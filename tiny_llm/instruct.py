"""STAND-IN for the requests step (tiny_llm/instruct.py, built by another branch): only the three
names the story studio uses, so that the studio and its tests run before the merge. The lead
drops this file at merge and takes the real one."""

FEATURES = ("Dialogue", "BadEnding", "MoralValue", "Twist", "Foreshadowing", "Conflict")


def render_request(words=(), features=(), sentence=None, summary=None):
    """The prompt for a request, ending where the story begins."""
    lines = []
    if words:
        lines.append("Words: " + ", ".join(words))
    if features:
        lines.append("Features: " + ", ".join(features))
    if sentence:
        lines.append(f"Random sentence: {sentence}")
    if summary:
        lines.append(f"Summary: {summary}")
    return "\n".join(lines + ["Story: "])


def takes_requests(ckpt):
    """True for a checkpoint fine-tuned to take requests."""
    return bool(ckpt.get("train_config", {}).get("requests"))
