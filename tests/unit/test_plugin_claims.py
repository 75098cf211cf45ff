"""What a device plugin claims is declared, read strictly, and decides which clauses are judged
(issue 33: DP-07 was judged for a plugin with no orderly-removal procedure)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hilconform.fixtures.plugin_claims import ClaimError, claim, parse_claims, skip_reason


def test_the_claims_file_is_read_strictly():
    with pytest.raises(ClaimError, match="unknown key 'clauses'"):
        parse_claims({"x": {"clauses": "DP-07", "meaning": "m", "reference": False}}, "t.toml")
    with pytest.raises(ClaimError, match="lacks 'reference'"):
        parse_claims({"x": {"clause": "DP-07", "meaning": "m"}}, "t.toml")
    with pytest.raises(ClaimError, match="reference must be a bool"):
        parse_claims({"x": {"clause": "DP-07", "meaning": "m", "reference": "yes"}}, "t.toml")
    with pytest.raises(ClaimError, match="unknown device-plugin claim 'orderly'"):
        claim("orderly")


def test_the_skip_reason_names_the_clause_the_claim_and_how_to_declare_it():
    reason = skip_reason("orderly-removal", "the device plugin ./p")
    assert "DP-07" in reason and "--device-plugin-claim orderly-removal" in reason


def _pytest(tmp_path, *args):
    test = tmp_path / "test_claimed.py"
    test.write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.plugin_claim("orderly-removal")
        def test_claimed(device_plugin):
            pass
    """))
    plugin = tmp_path / "plugin.sh"
    plugin.write_text("#!/bin/sh\n")
    plugin.chmod(0o755)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-p",
                           "hilconform.fixtures.plugin", "-rs",
                           str(test), *[a.replace("PLUGIN", str(plugin)) for a in args]],
                          capture_output=True, text=True, cwd=tmp_path)


def test_a_test_of_a_claim_is_skipped_saying_why_for_a_plugin_that_does_not_make_it(tmp_path):
    done = _pytest(tmp_path, "--device-plugin", "PLUGIN", "--device-plugin-resource", "e.com/gpu=10de:20b0")
    assert "1 skipped" in done.stdout and "DP-07 is judged only for a plugin that claims" in done.stdout
    done = _pytest(tmp_path, "--device-plugin", "PLUGIN", "--device-plugin-resource", "e.com/gpu=10de:20b0",
                   "--device-plugin-claim", "orderly-removal")
    assert "1 passed" in done.stdout, done.stdout
    assert "1 passed" in _pytest(tmp_path).stdout  # the reference front end claims it


def test_an_unknown_claim_or_one_without_a_plugin_is_a_usage_error(tmp_path):
    done = _pytest(tmp_path, "--device-plugin", "PLUGIN", "--device-plugin-resource", "e.com/gpu=10de:20b0",
                   "--device-plugin-claim", "orderly")
    assert done.returncode == 4 and "invalid choice: 'orderly'" in done.stderr
    done = _pytest(tmp_path, "--device-plugin-claim", "orderly-removal")
    assert done.returncode == 4 and "--device-plugin-claim needs --device-plugin" in done.stderr
