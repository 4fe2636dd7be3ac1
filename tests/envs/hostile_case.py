"""What a hostile case is (tests/envs/hostile_programs.py assembles them): a Case is a program that
tries one way out of the sandbox, the verdicts it may get, text it must print (it really ran its
attack) and text it must never print. Cases are written against a Host (its listeners and
planted key), which the test file builds. Also the constants the cases and their judges share."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from envs.sandbox import SandboxLimits

CANARY = "ragen2-key-canary-51d0"
KEY_NAME = "ragen2-planted-key"
ROOMY = SandboxLimits(cpu_seconds=2, wall_seconds=15)
REPO = Path(__file__).resolve().parents[2]
X86 = os.uname().machine == "x86_64"


@dataclass
class Host:
    dir: Path
    tcp_port: int
    udp_port: int
    abstract: str
    key: int | None
    sockets: dict = field(default_factory=dict)  # name -> bound socket

    def path(self, name: str) -> str:
        return str(self.dir / f"{name}.sock")


@dataclass
class Case:
    name: str
    program: str
    verdicts: tuple[str, ...]
    required: tuple[str, ...] = ()  # the program got as far as its attack
    forbidden: tuple[str, ...] = ("ESCAPED", "ALLOWED", "CONNECTED", "SENT", "FOUND", CANARY, KEY_NAME)
    stdin: str = ""
    x86_only: bool = False
    exit_code: int | None = None  # the program's own exit status, where the verdict must be its own
    probe: str = ""  # the host-side check run while the program holds (test_sandbox_hostile.PROBES)
    marker: str = ""  # the name (comm) the program takes while it holds: how the host finds it

