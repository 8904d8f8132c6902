"""``python -m kvscope``: the same as the ``kvscope`` command."""

import sys

from kvscope.cli.main import main

sys.exit(main())
