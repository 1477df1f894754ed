"""--profile-steps (engine/worker/step_profile.py, step_timeline.py): the window flag, each step's
split of its device time into kernels and idle (lead, inner, tail) from a timeline, its families, the
summary by step kind, the collection timer and the CPU refusal. The profile of a real serving run is
tests/worker/test_step_profile_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest

from engine.cli import parser
from engine.config import EngineConfig, ModelConfig
from engine.model.forward_batch import SeqSpec
from engine.worker.model_runner import ModelRunner
from engine.worker.resolve import resolve_model
from engine.worker.step_profile import GcPauses
from engine.worker.step_timeline import (
    MARK,
    StepKind,
    StepTiming,
    Window,
    device_events,
    family,
    step_families,
    step_kind,
    step_timings,
    summarize,
)


def test_window_parses_start_and_count():
    assert Window.parse("100:200") == Window(100, 200)
    assert Window.parse("0:1") == Window(0, 1)


@pytest.mark.parametrize("bad", ["100", "a:b", "5:0", "-1:3", ":4", "3:"])
def test_a_bad_window_is_refused_by_name(bad: str, capsys):
    with pytest.raises(ValueError, match="--profile-steps"):
        Window.parse(bad)
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--profile-steps", bad])
    assert "--profile-steps" in capsys.readouterr().err


def test_the_flag_reaches_the_model_config():
    ns = parser().parse_args(["serve", "--profile-steps", "10:20", "--profile-dir", "/tmp/p"])
    assert (ns.profile_steps, ns.profile_dir) == ("10:20", "/tmp/p")


def test_step_timings_split_each_span_into_lead_busy_inner_and_tail():
    marks = [100.0, 200.0, 300.0, 350.0]
    events = [
        (50.0, 101.0, "k"),  # the step before the window: ignored
        (110.0, 150.0, "k"),  # step 0: lead 10
        (140.0, 160.0, "k"),  # overlaps the one before (a programmatic launch): union, no gap
        (170.0, 190.0, "k"),  # inner gap 10, tail 10
        (200.0, 290.0, "k"),  # step 1: no lead, tail 10
        (400.0, 410.0, "k"),  # after the last mark: ignored
    ]
    t = step_timings(marks, events)
    assert t[0] == StepTiming(span=100.0, busy=70.0, lead=10.0, inner=10.0, tail=10.0)
    assert t[1] == StepTiming(span=100.0, busy=90.0, lead=0.0, inner=0.0, tail=10.0)
    assert t[2] == StepTiming(span=50.0, busy=0.0, lead=50.0, inner=0.0, tail=0.0)  # no kernel: all idle
    for x in t:
        assert x.lead + x.busy + x.inner + x.tail == pytest.approx(x.span)


def test_a_kernel_running_past_the_next_mark_is_cut_there():
    (t,) = step_timings([0.0, 10.0], [(2.0, 15.0, "k")])
    assert (t.busy, t.lead, t.tail) == (8.0, 2.0, 0.0)


def test_device_events_take_kernels_copies_and_memsets_and_the_marks_apart():
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": f"{MARK}(int)", "ts": 10.0, "dur": 1.5},
            {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_tst_192x192", "ts": 12.0, "dur": 30.0},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 43.0, "dur": 2.0},
            {"ph": "X", "cat": "gpu_memset", "name": "Memset", "ts": 46.0, "dur": 1.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 5.0, "dur": 3.0},  # host: not device
            {"ph": "f", "cat": "ac2g", "name": "flow", "ts": 6.0},
            {"ph": "X", "cat": "kernel", "name": f"{MARK}(int)", "ts": 50.0, "dur": 1.0},
        ]
    }
    marks, events = device_events(trace)
    assert marks == [10.0, 50.0]
    gemm = (12.0, 42.0, "nvjet_sm90_tst_192x192")
    assert events == [gemm, (43.0, 45.0, "Memcpy HtoD"), (46.0, 47.0, "Memset")]
    (t,) = step_timings(marks, events)
    assert t.busy == 33.0 and t.lead == 2.0 and t.inner == 2.0 and t.tail == 3.0


def _seq(n: int, computed: int) -> SeqSpec:
    return SeqSpec(token_ids=[1] * n, num_computed=computed, block_ids=[1], state_slot=1)


def test_step_kinds_count_decodes_prompts_and_tokens():
    assert step_kind([_seq(1, 5), _seq(1, 9)], "decode graph") == StepKind("decode", "decode graph", 2, 0, 2)
    k = step_kind([_seq(1, 5), _seq(100, 0), _seq(30, 64)], "piecewise")
    assert (k.kind, k.decodes, k.prompts, k.tokens) == ("mixed", 1, 2, 131)
    assert k.label == "mixed (2+ prompts) / piecewise"
    assert step_kind([_seq(64, 0)], "whole-step graph").label == "prefill / whole-step graph"


def test_the_summary_groups_steps_by_label_and_adds_up():
    kinds = [
        StepKind("decode", "decode graph", 4, 0, 4),
        StepKind("mixed", "piecewise", 4, 2, 1000),
        StepKind("decode", "decode graph", 4, 0, 4),
    ]
    timings = [
        StepTiming(5000.0, 4500.0, 300.0, 100.0, 100.0),
        StepTiming(30000.0, 27000.0, 1000.0, 1500.0, 500.0),
        StepTiming(5000.0, 4700.0, 100.0, 100.0, 100.0),
    ]
    families = [
        {"gemm": 3000.0, "gdn": 1000.0},
        {"gemm": 20000.0, "attention": 5000.0},
        {"gemm": 3400.0, "gdn": 1000.0, "sampling/other": 20.0},
    ]
    s = summarize(kinds, timings, families)
    assert s["steps"] == 3
    assert s["span_ms"] == pytest.approx(40.0) and s["busy_ms"] == pytest.approx(36.2)
    assert s["busy_fraction"] == pytest.approx(36.2 / 40.0)
    assert s["idle_per_step_ms"]["max"] == pytest.approx(3.0)
    assert s["idle_per_step_ms"]["p50"] == pytest.approx(0.5)
    dec = s["by_kind"]["decode / decode graph"]
    # most steps first
    assert list(s["by_kind"]) == ["decode / decode graph", "mixed (2+ prompts) / piecewise"]
    assert dec["steps"] == 2 and dec["busy_ms"] == pytest.approx(4.6) and dec["idle_ms"] == pytest.approx(0.4)
    assert dec["lead_ms"] + dec["inner_ms"] + dec["tail_ms"] == pytest.approx(dec["idle_ms"])
    assert dec["families_ms"] == pytest.approx({"gemm": 3.2, "gdn": 1.0, "sampling/other": 0.01})  # per step
    assert list(s["families_ms"]) == ["gemm", "attention", "gdn", "sampling/other"]  # most first
    window = {"gemm": 26.4, "attention": 5.0, "gdn": 2.0, "sampling/other": 0.02}
    assert s["families_ms"] == pytest.approx(window)
    assert summarize([], [], []) == {"steps": 0}


def test_step_families_assign_each_event_to_the_step_it_starts_in():
    marks = [100.0, 200.0, 300.0]
    events = [
        (50.0, 110.0, "nvjet_before_the_window"),
        (110.0, 150.0, "nvjet_sm90_a"),
        (150.0, 205.0, "void paged_attn_kernel<256, 32, 4, 2>"),  # runs past the mark: still step 0's
        (210.0, 220.0, "void gdn_chunk_state_kernel<64>"),
        (230.0, 240.0, "Memcpy HtoD"),
        (300.0, 310.0, "nvjet_after_the_window"),
    ]
    assert step_families(marks, events) == [
        {"gemm": 40.0, "attention": 55.0},
        {"gdn": 10.0, "sampling/other": 10.0},
    ]
    assert step_families([100.0], events) == []


def test_families_match_the_kernels_of_a_step():
    assert family("void gdn_chunk_state_kernel<64, true, float>(...)") == "gdn"
    assert family("void add_rms_norm_kernel<1, 320, 1, true, true>") == "norm/elementwise"
    assert family("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT") == "gemm"


def test_the_profiler_is_off_by_default_and_refused_without_cuda():
    cpu = ModelConfig(device="cpu")
    assert ModelRunner(EngineConfig(model=resolve_model(cpu))).profiler is None
    with pytest.raises(ValueError, match="needs a CUDA device"):
        ModelRunner(EngineConfig(model=resolve_model(dataclasses.replace(cpu, profile_steps="1:5"))))


def test_gc_pauses_are_counted_by_generation_while_registered():
    import gc

    pauses = GcPauses().start()
    gc.collect(0)
    gc.collect(2)
    gc.collect(2)
    pauses.stop()
    gc.collect(1)  # after the window: not counted
    s = pauses.summary()
    assert s["gen0"]["count"] >= 1 and s["gen2"]["count"] >= 2 and "gen1" not in s
    assert 0 <= s["gen2"]["max_ms"] <= s["gen2"]["total_ms"]
    assert pauses not in gc.callbacks
