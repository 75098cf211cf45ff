"""`python -m hilconform.reports ...` is the `hilconform` command."""

import sys

from .cli import main

sys.exit(main())
