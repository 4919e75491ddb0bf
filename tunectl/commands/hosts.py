"""`tunectl hosts trust HOST`: accept an SSH host key deliberately (the fingerprint is shown, you confirm).

tunectl never adds host keys on its own (no AutoAddPolicy); this is the one, explicit way in.
"""
from __future__ import annotations

import os
from pathlib import Path

import paramiko
import typer

from tunectl.cli import app
from tunectl.commands._common import console, get_profile, one_line_errors
from tunectl.errors import HostKeyError, InfraError, UsageError
from tunectl.profile import HostSpec
from tunectl.runners.hosts.ssh_conn import connect_chain, fetch_host_key, fingerprint, resolve

hosts = typer.Typer(help="SSH hosts: trust a host key deliberately.", no_args_is_help=True)
app.add_typer(hosts, name="hosts")


def _spec(host: str | None, profile: Path | None) -> HostSpec:
    if host:
        return HostSpec(kind="ssh", address=host)
    spec = get_profile(profile).host
    if spec.kind != "ssh":
        raise UsageError("the profile's host is local: nothing to trust (give HOST or an ssh profile)")
    return spec


def _offered_key(spec: HostSpec) -> tuple[str, paramiko.PKey]:
    hops = resolve(spec)
    target = hops[-1]
    clients = connect_chain(hops[:-1], hops[-2].alias) if len(hops) > 1 else []
    try:
        sock = None
        if clients:
            transport = clients[-1].get_transport()
            assert transport is not None
            sock = transport.open_channel("direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0),
                                          timeout=target.timeout)
        return target.display, fetch_host_key(target, sock)
    finally:
        for c in reversed(clients):
            c.close()


@hosts.command("trust")
@one_line_errors
def trust(host: str | None = typer.Argument(None, help="host name or ~/.ssh/config alias"),
          profile: Path | None = typer.Option(None, "--profile", "-p"),
          yes: bool = typer.Option(False, "--yes", help="accept without asking (only after checking the "
                                                          "fingerprint out of band)")) -> None:
    """Show HOST's key fingerprint and, once confirmed, add it to known_hosts."""
    spec = _spec(host, profile)
    try:
        name, key = _offered_key(spec)
    except (OSError, EOFError, paramiko.SSHException) as e:
        raise InfraError(f"cannot reach {spec.address!r} to read its host key: {type(e).__name__}: {e}") from None
    known = Path(os.path.expanduser(spec.known_hosts or "~/.ssh/known_hosts"))
    keys = paramiko.HostKeys(str(known)) if known.is_file() else paramiko.HostKeys()
    have = (keys.lookup(name) or {}).get(key.get_name())
    if have is not None and have == key:
        console.print(f"{name} is already trusted ({key.get_name()} {fingerprint(key)})")
        return
    if have is not None:
        raise HostKeyError(f"{name} offers {fingerprint(key)} but {known} pins {fingerprint(have)}; if the host "
                           f"was reinstalled, run `ssh-keygen -R '{name}' -f {known}` first")
    console.print(f"{name} offers {key.get_name()} key {fingerprint(key)}")
    if not yes and not typer.confirm("Compare it with the host's own (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub)."
                                     " Trust it?", default=False):
        raise typer.Exit(1)
    known.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(known, "a") as f:
        f.write(f"{name} {key.get_name()} {key.get_base64()}\n")
    console.print(f"added to {known}")
