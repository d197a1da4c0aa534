"""The mig-parted config of a layout: mig-parted's v1 spec accepts it, it parses as YAML, and
it asks for exactly the instances the layout places."""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.mig.layout import GpuLayout, pack
from fracpilot_libs.mig.mig_parted import (
    config_name,
    label_value_ok,
    mig_parted_config,
    spec_problems,
)
from fracpilot_libs.mig.profiles import A100_80GB, CARDS, MigCard

# The GPU Operator's example of a custom config (NVIDIA/gpu-operator
# deployments/gpu-operator/values.yaml, migManager.config), which mig-parted accepts.
UPSTREAM_EXAMPLE = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  custom-mig:
    - devices: [0]
      mig-enabled: false
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
    - devices: [2]
      mig-enabled: true
      mig-devices:
        "2g.20gb": 2
        "3g.40gb": 1
    - device-filter: ["0x20B210DE", "0x20B510DE"]
      devices: [3]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 1
        "4g.40gb": 1
"""


def test_the_checks_accept_the_upstream_example_and_reject_what_mig_parted_rejects() -> None:
    assert spec_problems(yaml.safe_load(UPSTREAM_EXAMPLE)) == []
    bad = {
        "version": "v2",
        "mig-configs": {
            "a": [],
            "b": [{"devices": "some", "mig-enabled": True}],
            "c": [{"devices": [0], "mig-enabled": False, "mig-devices": {"1g.10gb": 1}}],
            "d": [{"devices": [0], "mig-enabled": True, "mig-devices": {"10gb": 0}}],
            "e": [{"mig-enabled": True, "mig-devices": {}, "extra": 1}],
        },
    }
    found = " | ".join(spec_problems(bad))
    for expected in (
        "unknown version",
        "at least one entry in 'a'",
        "devices must be 'all'",
        "missing required field 'mig-devices'",
        "MIG devices included when 'mig-enabled' is false",
        "invalid format for '10gb'",
        "all counts for all MigProfiles are 0",
        "missing required field: devices",
        "unexpected field: extra",
    ):
        assert expected in found


def test_config_names_are_label_values() -> None:
    assert config_name("gpu-node-1") == "fracpilot-gpu-node-1"
    long = "n" * 250 + ".example.com"
    for node in ("gpu-node-1", long, "ip-10-0-0-1.ec2.internal", "_odd_", ""):
        name = config_name(node)
        assert label_value_ok(name), name
    assert config_name(long) != config_name(long + "x")


@st.composite
def nodes(draw: st.DrawFn) -> tuple[MigCard, dict[str, list[GpuLayout]]]:
    card = draw(st.sampled_from(list(CARDS.values())))
    out = {}
    for n in range(draw(st.integers(1, 3))):
        profiles = draw(st.lists(st.sampled_from(card.profiles), max_size=20))
        whole = [f"big{i}" for i in range(draw(st.integers(0, 2)))]
        out[f"node-{n}"] = pack([(f"w{i}", p) for i, p in enumerate(profiles)], card, whole)
    return card, out


@settings(max_examples=150, deadline=None)
@given(nodes())
def test_the_config_parses_and_asks_for_what_the_layout_places(
    drawn: tuple[MigCard, dict[str, list[GpuLayout]]],
) -> None:
    card, layout = drawn
    document = mig_parted_config(layout, card)
    text = yaml.safe_dump(document, sort_keys=False)
    parsed = yaml.safe_load(text)
    assert parsed == document
    # nothing to place: no config at all, which mig-parted would refuse (callers print none)
    assert (spec_problems(parsed) == []) == any(layout.values())
    for node, gpus in layout.items():
        if not gpus:
            assert config_name(node) not in parsed["mig-configs"]
            continue
        entries = parsed["mig-configs"][config_name(node)]
        per_gpu: dict[int, dict[str, int] | None] = {}
        for entry in entries:
            assert entry["device-filter"] == list(card.device_ids)
            for index in entry["devices"]:
                assert index not in per_gpu, "a GPU in two entries"
                per_gpu[index] = entry["mig-devices"] if entry["mig-enabled"] else None
        assert sorted(per_gpu) == list(range(len(gpus)))
        for index, gpu in enumerate(gpus):
            assert per_gpu[index] == (gpu.counts() if gpu.mig_enabled else None)


# the A100 80GB's and the A800 80GB's (the operator's group), fracpilot.mig.profiles
A100_80GB_IDS = ["0x20B210DE", "0x20B510DE", "0x20F310DE", "0x20F510DE"]


def test_identical_gpus_share_one_entry() -> None:
    p = A100_80GB.profile
    gpus = pack([(str(i), p("3g.40gb")) for i in range(4)] + [("s", p("1g.10gb"))], A100_80GB)
    gpus += pack([], A100_80GB, whole=["big"])
    document = mig_parted_config({"n1": gpus}, A100_80GB)
    assert document["mig-configs"]["fracpilot-n1"] == [
        {
            "device-filter": A100_80GB_IDS,
            "devices": [0, 1],
            "mig-enabled": True,
            "mig-devices": {"3g.40gb": 2},
        },
        {
            "device-filter": A100_80GB_IDS,
            "devices": [2],
            "mig-enabled": True,
            "mig-devices": {"1g.10gb": 1},
        },
        {"device-filter": A100_80GB_IDS, "devices": [3], "mig-enabled": False},
    ]
