"""`python -m changelake`: the command line, for processes started from Python (the demo's
capture) where the console script may not be on the PATH."""

from changelake.cli import main

main()
