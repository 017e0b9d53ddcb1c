"""Free ports for the tests' servers and rendezvous, drawn below the kernel's ephemeral ports.

``bind(("127.0.0.1", 0))`` hands out a port of the ephemeral range, which the test then closes and gives to a server
or a torchrun agent to bind. Until that bind, the kernel may give the same port to any outgoing connection's local
end (the suite opens thousands: gloo, stores, S3), and the server fails to start, or a rendezvous agent that finds
its port taken waits 60 s as the client of a store that is not there. Below the ephemeral range only an explicit
bind can take a port: one drawn at random, from system entropy (every xdist worker draws its own, whatever a test
seeded ``random`` with), and free when drawn.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_ENTROPY = random.SystemRandom()
LOW = 10000  # above the ports services commonly listen on
_HIGH = 28000  # below torchrun's 29500, the product's default rendezvous ports (29500 + job id % 1000) and 29400


def quiet_range() -> tuple[int, int]:
    """The ports a test may draw from: ``[LOW, high]``, below this host's ephemeral range and the defaults."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    first_ephemeral = int(ranges.read_text().split()[0]) if ranges.exists() else 32768
    return LOW, max(LOW + 1000, min(_HIGH, first_ephemeral - 1001))


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports from :func:`quiet_range` that nothing holds now."""
    low, high = quiet_range()
    found: list[int] = []
    while len(found) < n:
        port = _ENTROPY.randint(low, high)
        if port not in found and _bindable(port):
            found.append(port)
    return found


def free_port() -> int:
    """One port from :func:`quiet_range` that nothing holds now."""
    return free_ports(1)[0]
