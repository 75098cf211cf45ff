"""REAL-02: NVML's health signals map onto the runtime's health states.

On a host with NVIDIA GPUs and nvidia-ml-py, NVML's view of each GPU (XID
events from the kernel log and a watch window, ECC counts, retired pages,
remapped rows; read-only) is mapped by `fixtures/nvml_health.toml` onto
HEALTHY/DEGRADED/FAULTED; the runtime's state for the same BDF must be no
better (the worse signal wins). Hosts without NVML skip with the reason.
"""

from __future__ import annotations

import json

import pytest

from hilconform.fixtures.nvml_health import health_from_nvml, runtime_not_better

pytestmark = [pytest.mark.clause("REAL-02"), pytest.mark.needs("real-host", "nvml")]


def test_runtime_health_is_never_better_than_nvml(host, request):
    nvml = host.nvml_health()
    inventory = {d["device"]: d for d in host.settled_inventory()["devices"]}
    selected = host.managed_truth()
    verdicts, wrong = [], []
    for gpu in nvml["gpus"]:
        state, reasons = health_from_nvml(gpu)
        runtime_state = inventory.get(gpu["bus_id"], {}).get("state")
        verdicts.append({"device": gpu["bus_id"], "nvml": state, "reasons": reasons,
                         "runtime": runtime_state})
        if runtime_state is None:
            if gpu["bus_id"] in selected:
                wrong.append(f"{gpu['bus_id']}: NVML lists it, the runtime does not")
        elif not runtime_not_better(runtime_state, state):
            wrong.append(f"{gpu['bus_id']}: runtime says {runtime_state}, NVML implies {state} ({reasons})")
    request.node.user_properties.append(("real02_verdicts", json.dumps(verdicts)))
    assert nvml["gpus"], "NVML lists no GPU on a host with NVIDIA devices"
    assert not wrong, "runtime health better than NVML's:\n  " + "\n  ".join(wrong)
