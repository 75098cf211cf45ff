"""A deliberately broken device runtime for tests/integration/test_certify.py: every vendor ID it reports
is wrong (0xdead), so DISC-01 (boot inventory matches the ground truth) must fail.

The guest runs it as `python3 -m hilconform.tests.integration.wrong_vendor_runtime --config ...`
(see vm-images/guest-init.sh); everything else is the reference runtime.
"""

import sys

from hilconform.runtime import inventory
from hilconform.runtime.__main__ import main

_describe = inventory.DeviceInfo.to_dict


def _wrong_vendor(self) -> dict:
    record = _describe(self)
    record["vendor_id"] = "dead"
    return record


inventory.DeviceInfo.to_dict = _wrong_vendor

if __name__ == "__main__":
    sys.exit(main())
