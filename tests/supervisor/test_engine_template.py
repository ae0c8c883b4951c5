"""The supervisor's side of the engine template (supervisor/engine_template.py) without torch: adopted engines polled
and signalled as Popen children are, and whatever is left to the supervisor by a dead process stopped.

The template itself, forking real engines at start and at each restart, and what happens when it is gone: the end-to-end
tests (tests/e2e/test_faults.py, test_an_engine_template_that_is_gone_costs_one_fresh_start)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from supervisor.engine_template import AdoptedProcess


def spawned(*argv: str) -> AdoptedProcess:
    """A child this process started without a Popen to reap it, as an adopted engine is."""
    return AdoptedProcess(os.posix_spawnp(argv[0], argv, os.environ))


def test_an_adopted_process_is_polled_waited_for_and_signalled_as_a_popen_is() -> None:
    sleeper = spawned("sleep", "30")
    try:
        assert sleeper.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            sleeper.wait(0.05)
        sleeper.send_signal(signal.SIGTERM)
        assert sleeper.wait(10) == -signal.SIGTERM
        assert sleeper.poll() == -signal.SIGTERM
        sleeper.send_signal(signal.SIGKILL)  # one that has exited is not signalled: its pid may be another's by now
    finally:
        if sleeper.returncode is None:
            os.kill(sleeper.pid, signal.SIGKILL)
            sleeper.wait(10)
    assert spawned("sh", "-c", "exit 7").wait(10) == 7


def test_what_a_dead_process_leaves_to_the_supervisor_is_stopped_and_reaped() -> None:
    """In a process of its own, which becomes a subreaper as the supervisor does: a child forks a grandchild and
    exits, the grandchild comes to the subreaper, and reap_strays stops it unless it is one the caller knows."""
    script = textwrap.dedent(
        """
        import os, time
        from supervisor.engine_template import become_subreaper, child_pids, reap_strays

        assert become_subreaper()
        r, w = os.pipe()
        middle = os.fork()
        if middle == 0:
            orphan = os.fork()
            if orphan == 0:
                time.sleep(60)
                os._exit(0)
            os.write(w, str(orphan).encode())
            os._exit(0)
        os.waitpid(middle, 0)
        orphan = int(os.read(r, 32))
        assert orphan in child_pids(), "the orphan was not handed to this process"
        reap_strays({orphan})
        time.sleep(0.2)
        assert orphan in child_pids(), "a known child was stopped"
        reap_strays(set())
        deadline = time.monotonic() + 10
        while orphan in child_pids() and time.monotonic() < deadline:
            time.sleep(0.01)
            reap_strays(set())
        assert orphan not in child_pids(), "the stray is still there"
        print("stopped")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr
    assert "left behind by a process that died, was stopped" in done.stderr
