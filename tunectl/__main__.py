"""`python -m tunectl`: the command line."""
from tunectl.cli import main

main()
