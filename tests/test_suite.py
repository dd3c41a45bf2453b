"""The suite's own arrangement (tests/conftest.py): what makes it fit in its time."""

import pytest


@pytest.fixture(scope="module")
def shared():
    return object()


def test_tests_sharing_a_module_fixture_stay_on_one_worker(shared, request):
    """conftest.py marks tests that share a module-scoped fixture with an xdist group, and
    pytest-xdist (`--dist loadgroup`) adds the group to the test's id, by which it sends the
    group's tests to one worker. Where the id is not changed (pytest 9.2 keeps node ids where
    pytest-xdist 3.8 cannot write), every worker computes every module fixture again."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by a pytest-xdist worker with --dist loadgroup (README's command is)")
    assert request.node.nodeid.endswith("@tests/test_suite.py"), (
        f"the test's id is {request.node.nodeid!r}: its group was not added, so module "
        f"fixtures run on every worker (see the pytest pin in pyproject.toml)")
