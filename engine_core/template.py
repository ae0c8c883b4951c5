"""The engine template: one process that has imported torch and transformers, and forks each CPU engine from there.

An engine started as a fresh interpreter spends most of its start importing: ~4.5-6 s of CPU on a 2-core host (torch
1.5 s, transformers' modeling stack most of the rest) before it reads a byte of its model, and every restart (a crash,
a hang, a poison pill) paid it again while the model was away. The supervisor starts this process once; an engine is
then a fork of it plus the model's load. Python's multiprocessing forkserver does the same for its own children; this
one differs in whose children they are (the supervisor's, reaped and signalled as the ones it starts itself) and in
carrying the boot pipe and the environment as `python -m engine_core` gets them.

What makes the fork safe: the template imports and runs nothing else. No Python thread, no torch operation (torch's
intra-op thread pool is made by the first one, in the engine), no CUDA: it serves engines that run on the CPU only
(supervisor/engine_template.py), since whether an import touched the CUDA driver cannot be seen from here and a fork
of a process that did cannot use the GPU. The thread servers numpy's and scipy's OpenBLAS start at import stop
themselves at a fork (their pthread_atfork handlers) and start again in the engine when it first needs them.

Each engine is forked twice: the first child forks the engine and exits at once, so the kernel hands the engine to
the supervisor (a child subreaper). The reply names the engine only after that first child is reaped, by when the
engine is the supervisor's child and its exit is the supervisor's to read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
import warnings

import msgspec
from setproctitle import setproctitle, setthreadtitle

from poolserve.boot import (
    CHILD_SPEC_ENV,
    EXIT_BOOT_ERROR,
    BootReport,
    ChildSpec,
    describe_exit,
    encode_child_spec,
    exit_with_parent,
    write_boot_report,
)
from poolserve.collector import settle
from poolserve.engine_template import (
    MAX_REQUEST_BYTES,
    TEMPLATE_SPEC_ENV,
    ForkReply,
    ForkRequest,
    TemplateSpec,
    read_template_spec,
)
from poolserve.logs import configure_logging

logger = logging.getLogger("poolserve.engine")

# What an engine imports that takes long: torch, and transformers' modeling stack (PreTrainedModel's module pulls in
# torch.distributed, torch._dynamo, sympy). Nothing of poolserve's engine: its modules make Prometheus metrics, which
# must be made in the engine, after poolserve/metric_files.py has set their storage.
PRELOADED = ("torch", "transformers", "transformers.modeling_utils", "safetensors.torch", "numpy", "zmq", "PIL.Image")
# How long an engine waits for the kernel to hand it to the supervisor: its first parent exits at once.
ADOPTION_TIMEOUT_S = 5.0

_reply_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(ForkRequest)


def preload() -> None:
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)


# From Python 3.12 os.fork() warns (a DeprecationWarning, shown here since this module is __main__) whenever the
# process has more than one OS thread. The template's other threads are OpenBLAS's thread servers (numpy's, scipy's):
# their pthread_atfork handlers stop them before each fork, which is what makes forking this process safe (fork_hazard
# below checks for Python threads, which have no such handler).
warnings.filterwarnings(
    "ignore", message=r".*multi-threaded, use of fork\(\) may lead to deadlocks", category=DeprecationWarning
)


def fork_hazard() -> str:
    """Why forking this process would not be safe, or "" when it is."""
    if threading.active_count() > 1:
        return f"{threading.active_count() - 1} Python thread(s) started while importing"
    torch = sys.modules["torch"]
    if torch.cuda.is_initialized():
        return "CUDA was initialised while importing"
    return ""


def main() -> int:
    spec = read_template_spec()
    # What each engine's environment is sent as a difference from (ForkRequest): this one's at start, its spec aside.
    initial_env = {k: v for k, v in os.environ.items() if k != TEMPLATE_SPEC_ENV}
    exit_with_parent(spec.supervisor_pid)
    # As an engine does: Ctrl-C reaches the whole group, and the supervisor says when to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging("engine-template", spec.log_level, spec.log_format)
    started = time.perf_counter()
    try:
        preload()
    except Exception as exc:
        write_boot_report(spec.boot_fd, BootReport(status="failed", message=f"cannot import the engine: {exc}"))
        return EXIT_BOOT_ERROR
    hazard = fork_hazard()
    if hazard:
        write_boot_report(spec.boot_fd, BootReport(status="failed", message=f"not safe to fork: {hazard}"))
        return EXIT_BOOT_ERROR
    settle()  # what the imports left is collected and frozen once, here, rather than in every engine
    write_boot_report(
        spec.boot_fd, BootReport(status="ready", message=f"imported in {time.perf_counter() - started:.1f}s")
    )
    control = socket.socket(fileno=spec.control_fd)
    while True:
        try:
            message, fds, flags, _ = socket.recv_fds(control, MAX_REQUEST_BYTES, 1)
        except OSError:
            return 0
        if not message:  # the supervisor closed its end: it is stopping
            return 0
        if flags & socket.MSG_TRUNC or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            reply = ForkReply(error="a malformed request")
        else:
            env = _request_decoder.decode(message).applied_to(initial_env)
            reply = fork_engine(env, fds[0], spec, control)
        control.send(_reply_encoder.encode(reply))


def fork_engine(env: dict[str, str], boot_fd: int, spec: TemplateSpec, control: socket.socket) -> ForkReply:
    pid_r, pid_w = os.pipe()
    try:
        first = os.fork()
    except OSError as exc:
        for fd in (pid_r, pid_w, boot_fd):
            os.close(fd)
        return ForkReply(error=f"fork failed: {exc}")
    if first == 0:
        code = 1
        try:
            # What a fresh engine's command line is, so that `ps` and whatever finds engines by it see one kind of
            # engine; taken here, so that the engine has it from its first instant. setproctitle finds the command
            # line's memory by walking from the environment's, which is still the one this process started with.
            # SPT_NOENV: it leaves the environment's memory as it was (/proc/PID/environ reads it; the title is
            # shorter than the template's own command line, whose room it takes).
            os.environ["SPT_NOENV"] = "1"
            setproctitle(f"{sys.executable} -m engine_core")
            keep_command_name()
            engine = os.fork()
            if engine == 0:
                become_engine(env, boot_fd, spec.supervisor_pid, (control.fileno(), spec.boot_fd, pid_r, pid_w))
            os.write(pid_w, str(engine).encode())
            code = 0
        finally:
            os._exit(code)
    for fd in (pid_w, boot_fd):
        os.close(fd)
    _, status = os.waitpid(first, 0)
    written = b""
    with contextlib.suppress(OSError):
        os.set_blocking(pid_r, False)
        written = os.read(pid_r, 32)
    os.close(pid_r)
    if os.waitstatus_to_exitcode(status) != 0 or not written:
        logger.error("could not fork an engine (the first child %s)", describe_exit(os.waitstatus_to_exitcode(status)))
        return ForkReply(error="the engine could not be forked")
    return ForkReply(pid=int(written))


def keep_command_name() -> None:
    """setproctitle also renames the process's command name (`comm`, what `ps -C` and `pgrep -x` match) after the
    title's first 15 bytes; a fresh interpreter's is its executable's name."""
    setthreadtitle(os.path.basename(sys.executable))


def become_engine(env: dict[str, str], boot_fd: int, supervisor_pid: int, template_fds: tuple[int, ...]) -> None:
    """The forked engine: the template's descriptors closed, the engine's environment in place (its spec naming the
    boot pipe it was handed), handed to the supervisor, then `python -m engine_core`'s main. Never returns: it exits
    with what `python -m engine_core` would have (EXIT_BOOT_ERROR where it could not become an engine, which halts
    a start as a failed boot does; 1 for an uncaught exception; a SystemExit's code)."""
    code = EXIT_BOOT_ERROR
    try:
        for fd in template_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        spec = msgspec.json.decode(env[CHILD_SPEC_ENV], type=ChildSpec)
        os.environ[CHILD_SPEC_ENV] = encode_child_spec(msgspec.structs.replace(spec, boot_fd=boot_fd))
        first_parent = os.getppid()
        deadline = time.monotonic() + ADOPTION_TIMEOUT_S
        while (parent := os.getppid()) != supervisor_pid:
            if parent != first_parent or time.monotonic() > deadline:
                # Handed to another process than the supervisor: the supervisor is gone, and so is its engine.
                code = 1
                return
            time.sleep(0.001)
        from engine_core.__main__ import exit_now
        from engine_core.__main__ import main as engine_main

        code = 1  # from here on, what an uncaught exception in `python -m engine_core` exits with
        exit_now(engine_main())
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
