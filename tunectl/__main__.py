"""`python -m tunectl`: the command line."""
from tunectl.cli import app

app(prog_name="tunectl")
