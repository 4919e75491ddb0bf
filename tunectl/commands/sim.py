"""`tunectl sim serve <SGLang 0.5.9 flags>`: run the SGLang stand-in in the foreground (argv passed through)."""
from __future__ import annotations

import typer

from tunectl.cli import app

sim_app = typer.Typer(help="The SGLang stand-in (no GPU needed).", no_args_is_help=True)
app.add_typer(sim_app, name="sim")


@sim_app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                   "help_option_names": []})
def serve(ctx: typer.Context) -> None:
    """Start the stand-in like `python -m sglang.launch_server`: same flags, plus --sim-card,
    --sim-time-scale and --sim-seed; patches in effect via env TUNECTL_SIM_PATCHES."""
    from tunectl.sim.launch_server import main

    main(list(ctx.args))
