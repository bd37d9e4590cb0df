"""The kernel profile cache: samples pooled by signature within a recording and across
captures, kept per setup, saved atomically, and refused clearly when damaged."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from tiermem.plan import GraphError  # noqa: E402
from tiermem.plan.torch import Recorder, graph_from_recordings  # noqa: E402
from tiermem.plan.torch.kernel_profiles import PROFILES_FORMAT, KernelProfiles, setup_key  # noqa: E402

SLOW = "emulated:optane-pmem"
DEVICES = [("dram", 1 << 20, False), (SLOW, None, False)]
TRAITS = [{"read_gbps": 30.0, "write_gbps": 60.0}, {"read_gbps": 10.0, "write_gbps": 8.0}]
COPY = [[None, 10.0], [10.0, None]]


def recordings(times: list[tuple[str, float, float]]) -> tuple[Recorder, Recorder]:
    """An all-fast and an all-slow recording of kernels ``(signature, fast s, slow s)``,
    each reading one 1 MiB parameter and making a 1 MiB tensor."""
    fast, slow = Recorder(), Recorder()
    for k, (sig, tf, ts) in enumerate(times):
        for rec, t in ((fast, tf), (slow, ts)):
            rec.kernels.append(("op.default", t, [(f"p{k}", "read"), (f"{k}.0", "make")]))
            rec.signatures.append(sig)
            rec.tensors[f"p{k}"] = {"bytes": 1 << 20, "kind": "parameter", "persistent": True}
            rec.tensors[f"{k}.0"] = {"bytes": 1 << 20, "kind": "activation", "persistent": False}
    return fast, slow


def extras(g) -> list[float]:
    return [sum(o.seconds[1] for o in k.operands) for k in g.kernels]


def test_kernels_sharing_a_signature_share_the_mean_difference() -> None:
    fast, slow = recordings([("a", 1.0, 1.01), ("a", 1.0, 1.03), ("b", 2.0, 2.5), ("c", 1.0, 0.99)])
    g = graph_from_recordings("x", fast, slow, DEVICES, TRAITS, COPY)
    # "a": the mean of 0.01 and 0.03; "b" alone; "c" measured faster slow: clipped to zero.
    assert extras(g) == pytest.approx([0.02, 0.02, 0.5, 0.0])


def test_the_cache_pools_across_captures_and_keeps_setups_apart(tmp_path) -> None:
    path = tmp_path / "sub" / "profiles.json"
    key = setup_key([d for d, *_ in DEVICES])
    first = KernelProfiles(key, path)
    assert first.known == 0
    fast, slow = recordings([("a", 1.0, 1.01), ("a", 1.0, 1.03)])
    graph_from_recordings("x", fast, slow, DEVICES, TRAITS, COPY, profiles=first)
    first.save()
    again = KernelProfiles(key, path)
    assert again.known == 1 and again.pooled("a") == (2, pytest.approx(0.04))
    # A later capture measures 0.06: the cache's two samples and this one are averaged.
    fast, slow = recordings([("a", 1.0, 1.06)])
    g = graph_from_recordings("x", fast, slow, DEVICES, TRAITS, COPY, profiles=again)
    assert extras(g) == pytest.approx([(0.04 + 0.06) / 3])
    again.save()
    assert KernelProfiles(key, path).pooled("a") == (3, pytest.approx(0.10))
    # Another setup (another slow device) neither sees nor disturbs those samples.
    other = KernelProfiles(setup_key(["dram", "emulated:cxl"]), path)
    assert other.known == 0 and other.pooled("a") == (0, 0.0)
    other.add("a", 1, 1.0)
    other.save()
    assert KernelProfiles(key, path).pooled("a") == (3, pytest.approx(0.10))
    doc = json.loads(path.read_text())
    assert doc["format"] == PROFILES_FORMAT and len(doc["setups"]) == 2


@pytest.mark.parametrize(
    "text, why",
    [
        ("{not json", "not JSON"),
        ('{"format": "something-else"}', "not a tiermem-profiles-1 file"),
        ('{"format": "tiermem-profiles-1"}', "no 'setups' object"),
        ('{"format": "tiermem-profiles-1", "setups": {"k": []}}', "setup 'k' is not an object"),
        ('{"format": "tiermem-profiles-1", "setups": {"k": {"sig": [0, 1.0]}}}', "signature 'sig'"),
        ('{"format": "tiermem-profiles-1", "setups": {"k": {"sig": [1, "x"]}}}', "signature 'sig'"),
    ],
)
def test_a_damaged_cache_is_refused_by_name_and_left_alone(tmp_path, text: str, why: str) -> None:
    path = tmp_path / "profiles.json"
    path.write_text(text)
    with pytest.raises(GraphError, match=why) as e:
        KernelProfiles("k", path)
    assert str(path) in str(e.value)
    assert path.read_text() == text


def test_a_cache_that_cannot_be_written_is_refused_before_any_work(tmp_path) -> None:
    from tiermem.exceptions import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="is a folder"):
        KernelProfiles("k", tmp_path)
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        KernelProfiles("k", "/proc/no-such-folder/profiles.json")


def test_plan_command_pools_into_the_cache_it_is_given(tmp_path, capsys, small_resnet) -> None:
    from tiermem.cli.main import main

    cache = tmp_path / "profiles.json"
    args = ["plan", "--model", "resnet", "--batch", "2", "--time-limit", "0", "--save-plan", str(tmp_path / "p.json")]
    assert main([*args, "--profile-cache", str(cache)]) == 0
    text = capsys.readouterr().out
    assert f"(0 signatures already in {cache})" in text
    (setup,) = json.loads(cache.read_text())["setups"].values()
    # ResNet repeats its blocks: far fewer signatures than kernels, each with its samples.
    kernels = int(text.split("recorded ")[1].split(" kernels")[0])
    assert 0 < len(setup) < kernels / 2 and sum(n for n, _ in setup.values()) == kernels
    before = cache.read_text()
    assert main([*args, "--no-profile-cache"]) == 0
    assert "no profile cache" in capsys.readouterr().out and cache.read_text() == before


def test_on_a_duplex_device_the_measured_time_is_the_longer_channels() -> None:
    """The all-slow run's extra time on a duplex device is its longer channel's: the
    operands' costs are scaled so that channel's sum is the measured time, and an operand on
    the shorter channel saves nothing alone."""
    devices = [("dram", 1 << 20, False), (SLOW, None, True)]
    read, write = 1 / 10 - 1 / 30, 1 / 8 - 1 / 60  # TRAITS' extra seconds per GB, slow over fast
    fast, slow = recordings([("a", 1.0, 1.5)])
    # An in-place update of a 1 MiB parameter (read and written) that reads a 2 MiB gradient.
    for rec, t in ((fast, 1.0), (slow, 1.4)):
        rec.kernels.append(("add_.Tensor", t, [("p0", "write"), ("g", "read")]))
        rec.signatures.append("b")
    for rec in (fast, slow):
        rec.tensors["g"] = {"bytes": 2 << 20, "kind": "gradient", "persistent": True}
    g = graph_from_recordings("x", fast, slow, devices, TRAITS, COPY)
    assert g.devices[1].duplex and not g.devices[0].duplex
    assert g.kernel_seconds(0, [1, 1]) == pytest.approx(1.5)
    assert g.kernel_seconds(0, [0, 1]) == pytest.approx(1.5)
    assert g.kernel_seconds(0, [1, 0]) == pytest.approx(1.0 + 0.5 * read / write)
    # Reads: 3 MiB (the parameter and the gradient), writes 1 MiB: reads are longer here.
    assert 3 * read > write
    upd = g.kernels[1].operands[0]
    assert upd.use == "write" and upd.write_seconds is not None
    assert upd.write_seconds[1] == pytest.approx(upd.seconds[1] * write / (read + write))
    assert g.kernel_seconds(1, [1, 1]) == pytest.approx(1.4)
    assert g.kernel_seconds(1, [0, 1]) == pytest.approx(1.0 + 0.4 * 2 / 3)
    # A shared device sums the channels: the same measurement splits by each operand's cost.
    h = graph_from_recordings("x", fast, slow, [("dram", 1 << 20, False), (SLOW, None, False)], TRAITS, COPY)
    assert h.kernel_seconds(0, [1, 1]) == pytest.approx(1.5)
    assert h.kernel_seconds(0, [0, 1]) == pytest.approx(1.0 + 0.5 * write / (read + write))
