"""Allows `python -m sglang_tuning_exporter`."""

import sys

from .cli import main

sys.exit(main())
