"""What the supervisor and the engine template (engine_core/template.py) say to each other.

The template is started with a TemplateSpec in its environment. Over a SOCK_SEQPACKET socket pair the supervisor then
sends one ForkRequest per engine, with the write end of the engine's boot pipe beside it (SCM_RIGHTS), and reads one
ForkReply: the engine's pid once the engine is the supervisor's own child, or why there is none.
"""

from __future__ import annotations

import os

import msgspec

TEMPLATE_SPEC_ENV = "POOLSERVE_TEMPLATE_SPEC"
# The largest request: an engine's whole environment, its ChildSpec (every model's Config) included.
MAX_REQUEST_BYTES = 4 << 20


class TemplateSpec(msgspec.Struct, kw_only=True, frozen=True):
    boot_fd: int
    control_fd: int
    supervisor_pid: int
    log_level: str = "info"
    log_format: str = "text"


class ForkRequest(msgspec.Struct, frozen=True):
    # The engine's environment, whole: what `python -m engine_core` would have been started with.
    env: dict[str, str]


class ForkReply(msgspec.Struct, frozen=True):
    pid: int = 0
    error: str = ""


def read_template_spec() -> TemplateSpec:
    raw = os.environ.get(TEMPLATE_SPEC_ENV)
    if raw is None:
        raise RuntimeError(f"{TEMPLATE_SPEC_ENV} is not set: this module is started by `launch`, not by hand.")
    return msgspec.json.decode(raw, type=TemplateSpec)
