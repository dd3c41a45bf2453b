import pytest

from tiny_llm.files import atomic_path


def test_atomic_path_renames_on_success(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    with atomic_path(target) as tmp:
        tmp.write_text("done")
        assert not target.exists()
    assert target.read_text() == "done"
    assert list(target.parent.iterdir()) == [target]


def test_atomic_path_keeps_old_file_when_interrupted(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]
