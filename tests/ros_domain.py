"""One ROS 2 domain per test run, on loopback only, so parallel runs on one machine never meet.

Every bridge a test starts (in process or through ``parfusion up``) and every test-side node
joins the domain claimed here. A domain is claimed by holding an exclusive lock on a file shared
by all runs on the machine; the search starts at an offset drawn from the pid. Domains 1..101
keep Fast DDS's ports (7400 + 250 x domain + ...) below the kernel's ephemeral range.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import IO

DOMAINS = range(1, 102)
LOCK_DIR = Path(tempfile.gettempdir()) / "parfusion-ros-domains"


def claim_domain() -> tuple[int, IO[bytes]]:
    """A domain id no other test run on this machine holds, and the open lock that keeps it."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    start = os.getpid() % len(DOMAINS)
    for offset in range(len(DOMAINS)):
        domain = DOMAINS[(start + offset) % len(DOMAINS)]
        handle = open(LOCK_DIR / f"{domain}.lock", "wb")  # noqa: SIM115 (held for the session)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return domain, handle
    raise RuntimeError(f"all ROS 2 domains {DOMAINS.start}..{DOMAINS.stop - 1} are held")
