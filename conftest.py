"""Root conftest: load hilconform's pytest plugin (options, markers, fixtures)."""

pytest_plugins = ["hilconform.fixtures.plugin"]
