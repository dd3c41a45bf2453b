"""Shared fixtures: one prepared copy of the sample corpus for the whole test session."""

import os

import pytest


@pytest.fixture(scope="session")
def sample_data_dir(tmp_path_factory):
    """A data folder prepared from the sample corpus, exactly as a learner's offline run makes it.

    It is also exported as TINY_LLM_DATA_DIR so that commands run by the tests read it.
    """
    from tiny_llm.data import prepare_data

    data_dir = tmp_path_factory.mktemp("data")
    prepare_data("sample", data_dir=data_dir, progress=False)
    os.environ["TINY_LLM_DATA_DIR"] = str(data_dir)
    return data_dir
