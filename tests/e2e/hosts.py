"""Hosts in network namespaces: a balancer's namespace joined to each host's by a veth pair on a /24 of its
own, and `launch` run inside a host's; created and removed by the test that uses them (root and `ip` needed).

Every address lives inside the namespaces, so nothing is added to the machine's own network and two runs at
once do not meet: each run's namespaces are named for its process."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from bench.harness.server_process import POOLSERVE_READY, ServerProcess

HOST_PORT = 8000


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Network:
    balancer: str
    hosts: list[str]

    @staticmethod
    def address(index: int) -> str:
        """Host `index`'s address, on its own link to the balancer (which is .1 there)."""
        return f"10.77.{index + 1}.2"


@contextlib.contextmanager
def host_network(count: int) -> Iterator[Network]:
    """A balancer namespace and `count` host namespaces, each host reachable from the balancer at
    `Network.address(index)`; all removed on the way out, whatever happened."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("network namespaces need iproute2's `ip` and root")
    tag = f"ps{os.getpid()}"
    network = Network(balancer=f"{tag}-lb", hosts=[f"{tag}-h{index}" for index in range(count)])
    created: list[str] = []
    try:
        for name in [network.balancer, *network.hosts]:
            try:
                ip("netns", "add", name)
            except RuntimeError as exc:
                pytest.skip(f"cannot create a network namespace here: {exc}")
            created.append(name)
            ip("-n", name, "link", "set", "lo", "up")
        for index, host in enumerate(network.hosts):
            # Both ends are created inside their namespaces: no name is taken in the machine's own.
            outer = f"to-h{index}"
            ip("link", "add", "name", outer, "netns", network.balancer, "type", "veth", "peer", "name", "to-lb",
               "netns", host)  # fmt: skip
            ip("-n", network.balancer, "addr", "add", f"10.77.{index + 1}.1/24", "dev", outer)
            ip("-n", host, "addr", "add", f"{network.address(index)}/24", "dev", "to-lb")
            ip("-n", network.balancer, "link", "set", outer, "up")
            ip("-n", host, "link", "set", "to-lb", "up")
        yield network
    finally:
        # A namespace's veth ends go with it.
        for name in reversed(created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30, check=False)


class HostServer(ServerProcess):
    """`launch ARGS` inside network namespace `netns`, listening on `address`:8000, offline, its own session
    (so its supervisor's process group is every process of the host)."""

    def __init__(self, netns: str, address: str, args: Sequence[str]):
        # `ip netns exec` enters the namespace and execs: the pid is the supervisor's.
        argv = ["ip", "netns", "exec", netns, sys.executable, "-m", "supervisor", "--host", address,
                "--port", str(HOST_PORT), *args]  # fmt: skip
        super().__init__("poolserve", argv, env={"HF_HUB_OFFLINE": "1"})
        self.address = f"{address}:{HOST_PORT}"

    def wait_ready(self, timeout: float) -> HostServer:
        self.wait_for_line(POOLSERVE_READY, timeout)
        return self
