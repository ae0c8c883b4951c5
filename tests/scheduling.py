"""How the suite's modules are dealt to pytest-xdist's workers (`make test`'s `--dist loadscope`): each module whole
on one worker, as loadscope does, except tests/e2e, which goes whole to one worker as one unit.

The end-to-end modules share `launch`es that start once per worker that needs them (tests/conftest.py's session
`server` and `guarded_server`, tests/e2e/conftest.py's `recycling_server`): dealt module by module they started on
both workers, one more `launch` of each on the 2 cores (~7 s each). On one worker they run one after the other, in
file order, while the other workers run the one-process tests. xdist's own grouping mark (`xdist_group`) would do
this, but with pytest 9.2 it does not take effect (pytest-dev/pytest-xdist#1386): this is the scheduler's
documented seam instead, the scope a test's node id falls in.

And the units are dealt longest first, as near as a folder tells: xdist's loadscope deals the scopes with the most
tests first, so a module of one 15-19 s test that starts a whole bench run (tests/bench) came last and one worker ran
it alone at the end (15 s of the other idle in a 4-minute suite). The folders whose tests start processes or serve
models go first (ONE_UNIT's, then FIRST's in their order), each keeping loadscope's order within it; the one-process
unit tests, many and short, fill the end.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from xdist.scheduler import LoadScopeScheduling

# Node-id prefixes whose modules are dealt as one unit.
ONE_UNIT = ("tests/e2e/",)
# Then these folders' modules, before every other: the longest tests are theirs.
FIRST = ("tests/bench/", "tests/in_process/", "tests/fidelity/", "tests/supervisor/")


def rank(scope: str) -> int:
    """Where a scope is dealt: by the first prefix of ONE_UNIT + FIRST it starts with, the rest after them."""
    prefixes = ONE_UNIT + FIRST
    return next((i for i, prefix in enumerate(prefixes) if scope.startswith(prefix)), len(prefixes))


class SharedLaunchScheduling(LoadScopeScheduling):
    """loadscope, with each prefix of ONE_UNIT one scope, and the longest dealt first."""

    _is_ordered = False

    def _assign_work_unit(self, node: Any) -> None:
        if not self._is_ordered:  # the queue is whole when the first unit is dealt
            self._is_ordered = True
            self.order_queue()
        super()._assign_work_unit(node)

    def order_queue(self) -> None:
        """The work queue by rank (a stable sort: loadscope's order within a rank)."""
        ordered = sorted(self.workqueue.items(), key=lambda item: rank(item[0]))
        self.workqueue = OrderedDict(ordered)

    def _split_scope(self, nodeid: str) -> str:
        for prefix in ONE_UNIT:
            if nodeid.startswith(prefix):
                return prefix
        return super()._split_scope(nodeid)


def make_scheduler(config: Any, log: Any) -> LoadScopeScheduling | None:
    """The scheduler for `--dist loadscope`; any other `--dist` keeps xdist's own (None)."""
    if config.getvalue("dist") != "loadscope":
        return None
    return SharedLaunchScheduling(config, log)
