"""paramiko's own log records, kept off the terminal and counted.

paramiko logs each refused port-forward channel as an ERROR ("Secsh channel 7 open FAILED: Connection refused"),
and Python prints unhandled records on stderr: a server that crashes under 512 concurrent requests made 224 such
lines. The SSH runner already handles what they report (the client sees the connection close, the crash is read
from the server's log, a dead link is reconnected), so they are counted here and the CLI says it in one line.
A program that configures logging itself still gets every record (they propagate as before)."""
from __future__ import annotations

import logging
import threading


class _Notes(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.refused, self.other, self.why, self.last = 0, 0, "", ""
        self._mu = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage().strip()
        except Exception:                    # a malformed record: counted, never raised into paramiko's thread
            msg = ""
        with self._mu:
            if "open FAILED" in msg:         # "Secsh channel N open FAILED: <reason>: <text>"
                self.refused += 1
                self.why = msg.split("open FAILED:", 1)[1].strip()
            else:
                self.other += 1
                self.last = msg.splitlines()[0] if msg else self.last

    def reset(self) -> None:
        with self._mu:
            self.refused, self.other, self.why, self.last = 0, 0, "", ""


NOTES = _Notes()


def install() -> None:
    """Route paramiko's records to NOTES (once): with a handler on the `paramiko` logger, Python's last-resort
    handler no longer prints them."""
    log = logging.getLogger("paramiko")
    if NOTES not in log.handlers:
        log.addHandler(NOTES)


def summary() -> str | None:
    """One line for the CLI about what paramiko reported since the last reset, or None."""
    parts = []
    if NOTES.refused:
        parts.append(f"{NOTES.refused} connection(s) through the SSH port forward refused by the host "
                     f"({NOTES.why or 'refused'}; the server had stopped accepting)")
    if NOTES.other:
        parts.append(f"{NOTES.other} other SSH library note(s), the last: {NOTES.last}")
    return ("ssh: " + "; ".join(parts)) if parts else None
