"""Fixtures for tests against a real kube-apiserver + etcd (see tests/k8s_control_plane.py).

``kube`` starts one control plane per test session. The binaries are built (minutes, once per
machine) right after collection when a selected test needs them, so the build does not count
against any test's timeout; later sessions start in seconds.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from k8s_control_plane import ControlPlane, ControlPlaneError, ensure_testbin

_BUILD_ERROR = pytest.StashKey[str]()


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if not any("kube" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    shown = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    with shown:
        try:
            ensure_testbin()
        except ControlPlaneError as exc:
            session.config.stash[_BUILD_ERROR] = str(exc)


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A running etcd + kube-apiserver, shared by the whole session: isolate by namespace."""
    if error := request.config.stash.get(_BUILD_ERROR, None):
        pytest.fail(f"no Kubernetes test binaries: {error}", pytrace=False)
    with ControlPlane() as control_plane:
        yield control_plane


@pytest.fixture(scope="session")
def kube_admin(kube: ControlPlane) -> Iterator[client.ApiClient]:
    """An ApiClient for CN=admin O=system:masters."""
    with kube.admin_client() as api:
        yield api


@pytest.fixture
def kube_namespace(kube_admin: client.ApiClient) -> str:
    """A fresh namespace for one test (left behind: with no controllers it would never go)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.CoreV1Api(kube_admin).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    )
    return name
