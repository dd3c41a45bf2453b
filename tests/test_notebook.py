"""The Colab notebook's cells, top to bottom, in a real Jupyter kernel on the CPU.

Only its first cell (the settings, tagged `parameters`) is replaced: no clone or install (the
suite runs in the course already), the sample corpus the suite prepared, and the tiny preset for
a few steps instead of the gpu preset for ten minutes. Every other cell runs as a learner's does.
"""

import json

import nbformat
from nbclient import NotebookClient

from tiny_llm.paths import REPO_ROOT

NOTEBOOK = REPO_ROOT / "notebooks" / "colab.ipynb"


def settings_for_the_suite(out):
    return "\n".join([
        'REPO_URL = ""',
        "INSTALL = False",
        'DATA = "--source sample"',
        'TRAIN = "--preset tiny --max-steps 12 --warmup-steps 4 --eval-interval 6 '
        '--eval-iters 2 --batch-size 8 --sample-tokens 0"',
        f"OUT = {str(out)!r}",
    ])


def printed(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def kernel(folder, warm_python):
    """The Jupyter kernel to run: ipykernel's own launcher, in an interpreter that a kernel spec
    in `folder` names: where ranks can be forks of the suite's warm interpreter
    (tests/chapters.py), its rank interpreter, which forks the kernel from the warm one with
    torch loaded, as a fresh kernel has it after its first cell; elsewhere Python itself."""
    python = warm_python.ready().rank_python if warm_python is not None else None
    if python is None:
        return "python3"
    spec = folder / "kernels" / "python3-warm"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (forked)", "language": "python"}))
    return "python3-warm"


def test_the_colab_notebook_runs_top_to_bottom_on_the_cpu(sample_data_dir, tmp_path, monkeypatch,
                                                          warm_python):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    settings = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(settings) == 1 and notebook.cells.index(settings[0]) == 1
    for name in ("REPO_URL", "INSTALL", "DATA", "TRAIN", "OUT"):  # what the test replaces
        assert f"{name} = " in settings[0].source
    settings[0].source = settings_for_the_suite(tmp_path / "colab")
    monkeypatch.setenv("TINY_LLM_DATA_DIR", str(sample_data_dir))  # the kernel inherits these
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("TINY_LLM_DEVICE", "cpu")
    for name, folder in (("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"),
                         ("JUPYTER_PATH", "jupyter")):
        monkeypatch.setenv(name, str(tmp_path / folder))  # nothing written to your home folder
    name = kernel(tmp_path / "jupyter", warm_python)
    NotebookClient(notebook, timeout=120, kernel_name=name,
                   resources={"metadata": {"path": str(REPO_ROOT)}}).execute()
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert not any(o.output_type == "error" for c in code for o in c.outputs)
    install, data, training, story, measure = (printed(c) for c in code[1:])
    assert "\ndevice           cpu\n" in install  # step 01's check, then the course() helper
    assert "prepared data found" in data  # the suite's sample data, kept as it is
    assert "\nstep 12 " in training and (tmp_path / "colab" / "ckpt.pt").is_file()
    assert "sample 1     Once upon a time" in story
    assert "bits per byte" in measure

def test_the_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code")


def test_the_install_cell_finds_the_repository_colab_opened_the_notebook_from():
    import ast

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    install = next(c for c in notebook.cells if "def github_repository" in c.source)
    tree = ast.parse(install.source)
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    found = {}
    exec(compile(ast.Module(body=defs, type_ignores=[]), "install", "exec"), found)
    path = ("fileId=https%3A%2F%2Fgithub.com%2Fme%2Ftiny-llm%2Fblob%2Fmain%2Fnotebooks%2F"
            "colab.ipynb")
    assert found["github_repository"](path) == "https://github.com/me/tiny-llm.git"
    assert found["github_repository"]("colab.ipynb") is None  # a copy on Drive: set REPO_URL
    assert "REPO_URL = REPO_URL or github_repository(opened_from())" in install.source
