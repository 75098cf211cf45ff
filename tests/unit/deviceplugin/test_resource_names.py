"""Register accepts exactly the extended resource names Kubernetes accepts (IsExtendedResourceName)."""

from __future__ import annotations

import pytest

from hilconform.emulators.kubelet_stand_in.resource_names import extended_resource_name_problem

VALID = [
    "nvidia.com/gpu",
    "example.com/a100",
    "xilinx.com/fpga-xilinx_u250.2",
    "a.b-c.d/X",
    "example.com/" + "n" * 63,
    "d" * 244 + "/gpu",  # requests. + domain is at most 253 characters
]
INVALID = [
    ("gpu", "has no domain"),
    ("kubernetes.io/gpu", "kubernetes.io"),
    ("foo.kubernetes.io/gpu", "kubernetes.io"),
    ("requests.example.com/gpu", "requests."),
    ("example.com/gpu/0", "more than one '/'"),
    ("Example.com/gpu", "not a DNS-1123 subdomain"),
    ("example_com/gpu", "not a DNS-1123 subdomain"),
    ("/gpu", "not a DNS-1123 subdomain"),
    ("example.com/", "empty name"),
    ("example.com/-gpu", "name part must consist"),
    ("example.com/gpu.", "name part must consist"),
    ("example.com/g pu", "name part must consist"),
    ("example.com/" + "n" * 64, "longer than 63"),
    ("d" * 245 + "/gpu", "at most 244 characters"),
]


@pytest.mark.parametrize("name", VALID)
def test_extended_resource_names_are_accepted(name):
    assert extended_resource_name_problem(name) is None


@pytest.mark.parametrize(("name", "why"), INVALID)
def test_other_names_are_refused_with_the_reason(name, why):
    problem = extended_resource_name_problem(name)
    assert problem is not None and why in problem
