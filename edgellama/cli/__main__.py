"""python -m edgellama.cli: the `edgellama` command."""

import sys

from edgellama.cli import main

sys.exit(main())
