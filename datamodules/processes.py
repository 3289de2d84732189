"""Whether a process of this host is alive: for the temporary files and worker processes that outlive theirs."""

import os


def alive(pid: int) -> bool:
    """Whether the process `pid` exists (one of another user counts: it cannot be signalled, but exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
