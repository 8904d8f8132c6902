"""``python -m kvscope``: the same as the ``kvscope`` command."""

import sys

from .cli import main

sys.exit(main())
