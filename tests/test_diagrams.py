"""The chapters' diagrams: each is drawn by its step's code, byte for byte the same every run,
and the PNG in steps/images/ is what the code draws now."""

from pathlib import Path

import pytest

from tiny_llm.attention import draw_flow
from tiny_llm.block import draw_block
from tiny_llm.course.diagrams import PICTURES, box, canvas, matrix
from tiny_llm.embed import draw_tables
from tiny_llm.gpt import draw_model
from tiny_llm.kvcache import draw_cache
from tiny_llm.multihead import draw_heads

IMAGES = Path(__file__).resolve().parent.parent / "steps" / "images"
DIAGRAMS = {  # chapter image -> how its command draws it
    "04-embed.png": draw_tables,
    "05-qkv.png": draw_flow,
    "06-heads.png": draw_heads,
    "07-block.png": draw_block,
    "08-gpt.png": lambda path: draw_model(path, preset="cpu"),
    "12-kvcache.png": draw_cache,
    **PICTURES,  # 02, 13, 15: `uv run python -m tiny_llm.course.diagrams steps/images`
}


@pytest.mark.parametrize("name", sorted(DIAGRAMS))
def test_diagram_is_a_png_the_same_every_run_and_the_chapters_copy(name, tmp_path):
    first = DIAGRAMS[name](tmp_path / "a.png").read_bytes()
    second = DIAGRAMS[name](tmp_path / "b.png").read_bytes()
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    assert first == second
    assert first == (IMAGES / name).read_bytes(), (
        f"steps/images/{name} is not what the code draws now: re-run the command the chapter "
        "names under the picture")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png"]  # no temp files


def test_canvas_units_are_inches_and_boxes_are_centred():
    fig, ax = canvas(4, 2)
    assert tuple(fig.get_size_inches()) == (4, 2) and ax.get_xlim() == (0, 4)
    assert box(ax, 1, 1, "LayerNorm", w=1.6, h=0.5) == pytest.approx((0.2, 0.75, 1.6, 0.5))


def test_matrix_draws_one_cell_per_entry_and_hatches_nan():
    import numpy as np

    fig, ax = canvas(2, 2)
    values = np.array([[1.0, np.nan], [0.5, 0.25]])
    assert matrix(ax, 0, 2, values, cell=0.5) == (1.0, 1.0)
    assert [bool(p.get_hatch()) for p in ax.patches] == [False, True, False, False]
