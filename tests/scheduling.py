"""How the suite's modules are dealt to pytest-xdist's workers (`make test`'s `--dist loadscope`): each module whole
on one worker, as loadscope does, except tests/e2e, which goes whole to one worker as one unit.

The end-to-end modules share `launch`es that start once per worker that needs them (tests/conftest.py's session
`server` and `guarded_server`, tests/e2e/conftest.py's `recycling_server`): dealt module by module they started on
both workers, one more `launch` of each on the 2 cores (~7 s each). On one worker they run one after the other, in
file order, while the other worker runs the one-process tests. xdist's own grouping mark (`xdist_group`) would do
this, but with pytest 9.2 it does not take effect (pytest-dev/pytest-xdist#1386): this is the scheduler's
documented seam instead, the scope a test's node id falls in.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

# Node-id prefixes whose modules are dealt as one unit.
ONE_UNIT = ("tests/e2e/",)


class SharedLaunchScheduling(LoadScopeScheduling):
    """loadscope, with each prefix of ONE_UNIT one scope."""

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
