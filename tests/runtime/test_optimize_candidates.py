"""The measured optimizer's decisions on any CPU (issue 50): which candidates are tried on which GPU, the
tolerance check against FP32, the fastest-within-tolerance choice per batch size, the FP16 fallback,
what a plan records and what `ngcx-runtime info PLAN` prints of it, and the flags' one-line errors.

No torch here: the timing and building of candidates needs a GPU (tests/gpu/test_optimizer_gpu.py);
these tests feed choose.py the figures a GPU run would give.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import models
import numpy as np
import pytest

from ngcx_runtime import choose
from ngcx_runtime.candidates import ALL, ModelTraits, applicable
from ngcx_runtime.manifest import OptimizeOptions
from ngcx_runtime.optimize import cache_key

TOL = choose.Tolerance(min_top1=0.9, max_rel_error=0.15)
RESNET = ModelTraits(convolutions=53, linears=0, image_input=True)
VIT = ModelTraits(convolutions=1, linears=48, image_input=True)


def _trial(name: str, batch: int, ms: float, top1: float = 1.0, err: float = 0.01) -> choose.Trial:
    return choose.Trial(name, batch, ms=[ms * 1.02, ms, ms * 0.99], error=choose.Error(top1, err))


def test_compare_measures_top1_agreement_and_error_relative_to_the_largest_reference_value():
    ref = np.array([[1.0, 3.0, 2.0], [4.0, 0.0, -1.0]])
    same = choose.compare(ref, ref.copy())
    assert (same.top1, same.max_rel_error) == (1.0, 0.0)
    flipped = choose.compare(ref, np.array([[1.0, 2.0, 3.0], [4.0, 0.0, -1.0]]))   # row 0's arg-max moves
    assert flipped.top1 == 0.5
    assert flipped.max_rel_error == pytest.approx(1.0 / 4.0)


def test_a_nan_or_infinite_output_fails_every_tolerance():
    ref = np.ones((4, 10))
    out = ref.copy()
    out[2, 3] = np.nan
    err = choose.compare(ref, out)
    assert not err.within(choose.Tolerance(min_top1=0.0, max_rel_error=1e9))
    assert "max relative error" in err.why_not(TOL)


def test_compare_refuses_outputs_of_another_shape():
    with pytest.raises(ValueError, match="differs from the reference"):
        choose.compare(np.zeros((4, 10)), np.zeros((4, 11)))


@pytest.mark.parametrize("top1,err", [(1.5, 0.1), (0.9, 0.0), (0.9, -1.0)])
def test_a_tolerance_out_of_range_is_refused(top1, err):
    with pytest.raises(ValueError):
        choose.Tolerance(min_top1=top1, max_rel_error=err)


def test_the_fastest_candidate_within_tolerance_wins_not_the_fastest_overall():
    trials = [_trial("fp16 max-autotune", 256, 23.4),
              _trial("fp8 rowwise max-autotune", 256, 15.0, top1=0.5),        # fastest, but wrong
              _trial("fp8 static max-autotune", 256, 17.0, top1=0.95, err=0.08)]
    c = choose.choose(trials, TOL, 256)
    assert c.candidate == "fp8 static max-autotune" and not c.fallback
    assert "1.38x over the next (fp16 max-autotune" in c.reason


def test_each_batch_size_gets_its_own_choice():
    trials = [_trial("fp16 max-autotune", 1, 0.75), _trial("fp8 rowwise max-autotune", 1, 0.90),
              _trial("fp16 max-autotune", 256, 23.4), _trial("fp8 rowwise max-autotune", 256, 16.0)]
    assert choose.choose(trials, TOL, 1).candidate == "fp16 max-autotune"
    assert choose.choose(trials, TOL, 256).candidate == "fp8 rowwise max-autotune"


def test_a_candidate_that_failed_to_build_or_was_never_timed_is_never_chosen():
    broken = choose.Trial("fp8 rowwise max-autotune", 8, failure="RuntimeError: no FP8 kernel")
    untimed = choose.Trial("fp8 static max-autotune", 8, error=choose.Error(1.0, 0.0))
    c = choose.choose([broken, untimed, _trial("fp16 max-autotune", 8, 1.3)], TOL, 8)
    assert c.candidate == "fp16 max-autotune"
    assert c.reason.startswith("the only candidate within tolerance")


def test_when_every_candidate_fails_the_tolerance_the_plan_keeps_fp16_and_says_so():
    trials = [_trial("fp8 rowwise max-autotune", 64, 4.0, top1=0.3), _trial("fp16 max-autotune", 64, 6.2, err=0.4)]
    section = choose.record(trials, TOL, [64], {"source": "test", "count": 4}, {})
    assert section["all_fell_back"] is True
    c = section["choices"]["64"]
    assert (c["candidate"], c["fallback"]) == ("fp16", True)
    assert "keeps plain FP16" in c["reason"]
    assert "every candidate failed the tolerance" in "\n".join(choose.render(section))


def test_the_record_keeps_every_trial_with_its_times_error_and_verdict_as_strict_json():
    trials = [_trial("fp16 max-autotune", 1, 0.75), choose.Trial("fp8 rowwise max-autotune", 1, ms=[0.8],
                                                                 error=choose.compare(np.ones((2, 3)),
                                                                                      np.full((2, 3), np.inf)))]
    section = choose.record(trials, TOL, [1], {"source": "test", "count": 2}, {"fp8 static max-autotune": "why"})
    text = json.dumps(section, allow_nan=False)            # JSON has no NaN or Infinity
    rows = {r["candidate"]: r for r in json.loads(text)["trials"]}
    assert rows["fp16 max-autotune"]["passed"] and rows["fp16 max-autotune"]["median_ms"] == 0.75
    assert (rows["fp16 max-autotune"]["min_ms"], rows["fp16 max-autotune"]["max_ms"]) == (0.7425, 0.765)
    assert rows["fp8 rowwise max-autotune"]["max_rel_error"] == "inf" and not rows["fp8 rowwise max-autotune"]["passed"]
    assert section["tolerance"] == {"min_top1": 0.9, "max_rel_error": 0.15}
    assert section["skipped"] == {"fp8 static max-autotune": "why"}


def test_a_batch_uses_the_choice_of_the_next_larger_bucket():
    section = choose.record([_trial("fp16 max-autotune", 8, 1.3), _trial("fp8 rowwise max-autotune", 64, 4.0)],
                            TOL, [8, 64], {}, {})
    assert choose.chosen(section, 3) == "fp16 max-autotune"
    assert choose.chosen(section, 9) == "fp8 rowwise max-autotune"
    assert choose.chosen(section, 500) == "fp8 rowwise max-autotune"     # above the profile: split by the largest


def test_a_convolutional_model_gets_nhwc_candidates_and_no_fp8():
    cands, skipped = applicable(RESNET, "9.0", allow_sparsity=False)
    names = [c.name for c in cands]
    assert "fp16 max-autotune channels-last" in names and "fp16 max-autotune channels-last frozen" in names
    assert "fp16 cudnn-fused channels-last" in names          # conv + BN + add + ReLU as one cuDNN op each
    assert "no linear layer" in skipped["fp16 gemm-epilogue max-autotune"]
    assert not any(c.fp8 for c in cands)
    assert "no linear layer" in skipped["fp8 rowwise max-autotune"]       # ResNet-50's fc is 2048 -> 1000
    with_head = ModelTraits(convolutions=53, linears=2, image_input=True)
    assert "a convolutional model (53 convolutions, 2 linear" in applicable(with_head, "9.0", False)[1][
        "fp8 rowwise max-autotune"]
    assert "cuDNN-fused candidate instead" in applicable(with_head, "9.0", False)[1]["fp16 gemm-epilogue max-autotune"]


def test_a_transformer_gets_fp8_on_hopper_but_not_on_ampere():
    on_h100 = [c.name for c in applicable(VIT, "9.0", False)[0]]
    assert {"fp8 rowwise max-autotune", "fp8 tensorwise max-autotune", "fp8 static max-autotune"} <= set(on_h100)
    assert "fp16 max-autotune channels-last" not in on_h100 and "fp16 cudnn-fused channels-last" not in on_h100
    assert "fp16 gemm-epilogue max-autotune" in on_h100         # linear + GELU in one cuBLASLt call
    cands, skipped = applicable(VIT, "8.0", False)
    assert not any(c.fp8 for c in cands) and "fp16 gemm-epilogue max-autotune" in [c.name for c in cands]
    assert "sm >= 8.9" in skipped["fp8 rowwise max-autotune"] and "8.0" in skipped["fp8 rowwise max-autotune"]


def test_sparsity_is_tried_only_when_the_user_allows_it():
    assert "--allow-sparsity" in applicable(VIT, "9.0", False)[1]["fp16 2:4-sparse max-autotune"]
    assert "fp16 2:4-sparse max-autotune" in [c.name for c in applicable(VIT, "9.0", True)[0]]


def test_candidates_can_be_narrowed_by_name_and_an_unknown_name_is_refused():
    cands, skipped = applicable(VIT, "9.0", False, only=["fp16 max-autotune", "fp8 rowwise max-autotune"])
    assert [c.name for c in cands] == ["fp16 max-autotune", "fp8 rowwise max-autotune"]
    assert skipped["fp8 static max-autotune"] == "left out by --candidates"
    with pytest.raises(ValueError, match="unknown candidate"):
        applicable(VIT, "9.0", False, only=["fp4 magic"])


def test_tuning_options_change_the_cache_key_and_untuned_keys_stay_as_they_were():
    target = {"name": "NVIDIA H200", "compute_capability": "9.0"}
    plain = cache_key("sha", "pytorch", "2.11", OptimizeOptions(precision="fp16"), target)
    assert plain == cache_key("sha", "pytorch", "2.11", OptimizeOptions(precision="fp16", min_top1=0.5), target)
    tuned = cache_key("sha", "pytorch", "2.11", OptimizeOptions(precision="fp16", tune=True), target)
    stricter = cache_key("sha", "pytorch", "2.11", OptimizeOptions(precision="fp16", tune=True, min_top1=0.99), target)
    assert len({plain, tuned, stricter}) == 3


def test_check_section_names_what_a_hand_edited_optimizer_record_got_wrong():
    good = choose.record([_trial("fp16 max-autotune", 8, 1.3)], TOL, [8], {}, {})
    assert choose.check_section(good) is None
    assert "unknown candidate" in choose.check_section({"choices": {"8": {"candidate": "fp4 magic"}}})
    assert "batch size" in choose.check_section({"choices": {"eight": {"candidate": "fp16"}}})
    assert "calibrated_amax" in choose.check_section({**good, "calibrated_amax": {"blocks.0.fc1.weight": -1}})


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "ngcx_runtime.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "NGCX_RUNTIME_CACHE": str(cache)}, timeout=120)


@pytest.mark.parametrize("args,expect", [
    (["--allow-sparsity"], "only apply with --tune"),
    (["--tune"], "runs on the PyTorch backend"),
    (["--tune", "--candidates", "fp16 max-autotune,fp4 magic"], "unknown 'fp4 magic'"),
    (["--tune", "--min-top1", "1.5"], "between 0 and 1"),
])
def test_bad_tuning_flags_are_one_line_exit_2_and_nothing_written(tmp_path, args, expect):
    src = models.mlp(tmp_path / "mlp.onnx")
    proc = _cli("optimize", str(src), "-o", str(tmp_path / "plan"), "--precision", "fp16", *args,
                cache=tmp_path / "cache")
    assert proc.returncode == 2, proc.stderr
    assert expect in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "plan").exists()


def _plan_dir(tmp_path: Path, optimizer: dict) -> Path:
    """A plan directory as optimize --tune writes one (its manifest; the artifact is not read by info)."""
    plan = tmp_path / "plan"
    plan.mkdir()
    manifest = {"plan_format": 1, "name": "vit", "backend": "pytorch", "backend_version": "2.11.0", "precision": "fp16",
                "artifact": "model.pt2", "batch_profile": [1, 256],
                "target": {"kind": "gpu", "name": "NVIDIA H200", "compute_capability": "9.0"},
                "notes": ["48 linear layers in FP8 (rowwise scales)"], "optimizer": optimizer}
    (plan / "manifest.json").write_text(json.dumps(manifest))
    return plan


def test_info_plan_shows_the_choice_per_batch_and_every_candidates_time_and_error(tmp_path):
    trials = [_trial("fp16 max-autotune", 1, 0.75), _trial("fp8 rowwise max-autotune", 1, 0.9, top1=0.97),
              _trial("fp16 max-autotune", 256, 23.46), _trial("fp8 rowwise max-autotune", 256, 15.2, top1=0.5)]
    section = choose.record(trials, TOL, [1, 256], {"source": "the user's examples", "count": 64},
                            {"fp8 static max-autotune": "left out by --candidates"})
    proc = _cli("info", str(_plan_dir(tmp_path, section)), cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "plan vit: pytorch 2.11.0 fp16 on NVIDIA H200 (sm 9.0)" in out
    assert "top-1 >= 0.9, max relative error <= 0.15 against FP32 on 64 example(s) (the user's examples)" in out
    assert "batch    1: fp16 max-autotune" in out and "batch  256: fp16 max-autotune" in out
    assert "15.200" in out and "fail: top-1 agreement 0.5000 < 0.9" in out      # the faster one, and why not
    assert "not tried: fp8 static max-autotune: left out by --candidates" in out
    as_json = json.loads(_cli("info", str(tmp_path / "plan"), "--json", cache=tmp_path / "cache").stdout)
    assert as_json["optimizer"]["choices"]["256"]["candidate"] == "fp16 max-autotune"


def test_info_on_a_plan_whose_optimizer_record_was_edited_badly_is_one_line_exit_2(tmp_path):
    plan = _plan_dir(tmp_path, {"choices": {"256": {"candidate": "fp4 magic"}}})
    proc = _cli("info", str(plan), cache=tmp_path / "cache")
    assert proc.returncode == 2
    assert "unknown candidate 'fp4 magic'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_every_catalogued_candidate_has_a_family_its_builder_knows():
    for c in ALL.values():
        assert c.family in ("compile", "fp8", "sparse")
        assert (c.fp8 is not None) == (c.family == "fp8") and c.sparse == (c.family == "sparse")


def test_a_tuned_plan_met_on_another_gpu_is_rebuilt_tuned_with_its_candidates_and_tolerance():
    from ngcx_runtime.optimize import options_from_manifest

    strict = choose.Tolerance(min_top1=0.95, max_rel_error=0.1)
    section = choose.record([_trial("fp16 max-autotune", 8, 1.3), _trial("fp16 2:4-sparse max-autotune", 8, 1.1)],
                            strict, [8], {}, {})
    opts = options_from_manifest({"precision": "fp16", "batch_profile": [8], "optimizer": section})
    assert (opts.tune, opts.min_top1, opts.max_rel_error) == (True, 0.95, 0.1)
    assert opts.candidates == ["fp16 2:4-sparse max-autotune", "fp16 max-autotune"] and opts.allow_sparsity
    assert options_from_manifest({"precision": "fp16", "batch_profile": [8]}).tune is False
