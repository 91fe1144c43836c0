"""The summarize report's extra sections: upload-cap table (FedDST Tables 1-3) and upload ratios."""

from __future__ import annotations

from typing import Any

from fedcomm.stages.summarize import budget_and_target_sections, upload_section


def _run(caps: dict[str, float | None], kb: float, ratio: float | None) -> dict[str, Any]:
    return {
        "at_upload_cap": caps,
        "upload": {"kb_per_client_round": kb, "up_ratio_mean": ratio},
        "comm": {
            "cost_vs_dense_e2e": 0.6 / ratio if ratio else None,
            "up_cost_vs_dense_e2e": 0.2 / ratio if ratio else None,
        },
        "time": {"client_s_mean": 0.5},
    }


SUMMARIES = {
    "fedavg": [
        _run({"0.5": 0.40, "2": 0.60, "1": None}, 3130.0, 1.0),
        _run({"0.5": 0.50, "2": 0.70, "1": 0.55}, 3130.0, 1.0),
    ],
    "feddst": [
        _run({"0.5": 0.62, "2": 0.80, "1": 0.75}, 626.0, 5.0),
        _run({"0.5": 0.58, "2": 0.80, "1": 0.71}, 626.0, 4.0),
    ],
}


def _table(sections: list[str], title: str) -> list[str]:
    (block,) = [s for s in sections if s.startswith(f"## {title}")]
    return [line for line in block.splitlines() if line.startswith("|")]


def test_upload_cap_table_rows_are_runs_and_columns_sorted_caps() -> None:
    sections = budget_and_target_sections(SUMMARIES)
    rows = _table(sections, "Best global accuracy (%) within an upload cap")
    assert rows[0] == "| Run | ≤ 0.5 GiB | ≤ 1 GiB | ≤ 2 GiB |"
    assert rows[1] == "|---|---:|---:|---:|"
    # fedavg at 0.5: mean 45, sample sd 7.07 -> se 5; at 1 GiB only one seed had an evaluation
    assert rows[2] == "| `fedavg` | 45.00 ± 5.00 | 55.00 | 65.00 ± 5.00 |"
    assert rows[3] == "| `feddst` | 60.00 ± 2.00 | 73.00 ± 2.00 | 80.00 |"
    assert not any("within a communication budget" in s for s in sections)  # no budgets given


def test_upload_cap_table_left_out_without_caps() -> None:
    plain = {run: [{"upload": s["upload"]} for s in seeds] for run, seeds in SUMMARIES.items()}
    sections = budget_and_target_sections(plain)
    assert not any("upload cap" in s for s in sections)
    assert any(s.startswith("## Upload per client per round") for s in sections)


def test_upload_section_ratio_vs_dense_is_the_mean_over_seeds() -> None:
    from fedcomm.evaluation.seeds import aggregate_seeds

    rows = upload_section({run: aggregate_seeds(s) for run, s in SUMMARIES.items()}).splitlines()
    assert "Upload ratio vs dense (mean over rounds)" in rows[2]
    assert "All traffic vs dense end-to-end" in rows[2]
    # cost vs dense end-to-end: fedavg 0.6 both seeds; feddst mean of 0.12 and 0.15
    assert rows[4] == "| `fedavg` | 3130 | 1.00x | 1.00x | 60.00% | 20.00% | 0.5 |"
    assert rows[5] == "| `feddst` | 626 | 5.00x | 4.50x | 13.50% | 4.50% | 0.5 |"


def test_sections_name_the_metric_they_rank() -> None:
    sections = budget_and_target_sections(SUMMARIES, "top-3 accuracy")
    assert _table(sections, "Best top-3 accuracy (%) within an upload cap")[2].startswith(
        "| `fedavg` | 45.00"
    )


def test_topk_column_only_when_it_differs_from_top1() -> None:
    from fedcomm.reporting.summary import render_markdown, summary_table

    def final(top1: float, topk: float) -> dict[str, Any]:
        return {"final": {"global/accuracy": top1, "topk/accuracy": topk}}

    lm = summary_table({"fedavg": [final(0.10, 0.25)], "fedbiad": [final(0.12, 0.30)]})
    text = render_markdown(lm, title="t", plots=[], last_k=5)
    assert "Final top-k acc (%)" in text and "| 30.00 |" in text
    same = summary_table({"fedavg": [final(0.9, 0.9)]})  # train.topk = 1: a repeat, left out
    assert "top-k" not in render_markdown(same, title="t", plots=[], last_k=5)


def test_report_plots_follow_the_metric(tmp_path: Any) -> None:
    import polars as pl

    from fedcomm.reporting.summary import write_report

    rounds = pl.DataFrame(
        {
            "round": [1, 2],
            "global/accuracy": [0.1, 0.1],
            "topk/accuracy": [0.2, 0.3],
            "local/accuracy": [0.1, 0.2],
            "comm/cum_gib": [0.5, 1.0],
        }
    )
    summaries = {"fedavg": [{"final": {"global/accuracy": 0.1, "topk/accuracy": 0.3}}]}
    write_report(
        tmp_path, {"fedavg": [rounds]}, summaries, title="t", metric="topk/accuracy", last_k=5
    )
    text = (tmp_path / "summary.md").read_text()
    assert "### Top-k accuracy vs communication" in text and "### Top-k accuracy vs round" in text
    assert (tmp_path / "plots" / "accuracy_vs_round.png").stat().st_size > 0
