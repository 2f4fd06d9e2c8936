"""``python -m opbench.cli``: the ``opbench`` command."""
import sys

from opbench.cli import main

sys.exit(main())
