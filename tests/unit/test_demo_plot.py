"""The demos' plots draw the sampler/trainer mismatch of every GRPO step (issue 34 item 6)."""

from __future__ import annotations

import pytest

matplotlib = pytest.importorskip("matplotlib")


def _rl_records(steps: int) -> list[dict]:
    out = []
    for step in range(steps):
        measured = step != 1  # a step that measured nothing is left out, not drawn as 0
        out.append(
            {
                "phase": "rl",
                "step": step,
                "reward_mean": 0.1 * step,
                "mismatch_k3": 1e-6 * (step + 1) if measured else None,
                "mismatch_ratio_min": 0.9 if measured else None,
                "mismatch_ratio_max": 1.2 if measured else None,
            }
        )
    return out


def test_the_mismatch_panel_plots_k3_and_the_largest_log_ratio_of_measured_steps():
    import math

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from arctic_rl_demo.mismatch import draw_mismatch

    rl = _rl_records(4)
    fig, ax = plt.subplots()
    draw_mismatch(ax, [10 + r["step"] for r in rl], rl)
    (k3,) = ax.get_lines()
    assert list(k3.get_xdata()) == [10, 12, 13]
    assert list(k3.get_ydata()) == pytest.approx([1e-6, 3e-6, 4e-6])
    assert ax.get_yscale() == "log"
    (twin,) = [a for a in fig.axes if a is not ax]
    (gap,) = twin.get_lines()
    assert list(gap.get_ydata()) == pytest.approx([math.log(1.2)] * 3)
    plt.close(fig)


def test_both_demo_plots_have_a_mismatch_panel(tmp_path):
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from arctic_rl_demo.tasks.lookup import report as lookup_report
    from arctic_rl_demo.tasks.lookup.settings import LookupSettings
    from arctic_rl_demo.tasks.reverse import report
    from arctic_rl_demo.tasks.reverse.settings import DemoSettings

    drawn = []
    real = plt.Figure.savefig

    def keep(fig, path, **kwargs):
        drawn.append([a.get_ylabel() for a in fig.axes])
        return real(fig, path, **kwargs)

    rl = _rl_records(3)
    reverse_evals = [{"phase": "eval", "rl_step": s, "heldout_exact": 0.5} for s in (-1, 0, 3)]
    lookup_evals = [
        {"phase": "eval", "rl_step": s, "heldout_success": 0.5, "heldout_key_right": 0.6}
        for s in (-1, 0, 3)
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plt.Figure, "savefig", keep)
        report.plot(rl + reverse_evals, DemoSettings(output_dir=tmp_path), tmp_path / "a.png")
        lookup_report.plot(
            rl + lookup_evals, LookupSettings(output_dir=tmp_path), tmp_path / "b.png"
        )
    assert (tmp_path / "a.png").stat().st_size > 0 and (tmp_path / "b.png").stat().st_size > 0
    for labels in drawn:
        assert "k3 (nats)" in labels and "max |log ratio|" in labels


def test_the_summary_reports_the_mismatch_of_the_steps_that_measured_it():
    import math

    from arctic_rl_demo.mismatch import mismatch_rows, mismatch_summary

    rl = _rl_records(4)
    rl[3]["rollout_is_ess"] = 0.8
    rl[3]["mismatch_ratio_min"] = 0.5
    summary = mismatch_summary(rl)
    assert summary["mismatch_k3_mean"] == pytest.approx((1e-6 + 3e-6 + 4e-6) / 3)
    assert summary["mismatch_k3_max"] == pytest.approx(4e-6)
    assert summary["mismatch_max_abs_log_ratio"] == pytest.approx(abs(math.log(0.5)))
    assert summary["rollout_is_ess_min"] == 0.8
    assert len(mismatch_rows(summary)) == 3
    nothing = mismatch_summary([{"phase": "rl", "step": 0}])
    assert nothing["mismatch_k3_mean"] is None and mismatch_rows(nothing) == []
