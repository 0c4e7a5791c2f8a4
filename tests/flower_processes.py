"""The Flower processes a test started: every live descendant of the test process whose
command line names Flower (the tests of engine="flower" check that none is left)."""

import os


def _children(root: int):
    """(pid, command line) of every live descendant of process ``root`` (from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    stat = handle.read()
                state, ppid = stat.rsplit(")", 1)[1].split()[:2]
                if state != "Z":
                    parents[int(entry)] = int(ppid)
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid:
                frontier.append(child)
                try:
                    with open(f"/proc/{child}/cmdline", "rb") as handle:
                        found.append((child, handle.read().replace(b"\0", b" ").decode()))
                except OSError:
                    pass
    return found


def flower_processes():
    """(pid, command line) of this process's live Flower descendants."""
    return [(pid, cmd) for pid, cmd in _children(os.getpid())
            if "flower" in cmd or "flwr" in cmd]
