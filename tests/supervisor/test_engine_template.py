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
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from poolserve.config import Config
from poolserve.engine_template import ForkRequest
from supervisor.engine_template import MAX_LOSSES, AdoptedProcess, EngineTemplate


def spawned(*argv: str) -> AdoptedProcess:
    """A child this process started without a Popen to reap it, as an adopted engine is."""
    return AdoptedProcess(os.posix_spawnp(argv[0], argv, os.environ), template_pid=0)


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


def test_an_engine_handed_to_the_supervisor_is_stopped_and_any_other_orphan_reaped_once_it_exits() -> None:
    """In a process of its own, which becomes a subreaper as the supervisor does: children fork grandchildren and
    exit, the grandchildren come to the subreaper. One runs `python -m engine_core` (as a fork the template answered
    too late would): reap_strays stops it unless the caller knows it. The other, anything else, is left to run, and
    reaped once it has exited (no zombie stays)."""
    script = textwrap.dedent(
        """
        import os, sys, time
        from setproctitle import setproctitle
        from supervisor.engine_template import become_subreaper, child_pids, reap_strays

        def orphan(title, seconds):
            r, w = os.pipe()
            middle = os.fork()
            if middle == 0:
                pid = os.fork()
                if pid == 0:
                    if title:
                        setproctitle(title)
                    time.sleep(seconds)
                    os._exit(0)
                os.write(w, str(pid).encode())
                os._exit(0)
            os.waitpid(middle, 0)
            return int(os.read(r, 32))

        def until(condition):
            deadline = time.monotonic() + 10
            while not condition() and time.monotonic() < deadline:
                time.sleep(0.01)
            return condition()

        assert become_subreaper()
        engine = orphan(f"{sys.executable} -m engine_core", 60)
        other = orphan("", 1)
        assert {engine, other} <= child_pids(), "the orphans were not handed to this process"
        assert until(lambda: open(f"/proc/{engine}/cmdline").read().startswith(sys.executable))
        assert reap_strays({engine}) == []
        time.sleep(0.2)
        assert {engine, other} <= child_pids(), "a known child, or one that is no engine, was stopped"
        reaped = []
        assert until(lambda: reaped.extend(reap_strays(set())) or {engine, other} <= set(reaped)), reaped
        assert not {engine, other} & child_pids()
        print("stopped")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr
    assert "an engine the supervisor gave up on, is stopped" in done.stderr


def test_an_engines_environment_travels_as_its_difference_from_the_templates() -> None:
    """A datagram is bounded by the socket's buffer; a pod's whole environment can come near it, the difference not."""
    base = {"PATH": "/bin", "HOME": "/root", "GONE": "x"}
    env = {"PATH": "/bin", "HOME": "/home/poolserve", "POOLSERVE_CHILD_SPEC": "{}"}
    request = ForkRequest.between(base, env)
    assert request.set == {"HOME": "/home/poolserve", "POOLSERVE_CHILD_SPEC": "{}"} and request.unset == ["GONE"]
    assert request.applied_to(base) == env


STUB_TEMPLATE = str(Path(__file__).with_name("stub_template.py"))
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stub_template(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], EngineTemplate]]:
    """An EngineTemplate on tests/supervisor/stub_template.py in one of its modes, stopped after the test."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    started: list[EngineTemplate] = []

    def start(mode: str) -> EngineTemplate:
        template = EngineTemplate(Config(), program=(sys.executable, STUB_TEMPLATE, mode))
        template.start()
        started.append(template)
        return template

    yield start
    for template in started:
        template.stop()


def is_gone(pid: int) -> bool:
    """Exited and reaped: no zombie left (a zombie still has its /proc entry)."""
    return not Path(f"/proc/{pid}").exists()


def test_a_template_that_cannot_import_is_reaped_and_engines_start_fresh(
    stub_template: Callable[[str], EngineTemplate],
) -> None:
    template = stub_template("fail")
    pid = template.pid
    assert not template.wait_ready(30)
    assert template.disabled == "stub cannot import"
    assert is_gone(pid)
    read_fd, write_fd = os.pipe()
    try:
        assert template.fork({}, write_fd) is None
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_fork_the_template_refuses_starts_that_engine_fresh_and_keeps_the_template(
    stub_template: Callable[[str], EngineTemplate],
) -> None:
    template = stub_template("refuse")
    assert template.wait_ready(30)
    read_fd, write_fd = os.pipe()
    try:
        assert template.fork(dict(os.environ), write_fd) is None
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert template.losses == 0 and not template.disabled and template.process is not None


def test_a_template_that_dies_is_replaced_until_it_has_died_three_times(
    stub_template: Callable[[str], EngineTemplate],
) -> None:
    template = stub_template("vanish")
    pids = []
    for _ in range(MAX_LOSSES):
        assert template.wait_ready(30)
        pids.append(template.pid)
        assert template.process is not None and template.process.wait(10) == 0
        template.poll()
    assert template.losses == MAX_LOSSES and template.disabled.startswith(f"lost {MAX_LOSSES} times")
    assert len(set(pids)) == MAX_LOSSES and all(map(is_gone, pids))
