"""python -m edgellama: the `edgellama` command."""

import sys

from edgellama.cli import main

sys.exit(main())
