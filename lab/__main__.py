import sys

from lab.lab import main

try:
    main()
except ValueError as error:  # bad arguments: one clear line, no traceback
    sys.exit(f"python -m lab: error: {error}")
