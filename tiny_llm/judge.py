"""Shared helper (step 11): a judge, another model that grades the stories, through any
OpenAI-compatible chat endpoint (Ollama, llama.cpp's llama-server, vLLM, the course's studio).

TinyStories' rubric: grammar, creativity, consistency and plot, each 1 to 10 as the paper grades
them, so a reader can set the figures beside its tables (a small judge uses a narrow band of
them anyway: step 11's chapter says how to check one). The request asks for JSON at temperature
0 with a seed; every request and answer is kept (JudgeRecord), and an answer that holds no
grades is counted and shown, never dropped. Only the standard library talks to the server.
"""

import hashlib
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

from tiny_llm.files import atomic_path

RUBRIC = ("A young student wrote the story below; it begins with the prompt {prompt!r}. Grade "
          "the story from 1 (poor) to 10 (excellent) on four things: grammar; creativity; "
          "consistency, with its beginning and with itself; plot, whether it makes sense and "
          "ends. Answer with JSON only, no other words: "
          '{{"grammar": N, "creativity": N, "consistency": N, "plot": N}}\n\nStory:\n{story}')
GRADES = ("grammar", "creativity", "consistency", "plot")
START_ONE = ("start one: `ollama serve` (then `ollama pull qwen2.5:1.5b` and --judge-model "
             "qwen2.5:1.5b), llama.cpp's `llama-server -m MODEL.gguf --port 8080`, or the "
             "course's studio (`python -m tiny_llm.studio`), and pass the address it prints")


def judge_request(model, prompt, story, seed):
    """The chat request that asks `model` to grade one story: the rubric, temperature 0, a
    seed, and JSON asked for twice (in words, and response_format where a server knows it)."""
    return {"model": model, "temperature": 0, "seed": seed,
            "response_format": {"type": "json_object"},
            "messages": [{"role": "user", "content": RUBRIC.format(prompt=prompt, story=story)}]}


def ask_judge(url, body, key=None, timeout=120):
    """POST body to url's /v1/chat/completions (stdlib urllib); the answer's text. Errors say
    what to do: nothing listening, an HTTP error with the server's words, a timeout."""
    endpoint = url.rstrip("/").removesuffix("/v1") + "/v1/chat/completions"
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"}
                                                      if key else {})}
    request = urllib.request.Request(endpoint, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as err:
        words = err.read().decode("utf-8", "replace")[:300]
        raise ValueError(f"the judge at {endpoint} answered HTTP {err.code}: {words} (is "
                         f"--judge-model {body['model']!r} a model it serves?)") from None
    except TimeoutError:
        raise ValueError(f"the judge at {endpoint} gave no answer in {timeout} s: a large "
                         "model on a CPU is slow; try a smaller --judge-model") from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, TimeoutError):
            raise ValueError(f"the judge at {endpoint} gave no answer in {timeout} s") from None
        raise ValueError(f"cannot reach a judge at {endpoint} ({err.reason}): {START_ONE}"
                         ) from None
    try:
        return answer["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"the judge at {endpoint} answered no chat completion: "
                         f"{str(answer)[:200]}") from None


def read_grades(answer):
    """The four grades in a judge's answer, or None if it holds no JSON object with each as a
    whole number from 1 to 10. 'Sure! {"grammar": 7, ...}' -> {"grammar": 7, ...}."""
    found = re.search(r"\{.*\}", answer, re.DOTALL)
    try:
        grades = json.loads(found.group()) if found else None
    except ValueError:
        return None
    if not isinstance(grades, dict):
        return None
    grades = {k: grades.get(k) for k in GRADES}
    ok = all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 10
             for v in grades.values())
    return grades if ok else None


class JudgeRecord:
    """Every request sent to a judge and its answer, one JSON line each, keyed by a hash of the
    request: a rerun asks nothing already answered, and a reader can audit every grade."""

    def __init__(self, path):
        self.path, self.answers = Path(path), {}
        if self.path.is_file():
            for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    entry = json.loads(line)
                    if not isinstance(entry["key"], str) or not isinstance(entry["answer"], str):
                        raise TypeError
                except (ValueError, KeyError, TypeError):
                    raise ValueError(f"{self.path} line {n} is no judge's answer ({line[:60]!r}):"
                                     " delete the file to ask the judge again") from None
                self.answers[entry["key"]] = entry

    def grade(self, url, body, key=None):
        """(grades or None, the answer's text): from the record, else from the judge."""
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
        if digest not in self.answers:
            self.answers[digest] = {"key": digest, "request": body,
                                    "answer": ask_judge(url, body, key)}
            with atomic_path(self.path) as tmp:  # the whole file, never half a line
                tmp.write_text("".join(json.dumps(e) + "\n" for e in self.answers.values()),
                               encoding="utf-8")
        answer = self.answers[digest]["answer"]
        return read_grades(answer), answer
