"""A deliberately broken device runtime for tests/integration/test_model_twins.py: it reports every
link at the card's capability (Link Capabilities) instead of what it negotiated (Link Status), so
REAL-01's emulated twin must fail once a model's link is degraded.

The guest runs it as `python3 -m hilconform.tests.integration.misreported_link_runtime --config ...`
(see vm-images/guest-init.sh); everything else is the reference runtime.
"""

import sys

from hilconform.runtime import inventory
from hilconform.runtime.__main__ import main

_link = inventory._link


def _link_at_capability(cfg) -> dict:
    link = _link(cfg)
    if link.get("cap_speed_gts") is not None:
        link["speed_gts"], link["width"] = link["cap_speed_gts"], link["cap_width"]
    return link


inventory._link = _link_at_capability

if __name__ == "__main__":
    sys.exit(main())
