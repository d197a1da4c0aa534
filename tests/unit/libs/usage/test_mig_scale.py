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
from fracpilot_libs.mig.profiles import CARDS, MigCard, base_model, card_for_model, instance_model
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


# A model name per card, as NVML/DCGM name it: "NVIDIA H200" (nvidia-smi -q in NVIDIA/mig-parted
# issue 120), "NVIDIA H100 NVL" (NVIDIA/dcgm-exporter issue 544), the go-nvml mocks' names for
# the A100s and the A30, and the driver's table of supported GPUs for the B200 and the cards
# after it (NVIDIA/open-gpu-kernel-modules README.md, commit df1c9a3).
MODELS = {
    "a100-80gb": "NVIDIA A100-SXM4-80GB",
    "h100-80gb": "NVIDIA H100 80GB HBM3",
    "a100-40gb": "NVIDIA A100-SXM4-40GB",
    "a30-24gb": "NVIDIA A30-PCIE-24GB",
    "h100-94gb": "NVIDIA H100 NVL",
    "h200-141gb": "NVIDIA H200",
    "h200-nvl": "NVIDIA H200 NVL",
    "b200-180gb": "NVIDIA B200",
    "h100-96gb": "NVIDIA GH200 480GB",
    "gh200-144gb": "NVIDIA GH200 144G HBM3e",
    "gb200-186gb": "NVIDIA GB200",
    "b300-288gb": "NVIDIA B300 SXM6 AC",
    "gb300-288gb": "NVIDIA GB300",
    "rtx-pro-6000-96gb": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
}


def test_every_card_has_a_model_name_that_finds_it() -> None:
    assert {key: getattr(card_for_model(m), "key", None) for key, m in MODELS.items()} == {
        key: key for key in CARDS
    }


@pytest.mark.parametrize("mig_card", list(CARDS.values()), ids=lambda c: c.key)
def test_a_full_instance_uses_its_profiles_share_of_the_card_in_both_quantities(
    mig_card: MigCard,
) -> None:
    """Every profile of the table, busy and full: compute is its compute slices of the card's
    and memory its memory slices of the card's, the same two shares a MIG level is made of
    (sizing.grids)."""
    model = MODELS[mig_card.key]
    compute_of, memory_of = mig_card.compute_slices, mig_card.memory_slices
    for profile in mig_card.profiles:
        full = pod("full-0", profile.memory_mib)
        gpu = card(model, MigInstanceState(1, profile.name, profile.memory_mib, 1.0, pod=full))
        got, rejections = samples(gpu)
        assert rejections == []
        sample = got["full-0"]
        assert sample.compute == pytest.approx(profile.compute_slices / compute_of), profile.name
        assert sample.memory_share == pytest.approx(profile.memory_slices / memory_of)
        level = profile_level(
            profile.memory_slices / memory_of, profile.compute_slices / compute_of
        )
        assert min(sample.compute, sample.memory_share) == pytest.approx(level)


@pytest.mark.parametrize(
    ("model", "profile", "instance_mib", "compute", "memory"),
    [
        # half busy, half full: a share of the card, not of the instance
        ("NVIDIA H200", "3g.71gb", 71_163, 0.5 * 3 / 7, 0.5 * 4 / 8),
        ("NVIDIA H200", "1g.18gb", 16_379, 0.5 * 1 / 7, 0.5 * 1 / 8),
        ("NVIDIA H200", "1g.35gb", 33_019, 0.5 * 1 / 7, 0.5 * 2 / 8),
        ("NVIDIA B200", "2g.45gb", 45_307, 0.5 * 2 / 7, 0.5 * 2 / 8),
        ("NVIDIA B200", "7g.180gb", 181_228, 0.5, 0.5),
        ("NVIDIA A30", "2g.12gb", 11_672, 0.5 * 2 / 4, 0.5 * 2 / 4),
        ("NVIDIA GB200", "1g.47gb", 46_592, 0.5 * 1 / 7, 0.5 * 2 / 8),
        ("NVIDIA GH200 144G HBM3e", "3g.72gb", 72_182, 0.5 * 3 / 7, 0.5 * 4 / 8),
        ("NVIDIA GB300", "1g.35gb", 31_539, 0.5 * 1 / 7, 0.5 * 1 / 8),  # the H200's is 2 of 8
    ],
)
def test_h200_b200_and_a30_instances_are_attributed_on_the_cards_scale(
    model: str, profile: str, instance_mib: int, compute: float, memory: float
) -> None:
    """The model names carry no size ("NVIDIA H200", "NVIDIA B200"): the card's table gives the
    scale, with no inventory."""
    half = pod("chat-0", instance_mib // 2)
    gpu = card(model, MigInstanceState(2, profile, instance_mib, 0.5, pod=half))
    got, rejections = samples(gpu)
    assert rejections == []
    sample = got["chat-0"]
    assert sample.compute == pytest.approx(compute)
    assert sample.memory_share == pytest.approx(memory, rel=1e-3)
    assert sample.memory_used_bytes == (instance_mib // 2) * MIB
    assert sample.gpu_model == f"{model} MIG {profile}"


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
        ("2g.12gb", "NVIDIA A30", None, 2 / 4),  # the A30's table: 2 of its 4 slices
        ("3g.71gb", "NVIDIA H200", None, 4 / 8),
        ("1g.45gb", "NVIDIA B200", None, 2 / 8),
        ("1g.12gb", "NVIDIA H100 NVL", None, 1 / 8),
        # a name off the table (dcgm-exporter names an A100 80GB's 7g.80gb "7g.79gb", issue
        # 713): the card's size from its table, 180 GB, to the nearest of its 8 slices
        ("1g.22gb", "NVIDIA B200", None, 1 / 8),
        ("1g.5gb", "NVIDIA A30", None, 1 / 4),
        ("7g.79gb", "NVIDIA A100 80GB PCIe", None, 1.0),
        ("2g.20gb", "NVIDIA Z100", None, None),  # no table, no size in the name, no inventory
        ("weird", "NVIDIA A100-SXM4-80GB", None, None),
    ],
)
def test_memory_share_of_the_card(
    profile: str, model: str, card_memory: int | None, share: float | None
) -> None:
    got = memory_share(profile, model, card_memory)
    assert got == (pytest.approx(share) if share is not None else None)


def test_an_instance_of_an_unknown_card_is_rejected_once_then_read_with_inventory() -> None:
    """A card without a table whose name gives no size ("NVIDIA RTX PRO 5000 Blackwell",
    MIG-capable in the MIG User Guide, no table here) is off the card's scale, so nothing of it
    is used (rather than a fraction of two scales); the parent's memory from the inventory puts
    it on the scale, with the usual 7 compute slices."""
    gpu = card(
        "NVIDIA RTX PRO 5000 Blackwell",
        MigInstanceState(1, "1g.12gb", 12_288, 0.5, pod=pod("chat-0", 6_144)),
        total_mib=49_152,
    )
    got, rejections = samples(gpu)
    assert got == {}
    assert [r.reason for r in rejections] == ["unknown_mig_profile"]
    got, rejections = samples(gpu, GpuInventory(device_memory_bytes={UUID: 49_152 * MIB}))
    assert rejections == []
    assert got["chat-0"].memory_share == pytest.approx(6_144 / 12_288 / 4)  # 12 of 48 GB: 2/8
    assert got["chat-0"].compute == pytest.approx(0.5 / 7)


@pytest.mark.parametrize(
    ("model", "profile", "instance_mib", "slices", "memory_slices"),
    [
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "1g.24gb", 23_675, 1, 1),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "1g.24gb+gfx", 23_675, 1, 1),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "1g.24gb-me", 23_675, 1, 1),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "1g.24gb+me.all", 23_675, 1, 1),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "2g.48gb", 47_616, 2, 2),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "2g.48gb+gfx", 47_616, 2, 2),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "1g.24gb", 23_675, 1, 1),
    ],
)
def test_an_rtx_pro_6000_instance_is_read_in_quarters_not_sevenths(
    model: str, profile: str, instance_mib: int, slices: int, memory_slices: int
) -> None:
    """The RTX PRO 6000 is split 4 x 4 (its table): a busy 1g.24gb is a quarter of the card's
    compute, not the 1/7 of the 7-slice fallback, and its memory a quarter of the card's; the
    +gfx, -me and +me.all variants hold their base profile's slices."""
    full = pod("full-0", instance_mib)
    gpu = card(model, MigInstanceState(1, profile, instance_mib, 1.0, pod=full), total_mib=97_887)
    got, rejections = samples(gpu)
    assert rejections == []
    sample = got["full-0"]
    assert sample.compute == pytest.approx(slices / 4)
    assert sample.compute != pytest.approx(slices / 7)
    assert sample.memory_share == pytest.approx(memory_slices / 4)
    assert memory_share(profile, model) == pytest.approx(memory_slices / 4)


def test_a_truly_unknown_card_is_rejected_as_unknown_mig_profile() -> None:
    gpu = card(
        "NVIDIA Z100",  # no card of this name: no table, no size, no inventory
        MigInstanceState(1, "2g.20gb", 20_480, 0.5, pod=pod("chat-0", 1_024)),
    )
    got, rejections = samples(gpu)
    assert got == {}
    assert [r.reason for r in rejections] == ["unknown_mig_profile"]


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
