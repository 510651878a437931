"""Python's cyclic garbage collector, paused around work that allocates many containers: the one
helper for it, used by the probe (monitor/) and the job (streaming/).

The state function unpickles and rebuilds thousands of small dicts per bucket, and the driver's
exporter holds hundreds of thousands of series objects.  Every 700 new containers the collector
runs, and its older generations walk every live object: unpickling a 2 MB bucket state (6,600
entities) took 0.138 s with the collector on and 0.020 s with it off.  The probe's cycle at
100,000 partitions allocates a few hundred thousand short-lived tuples, which set off
collections that walk every long-lived object (the cluster view, the last statistics' epochs:
~7% of the probe's CPU).  What these blocks allocate is freed by reference counting (they build
no reference cycles), so pausing the collector for the block loses nothing; it resumes
afterwards and finds any cycle then.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """Cyclic GC off inside the block (reference counting still frees memory), restored after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
