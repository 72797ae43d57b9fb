"""Apply mode's executor: runs the MPS control lines of a preview, nothing else.

MIG lines are never executed here (re-partitioning tears down every process on the GPU and
needs an operator), and the per-intent environment belongs to the workload processes. The
``<server-pid>`` placeholder is resolved from the ``get_server_list`` answer just before it;
with no MPS server running, the new defaults simply apply to the next server.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from services.common.errors import FailedPrecondition
from services.gpulane.previews import CommandSpec
from services.gpulane.runner import CommandOutcome, CommandRunner

log = logging.getLogger(__name__)

SERVER_PID = "<server-pid from get_server_list>"


def _outcome_json(o: CommandOutcome) -> dict[str, Any]:
    return {
        "argv": list(o.argv),
        "stdin": o.stdin,
        "returncode": o.returncode,
        "stderr": o.stderr.strip()[:500],
    }


def _server_pids(stdout: str) -> list[str]:
    return [tok for tok in stdout.split() if tok.isdigit()]


def execute_mps(commands: Iterable[CommandSpec], runner: CommandRunner) -> list[dict[str, Any]]:
    done: list[dict[str, Any]] = []
    servers: list[str] = []
    for c in commands:
        if c.kind != "mps":
            continue
        if SERVER_PID in c.stdin:
            for pid in servers:
                _run(runner, c.argv, c.stdin.replace(SERVER_PID, pid), c.env, done)
            continue
        if not c.resolved:
            continue
        is_daemon_start = "-d" in c.argv
        outcome = runner.run(c.argv, c.stdin, c.env)
        done.append(_outcome_json(outcome))
        if c.stdin.strip() == "get_server_list" and outcome.returncode == 0:
            servers = _server_pids(outcome.stdout)
        elif outcome.returncode != 0 and not is_daemon_start:
            _fail(c.argv, c.stdin, outcome, done)
        elif outcome.returncode != 0:
            # An already running daemon answers -d with an error; the lines that follow tell.
            log.info("mps daemon start returned non-zero", extra={"stderr": outcome.stderr.strip()})
    return done


def _run(
    runner: CommandRunner,
    argv: tuple[str, ...],
    stdin: str,
    env: Any,
    done: list[dict[str, Any]],
) -> None:
    outcome = runner.run(argv, stdin, env)
    done.append(_outcome_json(outcome))
    if outcome.returncode != 0:
        _fail(argv, stdin, outcome, done)


def _fail(
    argv: tuple[str, ...], stdin: str, outcome: CommandOutcome, done: list[dict[str, Any]]
) -> None:
    line = stdin.strip() or " ".join(argv)
    raise FailedPrecondition(
        f"MPS command {line!r} failed (rc {outcome.returncode}): {outcome.stderr.strip()[:200]}; "
        f"{len(done) - 1} earlier MPS line(s) had already run"
    )
