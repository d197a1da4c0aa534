"""A small reader of the Dockerfiles in deploy/docker, for tests that check what they say.

No Docker engine exists where the tests run, so the tests read the instructions instead:
stages, ``ARG``/``ENV`` values, ``COPY`` sources and ``RUN`` commands (with BuildKit's
``--mount`` flags dropped), ``USER``, ``HEALTHCHECK`` and ``CMD`` in exec form.
Only what these Dockerfiles use is understood; anything else raises.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    args: str  # the rest of the (joined) line


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None

    @property
    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for pair in shlex.split(args):
                key, sep, value = pair.partition("=")
                if not sep:
                    raise ValueError(f"ENV in the legacy 'key value' form: {args!r}")
                values[key] = value
        return values

    def exec_form(self, keyword: str) -> list[str]:
        """The JSON array of the last CMD/ENTRYPOINT (after HEALTHCHECK's options for that)."""
        args = self.last(keyword)
        if args is None:
            raise ValueError(f"no {keyword}")
        if keyword == "HEALTHCHECK":
            _, _, args = args.partition("CMD ")  # after the options
        parsed = json.loads(args)
        if not isinstance(parsed, list):
            raise ValueError(f"{keyword} is not in exec form: {args!r}")
        return [str(a) for a in parsed]

    def copies(self) -> list[tuple[list[str], str]]:
        """``COPY`` instructions from the build context (not ``--from``): (sources, dest)."""
        out = []
        for args in self.all("COPY"):
            parts = shlex.split(args)
            if any(p.startswith("--from") for p in parts):
                continue
            if any(p.startswith("--") for p in parts):
                raise ValueError(f"COPY flag not understood: {args!r}")
            out.append((parts[:-1], parts[-1]))
        return out

    def runs(self) -> list[str]:
        """``RUN`` commands as shell text, without BuildKit's ``--mount=...`` flags."""
        return [re.sub(r"^(--mount=\S+\s+)+", "", args) for args in self.all("RUN")]


@dataclass
class Dockerfile:
    path: Path
    args: dict[str, str]  # global ARG defaults (before the first FROM)
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def expand(self, text: str) -> str:
        return re.sub(
            r"\$\{(\w+)\}|\$(\w+)",
            lambda m: self.args.get(m.group(1) or m.group(2), m.group(0)),
            text,
        )


def logical_lines(text: str) -> list[str]:
    """Lines with continuations joined; comments and blank lines dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1].rstrip() + " "
            continue
        current += stripped
        if current.strip():
            lines.append(current.strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def parse(path: Path) -> Dockerfile:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(path.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(image=parts[0], name=name))
        elif not stages:
            if keyword != "ARG":
                raise ValueError(f"{path}: {keyword} before the first FROM")
            key, _, value = rest.partition("=")
            args[key] = value
        else:
            stages[-1].instructions.append(Instruction(keyword, rest))
    return Dockerfile(path, args, stages)
