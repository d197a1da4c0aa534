"""Fixtures for tests against the real GPU scheduling stack (tests/support/gpu_stack.py).

``gpu_stack`` starts, once per session, an etcd + kube-apiserver of its own (its controllers
must not act on the objects of tests/integration/k8s) and next to it kwok, KAI-Scheduler (its
nodescaleadjuster included), kube-scheduler and kube-controller-manager. The binaries are built
(about 15 minutes, once per machine, by scripts/gpu-stack-testbin.sh) right after collection
when a selected test needs them, so the build counts against no test's timeout. Without the
binaries and without Go the tests are skipped with that reason; CI has Go, so there they always
run.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from k8s_control_plane import ControlPlane
from support.fracpilot_on_stack import KaiScenario, limited_queue
from support.gpu_stack import GoMissingError, GpuStack, GpuStackError, ensure_gpu_stack_testbin

_BIN = pytest.StashKey[Path]()
_SKIP = pytest.StashKey[str]()
_ERROR = pytest.StashKey[str]()


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if not any("gpu_stack" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    shown = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    with shown:
        try:
            session.config.stash[_BIN] = ensure_gpu_stack_testbin()
        except GoMissingError as exc:
            print(f"\nskipping the real GPU stack tests: {exc}")
            session.config.stash[_SKIP] = str(exc)
        except GpuStackError as exc:
            session.config.stash[_ERROR] = str(exc)


@pytest.fixture(scope="session")
def gpu_stack(request: pytest.FixtureRequest) -> Iterator[GpuStack]:
    """A running stack on its own control plane, shared by the session: isolate by namespace."""
    if reason := request.config.stash.get(_SKIP, None):
        pytest.skip(reason)
    if error := request.config.stash.get(_ERROR, None):
        pytest.fail(f"no GPU stack binaries: {error}", pytrace=False)
    bin_dir = request.config.stash[_BIN]
    with ControlPlane() as control_plane, GpuStack(control_plane, bin_dir) as stack:
        yield stack


@pytest.fixture
def gpu_namespace(gpu_stack: GpuStack) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (kube-controller-manager empties it)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    gpu_stack.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    with contextlib.suppress(client.ApiException):
        client.CoreV1Api(gpu_stack.api).delete_namespace(name)


@pytest.fixture
def make_gpu_node(gpu_stack: GpuStack) -> Iterator[Callable[[int], str]]:
    """Make Ready kwok nodes with n GPUs for one test; deleted afterwards (pods collected)."""
    made: list[str] = []

    def make(gpus: int) -> str:
        made.append(gpu_stack.create_gpu_node(f"kwok-gpu-{uuid.uuid4().hex[:6]}", gpus=gpus))
        return made[-1]

    yield make
    for name in made:
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(gpu_stack.api).delete_node(name)


@pytest.fixture
def gpu_node(make_gpu_node: Callable[[int], str]) -> str:
    """A Ready kwok node with 4 GPUs for one test."""
    return make_gpu_node(4)


@pytest.fixture
def autoscaler(gpu_stack: GpuStack) -> Iterator[GpuStack]:
    """cluster-autoscaler (kwok provider) for one test (KAI's nodescaleadjuster always runs).

    Stopped afterwards, so no other test sees nodes appear; CA's kwok provider deletes the
    nodes it added when it stops.
    """
    gpu_stack.start_autoscaler()
    try:
        yield gpu_stack
    finally:
        gpu_stack.stop_autoscaler()


@pytest.fixture
def half_gpu_queue(gpu_stack: GpuStack, gpu_namespace: str) -> Iterator[str]:
    """A KAI queue limited to half a GPU, and KAI's controllers that fill its status, for one
    test."""
    with limited_queue(gpu_stack, f"q-{gpu_namespace}", gpu_limit=0.5) as name:
        yield name


@pytest.fixture
def kai(
    gpu_stack: GpuStack,
    gpu_namespace: str,
    make_gpu_node: Callable[[int], str],
    nats_url: str,
    tmp_path: Path,
) -> KaiScenario:
    """A scenario of fracpilot's actuator on the stack (tests/support/fracpilot_on_stack.py)."""
    return KaiScenario(gpu_stack, gpu_namespace, nats_url, tmp_path, make_gpu_node)
