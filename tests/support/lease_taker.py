"""A lease taker in its own process, for the lease tests of every tier."""

from __future__ import annotations

import textwrap

# A process that says "ready" once imported, takes the lease on argv[1] when the file argv[2] appears, prints
# won/taken, then holds it for argv[3] seconds.
TAKER = textwrap.dedent("""
    import os, sys, time
    import fsspec
    from ddp_runner.rundir import lease
    url, go = sys.argv[1], sys.argv[2]
    fs, path = fsspec.core.url_to_fs(url)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    try:
        held = lease.take(fs, path)
        print("won", flush=True)
    except lease.Taken as t:
        print("taken", t.holder.get("pid") if t.holder else None, flush=True)
    time.sleep(float(sys.argv[3]))
""")
