"""python -m lab [COMMAND] ...: sections 0-4 are lab/lab.py's (its main), section 5 lab/cscr.py's."""
import sys

from lab import cscr, lab

CSCR_COMMANDS = {"sweep": cscr.sweep, "cscr-diagnose": cscr.diagnose_trained}
argv = sys.argv[1:]
try:
    if argv[:1] and argv[0] in CSCR_COMMANDS:
        CSCR_COMMANDS[argv[0]](argv[1:])
    else:
        lab.main(argv)
except ValueError as error:  # bad arguments: one clear line, no traceback
    sys.exit(f"python -m lab: error: {error}")
