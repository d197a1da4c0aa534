"""A MIG instance's sample on one scale, the card's (docs/mig.md, "One scale"): compute and
memory are both shares of the whole card, and prices are the card's.

The series are rendered as dcgm-exporter renders an instance (``tests/support/gpu_exporter``
after NVIDIA/dcgm-exporter ``render_metrics.go``: the parent's ``UUID`` and ``modelName``, then
``GPU_I_PROFILE`` and ``GPU_I_ID``) and read by the scrape source's parser, as ingest does.
"""

from __future__ import annotations

import pytest

from fracpilot_ingest.sources.scrape import parse_exposition
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.mig.profiles import A100_80GB, H100_80GB, MigCard, base_model, instance_model
from fracpilot_libs.owners import owner_from_pod_name
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.sizing.grids import profile_level
from fracpilot_libs.usage.attribution import GpuInventory, Rejection, observe_points
from fracpilot_libs.usage.mappings import MappingTable
from fracpilot_libs.usage.mig import memory_share
from fracpilot_libs.usage.samples import PublishedSeries, to_sample
from support.gpu_exporter import GpuState, MigInstanceState, PodOnGpu, dcgm_device_metrics

MIB = 1024**2
GIB = 1024**3
T = 1_772_409_600.0
TABLE = MappingTable.of(("dcgm",))
UUID = "GPU-3f0a1b2c-0000-4000-8000-000000000a10"


def pod(name: str, memory_mib: int) -> PodOnGpu:
    return PodOnGpu("team-a", name, "server", util_pct=0, memory_used_mib=memory_mib)


def card(model: str, *instances: MigInstanceState, total_mib: int = 81_920) -> GpuState:
    return GpuState(UUID, "gpu-node-mig", model, total_mib, util_pct=0, mig=instances)


def samples(
    gpu: GpuState, inventory: GpuInventory | None = None
) -> tuple[dict[str, UsageSample], list[Rejection]]:
    text = dcgm_device_metrics([gpu]).text()
    points = parse_exposition(text, set(TABLE.metric_names), "exporter:9400", T)
    observations, rejections = observe_points(points, TABLE, inventory or GpuInventory())
    published = PublishedSeries()
    out: dict[str, UsageSample] = {}
    for obs in observations:
        owner = owner_from_pod_name("test", obs.pod.namespace, obs.pod.pod)
        sample = to_sample(obs, owner, "scrape", T, 3600, published)
        assert isinstance(sample, UsageSample), sample
        out[sample.pod] = sample
    return out, rejections


@pytest.mark.parametrize("mig_card", [A100_80GB, H100_80GB], ids=lambda c: c.key)
def test_a_full_instance_uses_its_profiles_share_of_the_card_in_both_quantities(
    mig_card: MigCard,
) -> None:
    """Every profile of the table, busy and full: compute is its compute slices of 7 and memory
    its memory slices of 8, the same two shares a MIG level is made of (sizing.grids)."""
    model = "NVIDIA A100-SXM4-80GB" if mig_card is A100_80GB else "NVIDIA H100 80GB HBM3"
    for profile in mig_card.candidates:
        full = pod("full-0", profile.memory_mib)
        gpu = card(model, MigInstanceState(1, profile.name, profile.memory_mib, 1.0, pod=full))
        got, rejections = samples(gpu)
        assert rejections == []
        sample = got["full-0"]
        assert sample.compute == pytest.approx(profile.compute_slices / 7), profile.name
        assert sample.memory_share == pytest.approx(profile.memory_slices / 8), profile.name
        level = profile_level(profile.memory_slices / 8, profile.compute_slices / 7)
        assert min(sample.compute, sample.memory_share) == pytest.approx(level)


def test_one_instance_one_scale_two_instances_add_up_to_the_card() -> None:
    """Two 3g.40gb instances of one A100 80GB, half full each: each is a quarter of the card's
    memory (not half of its instance), and the two together use half the card."""
    gpu = card(
        "NVIDIA A100-SXM4-80GB",
        MigInstanceState(1, "3g.40gb", 40_192, 0.6, pod=pod("chat-0", 20_096)),
        MigInstanceState(2, "3g.40gb", 40_192, 0.35, pod=pod("embed-0", 20_096)),
    )
    got, rejections = samples(gpu)
    assert rejections == []
    chat, embed = got["chat-0"], got["embed-0"]
    assert chat.memory_share == pytest.approx(0.25)
    assert embed.memory_share == pytest.approx(0.25)
    assert chat.memory_used_bytes == 20_096 * MIB  # the bytes are the bytes measured
    assert chat.compute == pytest.approx(0.6 * 3 / 7)
    assert chat.memory_share + embed.memory_share == pytest.approx(0.5)


def test_1g_20gb_holds_two_memory_slices_and_one_compute_slice() -> None:
    """The two shares differ: a 1g.20gb's memory is 2/8 of the card, its compute 1/7."""
    gpu = card(
        "NVIDIA H100 80GB HBM3",
        MigInstanceState(5, "1g.20gb", 19_968, 1.0, pod=pod("ocr-0", 19_968)),
    )
    got, _ = samples(gpu)
    assert got["ocr-0"].memory_share == pytest.approx(2 / 8)
    assert got["ocr-0"].compute == pytest.approx(1 / 7)


@pytest.mark.parametrize(
    ("profile", "model", "card_memory", "share"),
    [
        ("3g.40gb", "NVIDIA A100-SXM4-80GB", None, 4 / 8),  # the table
        ("1g.20gb", "NVIDIA A100-SXM4-80GB", None, 2 / 8),
        ("1g.10gb+me", "NVIDIA H100 80GB HBM3", None, 1 / 8),
        ("1c.3g.40gb", "NVIDIA A100-SXM4-80GB", None, 4 / 8),  # a compute instance in a 3g
        ("3g.20gb", "NVIDIA A100-SXM4-40GB", None, 4 / 8),  # the name's sizes: 20 of 40 GB
        ("1g.5gb", "NVIDIA A100-PCIE-40GB", None, 1 / 8),
        ("7g.40gb", "NVIDIA A100-PCIE-40GB", None, 1.0),
        ("4g.24gb", "NVIDIA A30", None, 1.0),  # all the A30's 4 compute slices: all of it
        ("2g.12gb", "NVIDIA A30", 24 * GIB, 4 / 8),  # the card's memory from the inventory
        ("1g.12gb", "NVIDIA H100 NVL", 94 * GIB, 1 / 8),  # names round: 12 of 94 GB is 1/8
        ("2g.12gb", "NVIDIA A30", None, None),  # nothing says the card's memory
        ("weird", "NVIDIA A100-SXM4-80GB", None, None),
    ],
)
def test_memory_share_of_the_card(
    profile: str, model: str, card_memory: int | None, share: float | None
) -> None:
    got = memory_share(profile, model, card_memory)
    assert got == (pytest.approx(share) if share is not None else None)


def test_an_instance_whose_card_memory_is_unknown_is_rejected_once_then_read_with_inventory() -> (
    None
):
    """Off the card's scale nothing is used (rather than a fraction of two scales); the parent's
    memory from the inventory puts it on the scale."""
    gpu = card(
        "NVIDIA H100 NVL",
        MigInstanceState(1, "1g.12gb", 11_008, 0.5, pod=pod("chat-0", 5_504)),
        total_mib=95_830,
    )
    got, rejections = samples(gpu)
    assert got == {}
    assert [r.reason for r in rejections] == ["unknown_mig_profile"]
    got, rejections = samples(gpu, GpuInventory(device_memory_bytes={UUID: 95_830 * MIB}))
    assert rejections == []
    assert got["chat-0"].memory_share == pytest.approx(5_504 / 11_008 / 8)
    assert got["chat-0"].compute == pytest.approx(0.5 / 7)


# --- prices: a MIG instance is priced as its card ------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",  # the samples' gpu_model
        "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",  # GPU feature discovery's mixed-strategy product
        "NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb",
    ],
)
def test_an_instance_is_priced_as_its_card_not_by_its_profiles_size(model: str) -> None:
    """The profile's "40gb" must not pick a 40GB card's price for an 80GB card's instance."""
    prices = GpuPrices(usd_per_hour={"A100 40GB": 2.10, "A100 80GB": 3.40})
    assert prices.hourly(model) == 3.40
    assert base_model(model).replace("-", " ").startswith("NVIDIA A100 SXM4 80GB")


def test_sample_model_names_the_profile_and_its_base_is_the_exporters_model_name() -> None:
    gpu = card(
        "NVIDIA A100-SXM4-80GB",
        MigInstanceState(1, "3g.40gb", 40_192, 0.6, pod=pod("chat-0", 1_000)),
    )
    got, _ = samples(gpu)
    assert got["chat-0"].gpu_model == instance_model("NVIDIA A100-SXM4-80GB", "3g.40gb")
    assert base_model(got["chat-0"].gpu_model) == "NVIDIA A100-SXM4-80GB"
    assert base_model("NVIDIA A100-SXM4-80GB") == "NVIDIA A100-SXM4-80GB"


def test_an_instances_cost_is_its_share_of_the_cards_price() -> None:
    """A full 3g.40gb on an A100 80GB costs half the card (its memory share, the larger), not
    the whole card its instance-scale memory (1.0) priced by the model name made it."""
    gpu = card(
        "NVIDIA A100-SXM4-80GB",
        MigInstanceState(1, "3g.40gb", 40_192, 1.0, pod=pod("chat-0", 40_192)),
    )
    got, _ = samples(gpu)
    sample = got["chat-0"]
    prices = GpuPrices()
    share = max(sample.compute, sample.memory_share)
    assert share == pytest.approx(0.5)
    assert share * prices.hourly(sample.gpu_model) == pytest.approx(
        0.5 * prices.hourly("NVIDIA A100-SXM4-80GB")
    )
