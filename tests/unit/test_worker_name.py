"""The worker name files are named by comes from pytest's config, not the inherited environment."""

from types import SimpleNamespace

from hilconform.fixtures.worker_name import worker_name


def test_an_xdist_worker_is_named_by_its_workerid(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert worker_name(SimpleNamespace(workerinput={"workerid": "gw0"})) == "gw0"


def test_a_pytest_nested_in_a_worker_is_main_whatever_it_inherited(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert worker_name(SimpleNamespace()) == "main"
