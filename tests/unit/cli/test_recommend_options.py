"""``fracpilot recommend``'s own options: durations, the automatic step, kubectl's namespace."""

from __future__ import annotations

from pathlib import Path

import pytest

from fracpilot_cli.kube_access import context_namespace
from fracpilot_cli.recommend import auto_step, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"), [("14d", 14 * 86_400), ("36h", 129_600), ("90m", 5400), ("2w", 1_209_600)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["14", "d", "-1d", "1y", ""])
def test_not_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_the_automatic_step_keeps_long_ranges_light() -> None:
    assert auto_step(3600) == 60
    assert auto_step(86_400) == 60
    assert auto_step(14 * 86_400) == 300
    assert auto_step(30 * 86_400) == 660


def test_the_namespace_is_the_contexts_else_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config"
    config.write_text(
        "current-context: b\ncontexts:\n"
        "- name: a\n  context: {namespace: not-this}\n"
        "- name: b\n  context: {namespace: inference}\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert context_namespace() == "inference"
    config.write_text("current-context: a\ncontexts:\n- name: a\n  context: {}\n")
    assert context_namespace() == "default"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    assert context_namespace() == "default"
    # --kubeconfig and --context win over KUBECONFIG and the current context.
    config.write_text(
        "current-context: a\ncontexts:\n"
        "- name: a\n  context: {namespace: not-this}\n"
        "- name: b\n  context: {namespace: team-b}\n"
    )
    assert context_namespace(str(config), "b") == "team-b"
    assert context_namespace(str(config)) == "not-this"
