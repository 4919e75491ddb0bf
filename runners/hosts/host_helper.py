# Runs ON THE HOST as `python3 -c <this file's text> <command> <json>` (stdlib only, Linux /proc).
# procs {run_id, pgid}: live processes in the group or carrying TUNECTL_RUN_ID=run_id in their environ.
# signal {run_id, pgid, sig}: signal the group and those stragglers (never by name).
# ours {}: every live process carrying any TUNECTL_RUN_ID (leftovers of earlier runs).
# port {port}: who listens on a TCP port. Prints one JSON value.
import json
import os
import signal
import sys


def stat(pid):
    with open("/proc/%s/stat" % pid) as f:
        data = f.read()
    fields = data[data.rindex(")") + 2:].split()
    return int(fields[2]), fields[19], fields[0]   # pgid, start time (field 22), state


def cmdline(pid):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def run_id_of(pid):
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"TUNECTL_RUN_ID="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return None


def scan():
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            pgid, start, state = stat(name)
        except (OSError, ValueError, IndexError):
            continue
        if state == "Z":
            continue
        yield int(name), pgid, start


def procs(arg):
    out = []
    for pid, pgid, start in scan():
        if (arg.get("pgid") and pgid == arg["pgid"]) or run_id_of(pid) == arg["run_id"]:
            out.append({"pid": pid, "pgid": pgid, "cmdline": cmdline(pid), "start_time": start})
    return out


def send(arg):
    sig, sent = int(arg["sig"]), []
    if arg.get("pgid") and int(arg["pgid"]) > 1:
        try:
            os.killpg(int(arg["pgid"]), sig)
            sent.append(-int(arg["pgid"]))
        except ProcessLookupError:
            pass
    for p in procs({"run_id": arg["run_id"]}):
        if p["pgid"] != arg.get("pgid"):
            try:
                os.kill(p["pid"], sig)
                sent.append(p["pid"])
            except ProcessLookupError:
                pass
    return sent


def ours(_arg):
    out = []
    for pid, pgid, start in scan():
        rid = run_id_of(pid)
        if rid:
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                cwd = ""
            out.append({"pid": pid, "pgid": pgid, "run_id": rid, "cmdline": cmdline(pid), "start_time": start,
                        "cwd": cwd})
    return out


def listen_inodes(port):
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def port(arg):
    inodes = listen_inodes(int(arg["port"]))
    if not inodes:
        return None
    for pid, pgid, start in scan():
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return {"pid": pid, "pgid": pgid, "cmdline": cmdline(pid), "start_time": start}
    return True


def main():
    arg = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    fn = {"procs": procs, "signal": send, "ours": ours, "port": port}[sys.argv[1]]
    print(json.dumps(fn(arg)))


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
