"""What the supervisor and the engine template (engine_core/template.py) say to each other.

The template is started with a TemplateSpec in its environment. Over a SOCK_SEQPACKET socket pair the supervisor then
sends one ForkRequest per engine, with the write end of the engine's boot pipe beside it (SCM_RIGHTS), and reads one
ForkReply: the engine's pid once the engine is the supervisor's own child, or why there is none.

A request carries the engine's environment as its difference from the template's own at start (its spec, its
CUDA_VISIBLE_DEVICES): a datagram is bounded by the socket's buffer (~208 KiB on Linux by default), and a whole
environment (a Kubernetes pod's service variables) can come near that.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

TEMPLATE_SPEC_ENV = "POOLSERVE_TEMPLATE_SPEC"
# The largest request read: an engine's spec (every model's Config) and what else differs from the template's start.
MAX_REQUEST_BYTES = 1 << 20


class TemplateSpec(msgspec.Struct, kw_only=True, frozen=True):
    boot_fd: int
    control_fd: int
    supervisor_pid: int
    log_level: str = "info"
    log_format: str = "text"


class ForkRequest(msgspec.Struct, frozen=True):
    """The engine's environment (what `python -m engine_core` would have been started with), as its difference from
    the environment the template started with: what to set, and what to remove."""

    set: dict[str, str]
    unset: list[str]

    @classmethod
    def between(cls, base: Mapping[str, str], env: Mapping[str, str]) -> ForkRequest:
        return cls({k: v for k, v in env.items() if base.get(k) != v}, [k for k in base if k not in env])

    def applied_to(self, base: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if k not in self.unset}
        env.update(self.set)
        return env


class ForkReply(msgspec.Struct, frozen=True):
    pid: int = 0
    error: str = ""


def read_template_spec() -> TemplateSpec:
    raw = os.environ.get(TEMPLATE_SPEC_ENV)
    if raw is None:
        raise RuntimeError(f"{TEMPLATE_SPEC_ENV} is not set: this module is started by `launch`, not by hand.")
    return msgspec.json.decode(raw, type=TemplateSpec)
