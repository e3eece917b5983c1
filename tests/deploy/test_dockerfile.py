"""The production image, checked on paper: no container runtime is needed (`make image`
builds it where a Docker engine answers).

The Dockerfile is parsed here, as Docker reads it: comments dropped, continuation lines
joined, global ARGs substituted into FROM, one stage per FROM. The checks are what an image
run in production must have: a pinned base, a non-root user, a HEALTHCHECK, and no build
tools in the final stage.
"""

import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field

import pytest

from tests.support.server import REPO

DOCKERFILE = os.path.join(REPO, "Dockerfile")
# What compiles or resolves packages, and has no business in the image that runs.
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|cc|clang|make|build-essential|[\w.+-]+-dev|"
    r"pip-compile|pip-tools|poetry|setuptools-rust|rustc|cargo)\b"
)
INSTALLS = re.compile(r"\b(apt-get|apt|apk|yum|dnf)\b[^;&|]*\b(install|add)\b([^;&|]*)")


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(text: str) -> tuple[dict, list[Stage]]:
    """(global ARG defaults, stages) of a Dockerfile."""
    instructions: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # comments vanish, even inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued instruction"

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.args.split()
            base = re.sub(
                r"\$\{?(\w+)\}?",
                lambda m: global_args.get(m.group(1), m.group(0)),
                next(w for w in words if not w.startswith("--")),
            )
            name = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages:
            assert ins.keyword == "ARG", f"line {ins.line}: {ins.keyword} before any FROM"
            arg, _, default = ins.args.partition("=")
            global_args[arg.strip()] = default.strip().strip('"')
        else:
            stages[-1].instructions.append(ins)
    assert stages, "no FROM in the Dockerfile"
    return global_args, stages


# -- the rules: each returns what it finds wrong, so that a test can also show it firing --


def unpinned_bases(stages: list[Stage]) -> list[str]:
    names = {s.name for s in stages if s.name}
    problems = []
    for stage in stages:
        if stage.base in names:
            continue  # a stage of this file
        image, _, digest = stage.base.partition("@")
        tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
        # A digest, or a tag naming an exact release (3.11.14-slim-bookworm), never a moving
        # one (3.11-slim, slim, latest): the same Dockerfile must build the same image.
        if not (digest.startswith("sha256:") or re.match(r"\d+\.\d+\.\d+(-|$)", tag)):
            problems.append(f"FROM {stage.base}: pin an exact version tag or a digest")
    # The final stage runs the virtualenv made in the build stage: the same Python.
    bases = {s.base for s in stages if s.base not in names}
    if len(bases) > 1:
        problems.append(f"stages start from different images: {sorted(bases)}")
    return problems


def root_user(stages: list[Stage]) -> list[str]:
    users = stages[-1].all("USER")
    if not users:
        return ["the final stage has no USER: the server would run as root"]
    user = users[-1].args.split(":")[0]
    if user in ("root", "0"):
        return [f"USER {users[-1].args}: root"]
    if not user.isdigit() and not any(
        re.search(rf"\b(useradd|adduser)\b.*\b{re.escape(user)}\b", r.args)
        for r in stages[-1].all("RUN")
    ):
        return [f"USER {user}: never made in the image (useradd)"]
    return []


def missing_healthcheck(stages: list[Stage]) -> list[str]:
    checks = stages[-1].all("HEALTHCHECK")
    if not checks or checks[-1].args.split()[0] == "NONE" or "CMD" not in checks[-1].args:
        return ["the final stage has no HEALTHCHECK"]
    env = " ".join(e.args for e in stages[-1].all("ENV"))
    if "/health" not in checks[-1].args + env:  # the endpoint load balancers use too
        return ["the HEALTHCHECK does not call /health"]
    return []


def build_tools_in_final_stage(stages: list[Stage]) -> list[str]:
    final = stages[-1]
    problems = []
    if final.base in {s.name for s in stages if s.name}:
        problems.append(f"the final stage starts from stage {final.base}, tools and all")
    for run in final.all("RUN"):
        if re.search(r"\bpip3?\b[^;&|]*\binstall\b", run.args):
            problems.append(f"line {run.line}: pip install belongs in the build stage")
        for match in INSTALLS.finditer(run.args):
            if tools := BUILD_TOOLS.findall(match.group(3)):
                problems.append(f"line {run.line}: installs {tools} in the final stage")
    for copy in final.all("COPY"):
        # Only the finished virtualenv comes over from the build stage.
        if "--from=" in copy.args:
            sources = [w for w in shlex.split(copy.args) if not w.startswith("--")][:-1]
            if sources != ["/venv"]:
                problems.append(f"line {copy.line}: COPY {copy.args} from another stage")
    return problems


def stop_signal_not_draining(stages: list[Stage]) -> list[str]:
    """Weir drains on SIGTERM (homeserver/processes/lifecycle.py); another stop signal
    would skip the drain, and a balancer in front would see resets."""
    signals = stages[-1].all("STOPSIGNAL")
    if signals and signals[-1].args.strip() not in ("SIGTERM", "15"):
        return [f"STOPSIGNAL {signals[-1].args}: Weir drains on SIGTERM only"]
    return []


RULES = [
    unpinned_bases,
    root_user,
    missing_healthcheck,
    build_tools_in_final_stage,
    stop_signal_not_draining,
]


@pytest.fixture(scope="module")
def stages():
    with open(DOCKERFILE) as f:
        return parse(f.read())[1]


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.__name__)
def test_the_dockerfile_keeps_the_rule(stages, rule):
    assert rule(stages) == []


def test_each_rule_fires_on_a_dockerfile_that_breaks_it():
    bad = (
        "FROM python:3.11-slim AS build\n"
        "RUN pip install -r requirements.txt\n"
        "FROM build\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends gcc libpq-dev \\\n"
        "    && pip install psycopg\n"
        "USER root\n"
        "STOPSIGNAL SIGKILL\n"
    )
    found = {rule.__name__: rule(parse(bad)[1]) for rule in RULES}
    assert all(found.values()), found
    assert "['gcc', 'libpq-dev']" in " ".join(found["build_tools_in_final_stage"])


def test_what_the_image_copies_is_in_the_repository(stages):
    for stage in stages:
        for copy in stage.all("COPY"):
            if "--from=" in copy.args:
                continue
            for source in [w for w in shlex.split(copy.args) if not w.startswith("--")][:-1]:
                assert os.path.exists(os.path.join(REPO, source)), f"COPY {source}: missing"
    entrypoint = stages[-1].all("ENTRYPOINT")[-1].args
    script = re.search(r'"/app/([^"]+)"', entrypoint).group(1)
    # COPY keeps the mode git gives it: a script that is not executable never starts.
    mode = subprocess.run(
        ["git", "ls-files", "-s", script], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    if mode:  # tracked: check the mode a clean clone gets
        assert mode[0] == "100755", f"{script} is not executable in git"
    else:
        assert os.access(os.path.join(REPO, script), os.X_OK), f"{script} is not executable"


def test_the_parser_reads_what_docker_reads():
    text = (
        "ARG BASE=python:3.11.14-slim\n"
        "FROM ${BASE} AS build\n"
        "RUN apt-get update \\\n"
        "# a comment inside a continuation is dropped\n"
        "    && apt-get install -y gcc\n"
        "FROM $BASE\n"
        "USER 10001\n"
    )
    global_args, (build, final) = parse(text)
    assert global_args == {"BASE": "python:3.11.14-slim"}
    assert (build.base, build.name, final.base, final.name) == (
        "python:3.11.14-slim",
        "build",
        "python:3.11.14-slim",
        None,
    )
    assert build.all("RUN")[0].args.split() == [
        "apt-get",
        "update",
        "&&",
        "apt-get",
        "install",
        "-y",
        "gcc",
    ]
    assert final.all("USER")[0].args == "10001"
