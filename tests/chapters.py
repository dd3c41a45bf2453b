"""Read the chapters in steps/ and compare what they show with what the code is and does.

The rules (the chapter author's side of them is in steps/README.md):

1. Source blocks. A fenced code block whose first line is a comment naming a repository file,
   such as `# tiny_llm/embed.py`, must appear in that file. Whitespace is normalised (runs of
   spaces and newlines count as one space), so indentation and blank lines may differ. A line
   `# ...` inside the block elides code: the pieces around it must appear in the file in order.

2. Output blocks. A fenced block with the info string `console` holds commands (lines starting
   with `$ `) each followed by the output it prints. The test runs every command and compares:
   - text exactly (runs of spaces count as one space);
   - `...` inside a line matches any text; a line that is only `...` matches any lines;
   - numbers within a tolerance: integers exactly, decimals within 1% or 2 units of the last
     printed digit, whichever is larger. `<!-- check: rtol=0.05 -->` on the line before the
     block changes the relative tolerance for every number in it (integers included).
   The commands of one block run in order in one scratch folder (`scripts/` and `steps/` linked
   in), with TINY_LLM_DATA_DIR pointing at data prepared from the sample corpus, so numbers that
   depend on the corpus are the sample's.
"""

import collections
import functools
import gc
import hashlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tiny_llm.course.buildup import (  # noqa: F401 (re-exported for the tests)
    FENCE,
    console_commands,
    line_matches,
    output_matches,
    squash,
)

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "steps"

SOURCE_HEADER = re.compile(r"^#\s*((?:tiny_llm|scripts|tests)/[\w/.-]+\.py)\s*$")
CHECK_OPTIONS = re.compile(r"<!--\s*check:(.*?)-->\s*$")
ELISION = re.compile(r"^\s*#\s*\.\.\.\s*$")


@dataclass
class Block:
    chapter: Path
    line: int
    info: str
    body: str
    options: dict = field(default_factory=dict)

    @property
    def where(self):
        return f"{self.chapter.name}:{self.line}"


def chapters():
    return sorted(STEPS.glob("[0-9][0-9]-*.md"))


def blocks(chapter):
    """Every fenced block of a chapter, with the `<!-- check: ... -->` options just above it."""
    text = chapter.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        options = {}
        if opt := CHECK_OPTIONS.search(before):
            for pair in opt.group(1).split():
                key, _, value = pair.partition("=")
                options[key] = value
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(chapter, line, match.group(2).strip(), match.group(3), options))
    return found


def source_blocks():
    """Blocks that show code from a file (diff blocks, a step's changes, are checked apart)."""
    every = [b for c in chapters() for b in blocks(c) if b.info != "diff"]
    return [b for b in every if SOURCE_HEADER.match(b.body.split("\n", 1)[0])]


def chapter_step(chapter):
    """steps/04-embed.md -> 4."""
    return int(Path(chapter).name[:2])


def console_blocks():
    return [b for c in chapters() for b in blocks(c) if b.info == "console"]


def source_pieces(block):
    """Split a source block into (file, [pieces]) where each piece is whitespace-normalised."""
    first, _, rest = block.body.partition("\n")
    path = SOURCE_HEADER.match(first).group(1)
    pieces, current = [], []
    for line in rest.split("\n"):
        if ELISION.match(line):
            pieces.append(current)
            current = []
        else:
            current.append(line)
    pieces.append(current)
    return path, [squash("\n".join(p)) for p in pieces if squash("\n".join(p))]


def missing_piece(block):
    """Return None when the block appears in its file as the file stands at the chapter's step
    (tiny_llm/ files: the build-up's state, tiny_llm.course.buildup), else say what is missing."""
    from tiny_llm.course import buildup

    path, pieces = source_pieces(block)
    if path.startswith("tiny_llm/"):
        files = buildup.state(chapter_step(block.chapter))
        name = path.removeprefix("tiny_llm/")
        if name not in files:
            return f"{block.where} names {path}, which does not exist at that step"
        code = squash(files[name])
    else:
        target = ROOT / path
        if not target.exists():
            return f"{block.where} names {path}, which does not exist"
        code = squash(target.read_text())
    at = 0
    for piece in pieces:
        found = code.find(piece, at)
        if found < 0:
            return f"{block.where}: this part of the block is not in {path} (in order):\n{piece}"
        at = found + len(piece)
    return None


def python_argv(command):
    """The argv after `python` of a chapter command: `uv run python ARGS` -> ARGS, and the
    type-along's own command `uv run workalong ARGS` -> -m tiny_llm.course.workalong ARGS (the
    `[project.scripts]` entry); None for any other command."""
    import shlex

    argv = shlex.split(command)
    if argv[:3] == ["uv", "run", "python"]:
        return argv[3:]
    if argv[:3] == ["uv", "run", "workalong"]:
        return ["-m", "tiny_llm.course.workalong", *argv[3:]]
    return None


def commands(block):
    """[(command, expected_lines)] from a console block."""
    return console_commands(block.body, block.where)


def command_modules(command, files):
    """The tiny_llm modules (names) a console command runs, imported directly or through each
    other, given the package `files` ({file name: text}); None when the command's entry cannot
    be read (the caller then assumes the worst). `python -m tiny_llm.x`, `python -m solutions.y`,
    `python scripts/z.py`, `python -c CODE` and torchrun's `... -m tiny_llm.x` are read."""

    from tiny_llm.course import buildup

    argv = python_argv(command) or []
    if "torch.distributed.run" in argv[:2]:
        argv = argv[2:]
        while argv and argv[0] != "-m" and not argv[0].endswith(".py"):
            argv = argv[1:]
    if len(argv) < 2 and not (argv and argv[0].endswith(".py")):
        return None
    if argv[0] == "-m" and argv[1].startswith("tiny_llm."):
        return buildup.imports(files, argv[1].split(".", 1)[1])
    if argv[0] == "-c":
        source = argv[1]
    else:
        path = ROOT / (argv[1].replace(".", "/") + ".py" if argv[0] == "-m" else argv[0])
        if not path.is_file():
            return None
        source = path.read_text()
    return buildup.imports({**files, "__entry__.py": source}, "__entry__") - {"__entry__"}


# Steps 04 to 10 are played whole by tests/test_learner_path.py: each state is built by the
# type-along from the chapter's own code, its step's tests run there, and so do the chapter's
# checks (workalong.check_blocks). Other tests leave out what that one proves.
PLAYED = range(4, 11)


def learner_checked(block):
    """Whether test_learner_path runs this console block at its step's state."""
    from tiny_llm.course import workalong

    step = chapter_step(block.chapter)
    if step not in PLAYED:
        return False
    mine = [command for command, _ in commands(block)]
    return any([c for c, _ in pairs] == mine for pairs in workalong.check_blocks(step))


def same_at_head(block):
    """Whether every tiny_llm module the block's commands run is byte-identical at the block's
    step and at the repository's head: then one run proves the block at both."""
    from tiny_llm.course import buildup

    at_step, head = buildup.state(chapter_step(block.chapter)), buildup.finished()
    for command, _ in commands(block):
        names = [command_modules(command, files) for files in (at_step, head)]
        if None in names:
            return False
        file = buildup.module_file
        if any(at_step.get(file(n)) != head.get(file(n)) for n in names[0] | names[1]):
            return False
    return True


def places(block):
    """Where a console block must run: [(in words, the package: None for its step's state or
    the head's tiny_llm/)]: at its step's state, unless test_learner_path runs it there (steps
    04-10), and again at the head where its modules differ from the state's."""
    if block.where not in _PLACES:
        where = [] if learner_checked(block) else [("its step's state", None)]
        if not same_at_head(block):
            where.append(("the repository's head", ROOT / "tiny_llm"))
        _PLACES[block.where] = where
    return list(_PLACES[block.where])


_PLACES = {}


# Replays. Chapters 17 and 18 both begin by training the same base model and tuning it to
# requests, and chapter 20 with the training run that chapter 19 begins with. Each block starts
# in an empty folder, so a command's output is decided by its words, the package it runs and
# the commands before it in its block: where all three are those of a command that this test
# process has run already (the same chain key), what that run printed and left in its folder is
# this one's too, a real run of the same code on the same files. The blocks that share a chain
# go to one test worker (tests/conftest.py, replay_groups).


@functools.cache
def package_digest(step):
    """A digest of every file of the package a block runs: at `step`'s state, or the head's
    (step None): the whole package, so that a module imported by name is covered too."""
    from tiny_llm.course import buildup

    files = buildup.finished() if step is None else buildup.state(step)
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{len(name)}:{name}{len(files[name])}:".encode() + files[name].encode())
    return digest.hexdigest()


def chain_keys(block, package):
    """The chain key of each of the block's commands, run on `package` (None: its step's state)."""
    digest = package_digest(None if package else chapter_step(block.chapter))
    keys, key = [], digest
    for command, _ in commands(block):
        key = hashlib.sha256(f"{key}\n{command}".encode()).hexdigest()
        keys.append(key)
    return keys


@functools.cache
def repeated_keys():
    """The chain keys that more than one run of a console block reaches."""
    seen = collections.Counter(key for block in console_blocks()
                               for _, package in places(block)
                               for key in set(chain_keys(block, package)))
    return frozenset(key for key, count in seen.items() if count > 1)


def replay_groups():
    """{block.where: group}: the blocks whose runs share a chain key, one group each, named
    after its first block."""
    keys = {block.where: {key for _, package in places(block)
                          for key in chain_keys(block, package)} & repeated_keys()
            for block in console_blocks()}
    groups, pending = {}, {where: mine for where, mine in keys.items() if mine}
    while pending:  # a group: every block linked to its first by keys shared, directly or not
        first = next(iter(pending))
        members, shared = {first}, set(pending[first])
        while joined := {w for w, theirs in pending.items()
                         if w not in members and theirs & shared}:
            members |= joined
            shared |= set().union(*(pending[w] for w in joined))
        for where in members:
            groups[where] = f"replay {first}"
            del pending[where]
    return groups


def folder_files(work):
    """{relative path: bytes} of what the commands left in the block's folder `work` (not its
    links to the repository's scripts/ and steps/, nor the package)."""
    found = {}
    for top, folders, names in os.walk(work):
        if top == str(work):
            folders[:] = [f for f in folders if f not in ("scripts", "steps", "tiny_llm")]
        for name in names:
            path = os.path.join(top, name)
            if not os.path.islink(path):
                with open(path, "rb") as file:
                    found[os.path.relpath(path, work)] = file.read()
    return found


def put_folder_files(work, files):
    """Make the block's folder hold exactly `files` (folder_files' form)."""
    for name in set(folder_files(work)) - set(files):
        os.unlink(os.path.join(work, name))
    for name, data in files.items():
        path = os.path.join(work, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            file.write(data)


# A warm interpreter for the console commands. Every command is a fresh Python process, as a
# learner's is, but a fresh interpreter spends about 4 s of CPU importing torch (and
# torch._dynamo, which the first optimizer loads) before the command's own work starts: most of
# the time of the short commands. So one server process for the whole suite imports those
# libraries once, and for each test process (each xdist worker) forks a handler, which forks a
# child per command; the child becomes the command's interpreter
# (`python -m module args`, `python script.py args` or `python -c code`: the same argv, folder,
# environment, __main__ and sys.path[0] as the command line gives) and exits as Python does.
# The project's own modules are not preloaded: each command imports them fresh.
# TINY_LLM_CHAPTERS_COLD=1 runs every command in a brand-new interpreter instead.
#
# Preloaded: libraries that read no setting of the environment when imported (a command's
# environment may differ from the server's), so that importing them earlier changes nothing a
# command does. Not preloaded for that reason: transformers, huggingface_hub and datasets (they
# read HF_HOME and the offline switches at import). pytest's plugins are preloaded through its
# own import hook (_preload_pytest_plugins).

PRELOAD = ("torch", "torch._dynamo", "numpy", "tokenizers", "regex", "matplotlib",
           "matplotlib.figure", "matplotlib.backends.backend_agg", "PIL.Image",
           "torch.distributed.checkpoint.state_dict", "torch.onnx", "onnx", "onnxscript",
           "onnxruntime", "networkx", "torch.onnx._internal.exporter._core", "pytest", "trio")


def _preload_pytest_plugins():
    """The modules of pytest's own plugins, which every pytest run a test starts imports, and
    those of the installed ones (pytest-xdist, anyio's, platformdirs'), imported the way a
    pytest run imports them: through its assertion-rewriting hook. A pytest run rewrites every
    module of a plugin's package as it imports it (anyio's are most of a second's work, in each
    of the 60-odd runs the tests start); preloaded by the hook, a run finds them imported and
    rewritten (pytest warns only of a plugin module imported another way)."""
    import contextlib
    import importlib
    import io
    import tempfile

    import pytest
    from _pytest.config import default_plugins

    for name in default_plugins:
        importlib.import_module(f"_pytest.{name}")
    # One run that collects nothing, in an empty folder whose empty pytest.ini is its settings
    # (not a settings file of a folder above it), its output dropped; -s: no descriptor moved.
    with tempfile.TemporaryDirectory(prefix="preload-") as empty:
        Path(empty, "pytest.ini").write_text("")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            pytest.main(["--collect-only", "-q", "-s", "-p", "no:cacheprovider", empty])


def _become(argv):
    """In a forked child: run `python *argv` here, the way the interpreter's command line does."""
    import runpy
    import types

    sys.modules["__main__"] = types.ModuleType("__main__")  # not this file's: an empty one
    for name in [n for n in sys.modules if n == "tiny_llm" or n.startswith("tiny_llm.")]:
        del sys.modules[name]  # this file uses tiny_llm.course.buildup; a command imports its own
    if argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]  # runpy puts the module's file in argv[0], as `-m` does
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(argv[1], alter_argv=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        exec(compile(argv[1], "<string>", "exec"), sys.modules["__main__"].__dict__)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def serve(folder):
    """The server: it loads the libraries, forks the rank server (its interpreter `python` is
    written in `folder`, see RANK_PYTHON), then listens on `folder`/warm.sock and forks a handler
    for every test process that connects (serve_client). It ends when its standard input is
    closed or its starter ends."""
    import importlib
    import select
    import socket
    import traceback

    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError:  # another version's layout: the command imports what it needs
                pass
        _preload_pytest_plugins()
        # The preloaded objects go to the collector's permanent generation: a collection in a
        # child (pytest runs one at every session's end) then walks only the command's own
        # objects, and does not touch, and so copy, every page of the shared heap.
        gc.freeze()
        ranks = _start_rank_server(folder)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(os.path.join(folder, "warm.sock.new"))
        listener.listen(64)
        os.rename(os.path.join(folder, "warm.sock.new"), os.path.join(folder, "warm.sock"))
    except BaseException:  # said to the test processes waiting for the socket (WarmPython)
        with open(os.path.join(folder, "failed"), "w") as file:
            file.write(traceback.format_exc())
        raise
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the handlers
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in readable:  # closed: the suite is done with it, or its starter is gone
            if ranks is not None:
                os.kill(ranks, signal.SIGTERM)
            # Nothing of the server's is left to save or flush: it ends without the
            # interpreter's teardown of torch's modules (a second of CPU).
            os._exit(0)
        _fork_handler(listener, serve_client)


def _fork_handler(listener, handle):
    """Accept a connection on `listener` and fork `handle(conn)` for it (which never returns),
    with the signals a forked process starts with; here the listening goes on."""
    conn, _ = listener.accept()
    if os.fork() == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a handler waits for what it forks
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        listener.close()
        handle(conn)
    conn.close()


def serve_client(conn):
    """A handler, forked for one test process: one JSON request a line; for each it forks the
    command's process and replies with its `pid`, then `exit-status cpu-seconds` when it ends.
    It ends with the connection."""
    import json

    requests = conn.makefile("rb")
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            break
        conn.sendall(f"{pid}\n".encode())
        _, status, usage = os.wait4(pid, 0)
        cpu = usage.ru_utime + usage.ru_stime  # the command's CPU seconds, its children's too
        conn.sendall(f"{os.waitstatus_to_exitcode(status)} {cpu}\n".encode())
    else:
        os._exit(0)
    # the child: the command's own process from here on
    requests.close()
    conn.close()
    for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                           (2, request["stderr"], os.O_WRONLY)):
        target = os.open(path, mode)
        os.dup2(target, fd)
        os.close(target)
    _command(request["cwd"], request["env"], request["argv"])


def _command(cwd, env, argv):
    """In a forked child whose files are in place: become `python *argv` in folder `cwd` with
    environment `env`, the ranks it starts forks too, and end as that interpreter ends."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _use_rank_python(RANKS[0])
    _end(_run_as_main(argv))


# Ranks. A command that starts ranks of its own (torchrun's agent, or torch.multiprocessing's
# spawn in step 16's check) starts each as a new interpreter, which would import torch again (3 s
# of CPU a rank). In the tests they start `python` in the server's folder instead: a small
# interpreter (RANK_PYTHON, which imports no library) that sends its argv, folder, environment
# and open files over a socket to a rank server forked from this one; a handler forked from that
# forks the rank, with the same files at the same numbers, and waits for it. The small one passes
# the signals it gets on to the rank and ends as the rank ends; if it is killed, the handler
# kills the rank. torchrun reads the interpreter from PYTHON_EXEC (run_python sets it),
# multiprocessing from multiprocessing.set_executable (set in every forked command).

RANK_PYTHON = """#!{python} -S
import json, os, signal, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect({socket!r})
fds = []
for name in os.listdir("/proc/self/fd"):
    if int(name) != sock.fileno():
        try:
            os.fstat(int(name))
        except OSError:  # the listing's own, closed by now
            continue
        fds.append(int(name))
request = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ),
                      "fds": fds}}).encode()
socket.send_fds(sock, [len(request).to_bytes(8, "big") + request], fds)
replies = sock.makefile("rb")
pid = int(replies.readline())
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
               signal.SIGUSR2):
    signal.signal(number, lambda number, frame: os.kill(pid, number))
status = int(replies.readline())
if status < 0:
    signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
sys.exit(status)
"""


RANKS = [None]  # the folder of the rank interpreter, where this system has what it needs


def forked_ranks_possible():
    """Linux: a process's open files are listed in /proc/self/fd, and os.pidfd_open waits for
    a process that is not one's child. Elsewhere (macOS) ranks start as new interpreters."""
    return hasattr(os, "pidfd_open") and os.path.isdir("/proc/self/fd")


def _start_rank_server(folder):
    """Write the rank interpreter into `folder`, fork the rank server; return its pid (None
    where ranks cannot be forks)."""
    import socket

    if not forked_ranks_possible():
        return None
    RANKS[0] = folder

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, "ranks.sock"))
    listener.listen(64)
    python = os.path.join(folder, "python")
    with open(python, "w") as file:
        file.write(RANK_PYTHON.format(python=sys.executable, socket=listener.getsockname()))
    os.chmod(python, 0o755)
    pid = os.fork()
    if pid == 0:
        serve_ranks(listener)
    listener.close()
    return pid


def serve_ranks(listener):
    """The rank server: a handler forked for every rank interpreter that connects."""
    import ctypes

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the handlers
    signal.signal(signal.SIGTERM, lambda number, frame: os._exit(0))
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: it ends with the server
    if os.getppid() == 1:
        os._exit(0)
    while True:
        _fork_handler(listener, _handle_rank)


def _handle_rank(conn):
    """A handler: fork the rank the request asks for, report its pid and its exit status."""
    import fcntl
    import json
    import select
    import socket

    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 1024)
    size = int.from_bytes(data[:8], "big")
    data = data[8:]
    while len(data) < size:
        data += conn.recv(size - len(data))
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:
        conn.close()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in fds]  # out of the targets' way
        for fd in fds:
            os.close(fd)
        for source, target in zip(high, request["fds"], strict=True):
            os.dup2(source, target)
        for fd in high:
            os.close(fd)
        argv = request["argv"]
        while argv and argv[0].startswith("-") and argv[0] not in ("-m", "-c"):
            option = argv.pop(0)  # the interpreter's own options: -u matters, the rest not here
            if option in ("-W", "-X"):
                argv.pop(0)
            elif option == "-u":
                import io

                sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False),
                                              write_through=True)
                sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False),
                                              write_through=True, errors="backslashreplace")
        _command(request["cwd"], request["env"], argv)
    for fd in fds:  # the rank has them now: a pipe's end held here would keep it open
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    exited = os.pidfd_open(pid)
    while select.select([conn, exited], [], [])[0] != [exited]:
        if not conn.recv(1):  # the rank interpreter was killed: so is its rank
            os.kill(pid, signal.SIGKILL)
            break
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    except OSError:
        pass
    os._exit(0)


def _use_rank_python(folder):
    """In a forked command or rank: the ranks it starts with multiprocessing's spawn are forks
    too (see RANK_PYTHON)."""
    if folder is not None:
        import multiprocessing

        multiprocessing.set_executable(os.path.join(folder, "python"))


INTERRUPTED = object()


def _run_as_main(argv):
    """Run the command; return its exit status as the interpreter would give it, having printed
    what the interpreter prints for an exception or a SystemExit's message; INTERRUPTED when
    a KeyboardInterrupt ended it."""
    try:
        _become(argv)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        return INTERRUPTED  # Python ends by the signal itself (_end sends it)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _end(status):
    """End the forked child as multiprocessing ends its forked processes: what an interpreter's
    exit shows (waiting for threads, atexit's functions, flushed output) and then os._exit.
    The teardown of every module is skipped: it would walk, and copy, the whole shared heap,
    and print nanobind's leak report for the frozen objects (see serve)."""
    import atexit
    import threading

    try:
        threading._shutdown()  # the interpreter waits for non-daemon threads first
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed stream: nothing left to write
                pass
        if status is INTERRUPTED:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(status & 0xFF)


CHILD_CPU = [0.0]  # CPU seconds of every command run by a WarmPython of this process


class WarmServer:
    """Starts the warm interpreter (serve) in a folder of its own; the test processes reach it
    with WarmPython(server.folder). One serves the whole suite: the xdist controller starts it
    as the workers start (tests/conftest.py), a run without workers at its first command."""

    def __init__(self, env):
        import tempfile

        env = {**env, **ON_THE_CPU}  # the server never touches a GPU, so its forks may not either
        self.folder = tempfile.mkdtemp(prefix="warm-")
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", self.folder],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        with open(os.path.join(self.folder, "server.pid"), "w") as file:
            file.write(str(self.proc.pid))

    def close(self):
        """End it, ready or not (the test processes are done with it), and its folder."""
        import shutil

        self.proc.stdin.close()
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class WarmPython:
    """A test process's connection to the warm interpreter in `folder` (WarmServer):
    `run(argv, cwd, env, timeout)` -> (exit status, out, err)."""

    def __init__(self, folder):
        self.folder = folder
        self.rank_python = (os.path.join(folder, "python") if forked_ranks_possible()
                            else None)
        self.sock = self.replies = None

    def ready(self):
        """Connect, once the server has loaded its libraries and written the rank interpreter."""
        import socket
        import time

        if self.sock is None:
            path, failed = (os.path.join(self.folder, name) for name in ("warm.sock", "failed"))
            with open(os.path.join(self.folder, "server.pid")) as file:
                pid = int(file.read())
            while not os.path.exists(path):
                if os.path.exists(failed):
                    with open(failed) as file:
                        raise AssertionError(f"the warm interpreter did not start:\n{file.read()}")
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    raise AssertionError("the warm interpreter ended before it started") from None
                time.sleep(0.02)
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(path)
            self.replies = self.sock.makefile("rb", buffering=0)
            # unbuffered: readline takes one reply line and leaves the next for select to see
        return self

    def run(self, argv, cwd, env, timeout):
        import json
        import select
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            for path in (out, err):
                open(path, "w").close()
            request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": out, "stderr": err}
            self.ready()
            try:
                self.sock.sendall(json.dumps(request).encode() + b"\n")
            except OSError:
                raise self._ended(argv) from None
            pid = int(self._reply(argv))
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                os.kill(pid, signal.SIGKILL)
            status, cpu = self._reply(argv).split()
            CHILD_CPU[0] += float(cpu)
            if not ready:
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
            with open(out) as o, open(err) as e:
                return int(status), o.read(), e.read()

    def _reply(self, argv):
        line = self.replies.readline()
        if not line:
            raise self._ended(argv)
        return line

    @staticmethod
    def _ended(argv):
        return AssertionError(f"the warm interpreter's handler for this test process ended "
                              f"while it ran `python {' '.join(argv)[:200]}`")

    def close(self):
        if self.sock is not None:
            self.replies.close()
            self.sock.close()


# The chapters print what the code prints on a CPU, so the commands the tests run compute on the
# CPU on every machine: TINY_LLM_DEVICE is what step 01's pick_device reads (it covers an MPS
# Mac too), and an empty CUDA_VISIBLE_DEVICES hides any NVIDIA GPU from the rest (a rank's
# backend, a checkpoint's generator states). The GPU paths have their own tests (test_gpu.py).
ON_THE_CPU = {"TINY_LLM_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}


def run_python(argv, cwd, env, timeout, warm=None):
    """`python *argv` in the folder cwd, on the CPU (ON_THE_CPU), in a fork of `warm` (a
    WarmPython) or, when warm is None, in a brand-new interpreter. Returns a
    subprocess.CompletedProcess with text stdout, stderr. torchrun's agent and ranks are forks
    where ranks can be (RANK_PYTHON); elsewhere torchrun starts fresh, ranks and all: an agent
    forked from the warm interpreter then would start its ranks as new interpreters anyway."""
    env = {**env, **ON_THE_CPU}
    torchrun = "torch.distributed.run" in argv[:2]
    if warm is not None and torchrun and warm.ready().rank_python:
        env["PYTHON_EXEC"] = warm.rank_python  # its ranks are forks too (see RANK_PYTHON)
    elif torchrun:
        warm = None
    if warm is None:
        return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)
    code, out, err = warm.run(argv, cwd, env, timeout)
    return subprocess.CompletedProcess([sys.executable, *argv], code, out, err)


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    serve(sys.argv[2])
