"""Which GPU instance `ngcx deploy` picks for an image, and what the dry run says about it.

Why these cases: a wrong pick costs money (an A100 where a T4 was asked, a price limit ignored) or
fails only after minutes of provisioning (a T4 for an image built for cc 8.0+), and a broken table
must be one line with file:line, like every other file ngcx reads. The shipped table is data that
someone will edit by hand: its rows are checked for the slips that hand-editing makes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from ngcx.core.errors import UserError
from ngcx.deploy.offers import WORKLOADS, Choice, choose, explain, load_table

ALL_CCS = ["6.0", "6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0"]
AMPERE_UP = ["8.0", "8.6", "8.9", "9.0"]
SPEC = {  # gpu: (memory, bandwidth, tensor, fp32, fp16, cc)
    "T4": (16, 320, 65, 8.1, 16.2, "7.5"),
    "A10": (24, 600, 125, 31.2, 31.2, "8.6"),
    "A100": (40, 1555, 312, 19.5, 78, "8.0"),
}


def row(name: str, gpu: str, price: float | None, count: int = 1, spot: float | None = None, vcpu: int = 8,
        extra: str = "") -> str:
    mem, bw, tensor, fp32, fp16, cc = SPEC[gpu]
    text = (f"  - name: {name}\n    family: {name.split('.')[1].split('-')[0]}\n    gpu: {gpu}\n"
            f"    gpu_count: {count}\n    gpu_memory_gib: {mem}\n    memory_bandwidth_gbs: {bw}\n"
            f"    tensor_tflops: {tensor}\n    fp32_tflops: {fp32}\n    fp16_tflops: {fp16}\n"
            f'    compute_capability: "{cc}"\n    vcpu: {vcpu}\n    ram_gib: {vcpu * 4}\n'
            f"    price_per_hour: {'null' if price is None else price}\n    price_estimate: true\n")
    if spot is not None:
        text += f"    spot_price_per_hour: {spot}\n"
    if price is not None:
        text += "    price_region: test-1\n    price_source: https://example.com/prices\n"
    return text + extra


def table(tmp_path: Path, *rows: str, head: str = "") -> Path:
    file = tmp_path / "aliyun.yaml"
    file.write_text("cloud: aliyun\ncurrency: USD\nprices_as_of: 2024-09-01\n"
                    "sources: [https://example.com/prices]\n" + head + "instance_types:\n" + "".join(rows))
    return file


def pick(**kw) -> Choice:
    kw.setdefault("compute_capabilities", ALL_CCS)
    kw.setdefault("driver_floor", "525.60.13")
    return choose("aliyun", **kw)


def names(choice: Choice) -> list[str]:
    return [c.itype.name for c in choice.candidates]


def load_error(file: Path) -> str:
    with pytest.raises(UserError) as info:
        load_table("aliyun", file)
    return info.value.line()


# ----------------------------------------------------------------------------- the shipped table


def test_the_shipped_table_loads_and_every_row_is_sane():
    types, meta = load_table("aliyun")
    assert meta["cloud"] == "aliyun" and meta["currency"] in ("USD", "CNY")
    assert re.fullmatch(r"20\d\d-\d\d-\d\d", meta["prices_as_of"])
    assert meta["sources"] and all(s.startswith("https://") for s in meta["sources"])
    assert len({t.name for t in types}) == len(types), "an instance type is listed twice"
    for t in types:
        assert t.name.startswith(f"ecs.{t.family}"), t.name
        assert min(t.gpu_count, t.gpu_memory_gib, t.memory_bandwidth_gbs, t.fp32_tflops, t.fp16_tflops,
                   t.vcpu, t.ram_gib) > 0 and t.tensor_tflops >= 0, t.name
        assert re.fullmatch(r"\d\.\d", t.compute_capability), t.name
        assert t.price_estimate, f"{t.name}: the table has no live prices, every figure is an estimate"
        if t.price_per_hour is not None:
            assert t.price_source and t.price_source.startswith("https://") and t.price_region, t.name
            assert t.spot_price_per_hour is None or t.spot_price_per_hour < t.price_per_hour, t.name
        else:
            assert t.notes, f"{t.name}: a missing price says why in notes"


def test_one_gpu_model_has_the_same_figures_in_every_row():
    """A copy-paste slip (A10 with the T4's bandwidth) would silently reorder the ranking."""
    figures: dict[tuple, set] = defaultdict(set)
    for t in load_table("aliyun")[0]:
        figures[(t.gpu, t.gpu_memory_gib)].add((t.memory_bandwidth_gbs, t.tensor_tflops, t.fp32_tflops,
                                                t.fp16_tflops, t.compute_capability))
    assert {k: v for k, v in figures.items() if len(v) > 1} == {}
    assert figures[("T4", 16)] == {(320, 65, 8.1, 16.2, "7.5")}
    assert figures[("A100", 80)] == {(2039, 312, 19.5, 78, "8.0")}


def test_the_families_the_brief_names_are_all_there():
    families = {t.family: t.gpu for t in load_table("aliyun")[0]}
    assert {f: families.get(f) for f in ("gn5", "gn6i", "gn6v", "gn6e", "gn7i", "gn7", "gn7e", "gn7s", "gn8is")} == {
        "gn5": "P100", "gn6i": "T4", "gn6v": "V100", "gn6e": "V100", "gn7i": "A10", "gn7": "A100",
        "gn7e": "A100", "gn7s": "A30", "gn8is": "L20"}


# ----------------------------------------------------------------------------- filtering


def test_an_ampere_image_never_gets_a_t4_v100_or_pascal():
    choice = pick(compute_capabilities=["8.0,8.6,8.9,9.0"])
    assert choice.candidates
    assert {c.itype.gpu for c in choice.candidates} == {"A100", "A10", "A30", "L20"}
    reasons = {r.itype.gpu: r.reason for r in choice.rejected}
    assert reasons["T4"] == "GPU T4 is compute capability 7.5, the image supports 8.0, 8.6, 8.9, 9.0"
    assert set(reasons) == {"T4", "V100", "P100", "P4"}


def test_gpu_t4_on_an_ampere_image_has_no_candidates_and_says_why():
    choice = pick(compute_capabilities=AMPERE_UP, gpu="t4")
    assert choice.candidates == []
    assert choice.rejected and {r.itype.gpu for r in choice.rejected} == {"T4"}
    assert all("compute capability 7.5" in r.reason for r in choice.rejected)
    out = explain(choice)
    assert out[0].startswith("aliyun: 0 candidate(s) (t4 only)")
    assert out[-1] == "  gn6i (7 types): GPU T4 is compute capability 7.5, the image supports 8.0, 8.6, 8.9, 9.0"


def test_a_ptx_entry_admits_newer_gpus_only():
    gpus = {c.itype.gpu for c in pick(compute_capabilities=["8.0+PTX"]).candidates}
    assert gpus == {"A100", "A30", "A10", "L20"}


def test_unknown_gpu_names_the_models_the_table_knows():
    with pytest.raises(UserError) as info:
        pick(gpu="H100")
    assert info.value.line().startswith("unknown GPU 'H100' for aliyun: the table knows A10, A100, A30, L20, P100,")
    with pytest.raises(UserError, match=r"no A100 with 48 GB \(A100 comes with 40, 80 GB\)"):
        pick(gpu="a100-48g")
    assert {c.itype.name for c in pick(gpu="A100 80GB").candidates} == {
        "ecs.gn7e-c16g1.4xlarge", "ecs.gn7e-c16g1.16xlarge", "ecs.gn7e-c16g1.32xlarge"}


def test_max_price_rejects_dearer_and_unpriced_types():
    choice = pick(max_price=2.0)
    assert choice.candidates and all(c.itype.price_per_hour <= 2.0 for c in choice.candidates)
    reasons = {r.itype.name: r.reason for r in choice.rejected}
    assert reasons["ecs.gn7-c12g1.3xlarge"] == "costs 4.60 USD/h est., over the limit of 2 USD/h"
    assert reasons["ecs.gn8is.2xlarge"] == "no public price to compare with the price limit"
    assert names(pick(max_price=None)).count("ecs.gn8is.2xlarge") == 1  # no limit: kept


def test_a_driver_past_a_gpus_last_branch_rejects_it_and_the_floor_is_recorded():
    old = pick(driver_floor="525.60.13", gpu="V100")
    assert old.candidates and old.candidates[0].why.endswith("driver >= 525.60.13 assumed on the host")
    new = pick(driver_floor="590.44.01", gpu="V100")
    assert new.candidates == []
    assert new.rejected[0].reason == "GPU V100's last NVIDIA driver branch is 580, the image needs driver >= 590.44.01"


def test_min_gpu_memory_is_per_gpu():
    gpus = {c.itype.gpu for c in pick(min_gpu_memory_gib=40).candidates}
    assert gpus == {"A100", "L20"}  # 4x T4 = 64 GB in total does not count


# ----------------------------------------------------------------------------- ranking


def test_cnn_ranks_an_a100_above_an_a10_above_a_t4():
    order = [c.itype.gpu for c in pick(workload="cnn").candidates]
    first = {g: order.index(g) for g in ("A100", "A10", "T4")}
    assert first["A100"] < first["A10"] < first["T4"]
    top = pick(workload="cnn").candidates[0]
    assert (top.rank, top.itype.gpu, top.itype.gpu_count) == (1, "A100", 1)


def test_transformer_ranks_by_memory_bandwidth_a100_80g_first():
    choice = pick(workload="transformer")
    assert choice.candidates[0].itype.name == "ecs.gn7e-c16g1.4xlarge"
    bandwidth = [c.itype.memory_bandwidth_gbs for c in choice.candidates]
    assert bandwidth == sorted(bandwidth, reverse=True)
    assert pick(workload="rnn").candidates == choice.candidates
    assert [c.rank for c in choice.candidates] == list(range(1, len(choice.candidates) + 1))


def test_equal_gpus_rank_by_fewer_gpus_then_price(tmp_path):
    file = table(tmp_path, row("ecs.gx1-big.4xlarge", "T4", 2.5, vcpu=16),
                 row("ecs.gx1-quad.16xlarge", "T4", 1.0, count=4, vcpu=64),
                 row("ecs.gx1-small.xlarge", "T4", 1.2, vcpu=4),
                 row("ecs.gx1-nopr.2xlarge", "T4", None, vcpu=8))
    choice = pick(table=file)
    assert names(choice) == ["ecs.gx1-small.xlarge", "ecs.gx1-big.4xlarge", "ecs.gx1-nopr.2xlarge",
                             "ecs.gx1-quad.16xlarge"]
    assert [c.why for c in choice.candidates[1:]] == [
        "same GPU as #1, costs more; driver >= 525.60.13 assumed on the host",
        "same GPU as #1, larger instance; driver >= 525.60.13 assumed on the host",
        "same GPU as #1, 4 GPUs (fewer GPUs rank first); driver >= 525.60.13 assumed on the host"]


def test_spot_ranks_and_filters_by_spot_prices(tmp_path):
    file = table(tmp_path, row("ecs.gx1-a.xlarge", "T4", 1.0, spot=0.9),
                 row("ecs.gx1-b.2xlarge", "T4", 1.5, spot=0.3),
                 row("ecs.gx1-c.4xlarge", "T4", 1.1))
    assert names(pick(table=file)) == ["ecs.gx1-a.xlarge", "ecs.gx1-c.4xlarge", "ecs.gx1-b.2xlarge"]
    spot = pick(table=file, spot=True, max_price=1.05)
    assert names(spot) == ["ecs.gx1-b.2xlarge", "ecs.gx1-a.xlarge"]
    assert [r.reason for r in spot.rejected] == ["costs 1.10 USD/h on-demand (no spot figure) est., "
                                                  "over the limit of 1.05 USD/h"]


def test_bad_arguments_are_one_line_errors():
    for kw, message in [({"workload": "gan"}, "unknown workload 'gan' (use one of cnn, rnn, transformer)"),
                        ({"compute_capabilities": []}, "the image declares no GPU compute capabilities"),
                        ({"compute_capabilities": ["ampere"]}, "the image's compute capability 'ampere'"),
                        ({"driver_floor": "latest"}, "the image's minimum driver 'latest'"),
                        ({"max_price": 0}, "the price limit must be above 0")]:
        with pytest.raises(UserError) as info:
            pick(**kw)
        assert info.value.line().startswith(message), info.value.line()
    with pytest.raises(UserError, match="no instance table for cloud 'gcp': ngcx knows aliyun"):
        choose("gcp", compute_capabilities=ALL_CCS, driver_floor=None)
    assert WORKLOADS == ("cnn", "rnn", "transformer")


# ----------------------------------------------------------------------------- a broken table


def test_an_unknown_key_is_one_line_with_file_and_line(tmp_path):
    file = table(tmp_path, row("ecs.gx1-a.xlarge", "T4", 1.0),
                 row("ecs.gx1-b.xlarge", "T4", 1.0, extra="    gpus: 2\n"))
    line = load_error(file)
    assert line.startswith(f"aliyun.yaml is invalid: {file}:38: instance_types.1.gpus: unknown key"), line
    assert "\n" not in line


def test_a_wrong_type_is_one_line_with_file_and_line(tmp_path):
    text = table(tmp_path, row("ecs.gx1-a.xlarge", "T4", 1.0)).read_text()
    (tmp_path / "aliyun.yaml").write_text(text.replace("gpu_count: 1", "gpu_count: one"))
    assert load_error(tmp_path / "aliyun.yaml").startswith(
        f"aliyun.yaml is invalid: {tmp_path / 'aliyun.yaml'}:9: instance_types.0.gpu_count: Input should be a valid")
    (tmp_path / "aliyun.yaml").write_text(text.replace('"7.5"', "7.5"))
    assert load_error(tmp_path / "aliyun.yaml") == (
        f"aliyun.yaml is invalid: {tmp_path / 'aliyun.yaml'}:15: instance_types.0.compute_capability: "
        '7.5 is a number, not a string (quote it, e.g. "25.10": YAML reads 25.10 as 25.1)')


def test_rule_breaks_across_fields_point_at_the_row(tmp_path):
    file = table(tmp_path, row("ecs.gx1-a.xlarge", "T4", 1.0, spot=2.0))
    assert load_error(file).startswith(f"aliyun.yaml is invalid: {file}:6: instance_types.0: "
                                       "spot_price_per_hour is above price_per_hour")
    file = table(tmp_path, row("ecs.gx1-a.xlarge", "T4", 1.0), row("ecs.gx1-a.xlarge", "A10", 2.0))
    assert load_error(file) == (f"aliyun.yaml is invalid: {file}:22: instance_types.1.name: "
                                "ecs.gx1-a.xlarge is listed twice (first as instance_types.0)")
    file = table(tmp_path, row("ecs.gx1-a.xlarge", "T4", 1.0, extra='    max_driver: "580"\n'))
    assert "max_driver needs max_driver_source" in load_error(file)


def test_text_that_is_not_yaml_or_not_a_table_is_one_line(tmp_path):
    file = tmp_path / "aliyun.yaml"
    file.write_text("cloud: aliyun\ninstance_types: [\n  {name: x,\n")
    line = load_error(file)
    assert re.match(rf"{re.escape(str(file))}:\d+:\d+: malformed YAML: ", line) and "\n" not in line, line
    file.write_text("- just\n- a list\n")
    assert load_error(file).startswith(f"aliyun.yaml is invalid: {file}: the file must be a mapping with cloud,")
    assert load_error(tmp_path / "missing.yaml").startswith(f"cannot read {tmp_path / 'missing.yaml'}:")


# ----------------------------------------------------------------------------- explain


def test_explain_lists_ranked_candidates_with_estimates_then_rejected(tmp_path):
    file = table(tmp_path, row("ecs.gt4-c4g1.xlarge", "T4", 1.05, vcpu=4),
                 row("ecs.gt4-c8g1.2xlarge", "T4", 1.3),
                 row("ecs.ga10-c8g1.2xlarge", "A10", 1.85),
                 row("ecs.ga100-c12g1.3xlarge", "A100", None, vcpu=12))
    choice = pick(table=file, compute_capabilities=["7.0", "8.0", "8.9"])
    assert explain(choice) == [
        "aliyun: 1 candidate(s) for a cnn workload; prices USD/h on-demand, list prices as of 2024-09-01, not live",
        "   1. ecs.ga100-c12g1.3xlarge  1x A100 40 GB, 312 tensor / 19.5 FP32 TFLOP/s, 1555 GB/s, 12 vCPU 48 GiB, "
        "no public price - most tensor TFLOP/s per GPU; driver >= 525.60.13 assumed on the host",
        "rejected (3):",
        "  gt4 (2 types): GPU T4 is compute capability 7.5, the image supports 7.0, 8.0, 8.9",
        "  ecs.ga10-c8g1.2xlarge: GPU A10 is compute capability 8.6, the image supports 7.0, 8.0, 8.9"]
    shipped = explain(pick(workload="cnn", spot=True))
    assert shipped == explain(pick(workload="cnn", spot=True)), "the same inputs print the same lines"
    assert "USD/h spot" in shipped[0]
    assert any(" USD/h spot est. - " in line for line in shipped[1:])
    assert all(" USD/h" not in line or " est." in line for line in shipped[1:]), "every shipped price is an estimate"
