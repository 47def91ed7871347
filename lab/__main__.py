"""python -m lab [COMMAND] ...: the lab's command line (lab/cli.py), one module per question."""
import sys

from lab import cli

try:
    cli.main(sys.argv[1:])
except ValueError as error:  # bad arguments: one clear line, no traceback
    sys.exit(f"python -m lab: error: {error}")
